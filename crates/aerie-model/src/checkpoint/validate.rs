//! Checkpoint validation: keys, shapes and dtypes against the config (eagle3.md §1), the
//! d2t/t2d invariants (§4), and the aux-feature count against `fc`'s width (§2).
//!
//! Serving engines load broken drafters without complaint (SGLang skips unknown keys and leaves
//! missing weights random; vLLM maps a reduced vocab without `d2t` to ids 0..Vd-1), so every
//! check here runs on load and export, and reports ALL problems at once. The checks work on
//! dtypes and shapes alone ([`TensorMeta`]) so that `inspect` can run them from headers without
//! reading gigabytes of weights; only `d2t`/`t2d` values are needed for the vocab checks.

use std::collections::BTreeMap;

use serde::Serialize;

use super::keys;
use super::tensors::{Dtype, HostTensor, TensorMap};
use crate::DrafterConfig;

/// One problem found, with a stable code for linting and a message naming the tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Stable kebab-case code (`missing-key`, `shape-mismatch`, `d2t-invariant`, ...).
    pub code: &'static str,
    /// Human-readable message naming the tensor and what is wrong.
    pub message: String,
}

impl Problem {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

/// Dtype and shape of a tensor: all the layout checks need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
}

impl From<&HostTensor> for TensorMeta {
    fn from(t: &HostTensor) -> Self {
        Self { dtype: t.dtype, shape: t.shape.clone() }
    }
}

/// What kind of element a tensor must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ElemKind {
    /// F32, BF16 or F16.
    Float,
    /// I64 (d2t).
    I64,
    /// BOOL (t2d).
    Bool,
}

/// A tensor a drafter with a given config holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expected {
    /// Canonical name.
    pub name: String,
    /// Shape implied by the config.
    pub shape: Vec<usize>,
    /// The shape in symbols (`[nH*d, 2H]`), for messages.
    pub rule: &'static str,
    /// Element kind.
    pub kind: ElemKind,
    /// Whether a checkpoint must hold it (`embed_tokens` comes from the target; `d2t` only
    /// when the vocab is reduced; `t2d` can be derived from `d2t`).
    pub required: bool,
}

/// Every tensor a drafter with `cfg` holds, required or optional, in forward order.
pub fn expected_tensors(cfg: &DrafterConfig) -> Vec<Expected> {
    let (h, ht, a) = (cfg.hidden_size, cfg.target_hidden_size, cfg.num_aux());
    let (q, kv) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
    let i = cfg.intermediate_size;
    let (v, vd) = (cfg.vocab_size, cfg.draft_vocab_size);
    let f = |name: &str, shape: Vec<usize>, rule, required| Expected {
        name: name.to_string(),
        shape,
        rule,
        kind: ElemKind::Float,
        required,
    };
    let mut e = vec![f(keys::EMBED, vec![v, h], "[V, H]", false), f(keys::FC, vec![h, a * ht], "[H, A*Ht]", true)];
    if cfg.fc_norm {
        e.extend((0..a).map(|k| f(&keys::fc_norm(k), vec![ht], "[Ht]", true)));
    }
    let [inorm, hnorm, qp, kp, vp, op, pnorm, gate, up, down] = keys::MIDLAYER;
    e.extend([f(inorm, vec![h], "[H]", true), f(hnorm, vec![h], "[H]", true)]);
    match cfg.mla {
        None => e.extend([
            f(qp, vec![q, 2 * h], "[nH*d, 2H]", true),
            f(kp, vec![kv, 2 * h], "[nKV*d, 2H]", true),
            f(vp, vec![kv, 2 * h], "[nKV*d, 2H]", true),
            f(op, vec![h, q], "[H, nH*d]", true),
        ]),
        Some(m) => {
            let nh = cfg.num_attention_heads;
            let [qa, qa_norm, qb, kva, kva_norm, kvb, o] = keys::MLA_ATTENTION;
            e.extend([
                f(qa, vec![m.q_lora_rank, 2 * h], "[q_lora_rank, 2H]", true),
                f(qa_norm, vec![m.q_lora_rank], "[q_lora_rank]", true),
                f(qb, vec![nh * m.qk_head_dim(), m.q_lora_rank], "[nH*(qk_nope+qk_rope), q_lora_rank]", true),
                f(kva, vec![m.kv_lora_rank + m.qk_rope_head_dim, 2 * h], "[kv_lora_rank+qk_rope, 2H]", true),
                f(kva_norm, vec![m.kv_lora_rank], "[kv_lora_rank]", true),
                f(
                    kvb,
                    vec![nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank],
                    "[nH*(qk_nope+v), kv_lora_rank]",
                    true,
                ),
                f(o, vec![h, nh * m.v_head_dim], "[H, nH*v]", true),
            ]);
        }
    }
    e.extend([
        f(pnorm, vec![h], "[H]", true),
        f(gate, vec![i, h], "[I, H]", true),
        f(up, vec![i, h], "[I, H]", true),
        f(down, vec![h, i], "[H, I]", true),
        f(keys::NORM, vec![h], "[H]", true),
        f(keys::LM_HEAD, vec![vd, h], "[Vd, H]", true),
    ]);
    e.push(Expected { name: keys::D2T.into(), shape: vec![vd], rule: "[Vd]", kind: ElemKind::I64, required: vd < v });
    e.push(Expected { name: keys::T2D.into(), shape: vec![v], rule: "[V]", kind: ElemKind::Bool, required: false });
    e
}

/// Check names, dtypes and shapes of `metas` (canonical names) against `cfg`.
///
/// `target_hidden_explicit` says whether the config gave `target_hidden_size`; when it did not
/// and `fc` is wider than A*H, the problem is reported as a hidden-size mismatch. When the aux
/// ids are unknown (empty list) the `fc` width and `fc_norm` count are not checked.
pub fn check_layout(
    cfg: &DrafterConfig,
    metas: &BTreeMap<String, TensorMeta>,
    target_hidden_explicit: bool,
) -> Vec<Problem> {
    let mut p = Vec::new();
    let aux_known = !cfg.aux_layers.ids.is_empty();
    let expected = expected_tensors(cfg);
    for e in &expected {
        let Some(m) = metas.get(&e.name) else {
            if e.required && e.name == keys::D2T {
                p.push(Problem::new(
                    "reduced-vocab-without-d2t",
                    format!(
                        "draft_vocab_size {} < vocab_size {} but there is no `d2t`: engines would \
                         map draft ids to target ids 0..{} and acceptance collapses",
                        cfg.draft_vocab_size,
                        cfg.vocab_size,
                        cfg.draft_vocab_size.saturating_sub(1)
                    ),
                ));
            } else if e.required && (aux_known || !e.name.starts_with("fc_norm.")) {
                p.push(Problem::new(
                    "missing-key",
                    format!("missing tensor `{}` (expected shape {:?} = {})", e.name, e.shape, e.rule),
                ));
            }
            continue;
        };
        let kind_ok = match e.kind {
            ElemKind::Float => m.dtype.is_float(),
            ElemKind::I64 => m.dtype == Dtype::I64,
            ElemKind::Bool => m.dtype == Dtype::Bool,
        };
        if !kind_ok {
            let want = match e.kind {
                ElemKind::Float => "a float type (F32, BF16, F16)",
                ElemKind::I64 => "I64",
                ElemKind::Bool => "BOOL",
            };
            p.push(Problem::new("dtype", format!("`{}` has dtype {}, expected {want}", e.name, m.dtype)));
        }
        if e.name == keys::FC {
            p.extend(check_fc(cfg, &m.shape, target_hidden_explicit));
        } else if m.shape != e.shape {
            p.push(Problem::new(
                "shape-mismatch",
                format!("`{}` has shape {:?}, expected {:?} = {}", e.name, m.shape, e.shape, e.rule),
            ));
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|e| e.name.as_str()).collect();
    for name in metas.keys() {
        let fc_norm_unknown_aux = !aux_known && cfg.fc_norm && name.starts_with("fc_norm.");
        if !known.contains(name.as_str()) && !fc_norm_unknown_aux {
            p.push(Problem::new(
                "unexpected-key",
                format!("unexpected tensor `{name}`: not part of an EAGLE-3 drafter (SGLang would silently skip it)"),
            ));
        }
    }
    p
}

/// The `fc` checks: out-features H, in-features A*Ht.
fn check_fc(cfg: &DrafterConfig, shape: &[usize], target_hidden_explicit: bool) -> Vec<Problem> {
    let (h, ht, a) = (cfg.hidden_size, cfg.target_hidden_size, cfg.num_aux());
    let mut p = Vec::new();
    if shape.len() != 2 {
        return vec![Problem::new("shape-mismatch", format!("`fc.weight` has shape {shape:?}, expected [H, A*Ht]"))];
    }
    if shape[0] != h {
        p.push(Problem::new(
            "shape-mismatch",
            format!("`fc.weight` has {} out-features, expected hidden_size {h}", shape[0]),
        ));
    }
    let fin = shape[1];
    if a == 0 || fin == a * ht {
        return p;
    }
    if !target_hidden_explicit && fin.is_multiple_of(a) {
        p.push(Problem::new(
            "hidden-mismatch",
            format!(
                "`fc.weight` takes {fin} in-features = {a} aux features x {}, but the config has no \
                 target_hidden_size and hidden_size is {h}: set target_hidden_size to {}",
                fin / a,
                fin / a
            ),
        ));
    } else {
        let implied = if fin.is_multiple_of(ht) {
            format!("{} aux features", fin / ht)
        } else {
            "no whole number of aux features".to_string()
        };
        p.push(Problem::new(
            "aux-count-mismatch",
            format!(
                "`fc.weight` takes {fin} in-features ({implied} of target_hidden_size {ht}), but the \
                 config lists {a} aux layer ids {:?} (expected {} in-features)",
                cfg.aux_layers.ids,
                a * ht
            ),
        ));
    }
    p
}

/// Check the d2t/t2d invariants of eagle3.md §4 for target vocab `v` and draft vocab `vd`:
/// `0 <= i + d2t[i] < V`, mapped ids strictly ascending, `t2d.sum() == Vd`,
/// `nonzero(t2d) == d2t + arange(Vd)`. Length problems are left to [`check_layout`].
pub fn check_vocab_map(v: usize, vd: usize, d2t: Option<&[i64]>, t2d: Option<&[bool]>) -> Vec<Problem> {
    let mut p = Vec::new();
    let bad = |m: String| Problem::new("d2t-invariant", m);
    let mapped: Option<Vec<i64>> = d2t.map(|d| d.iter().enumerate().map(|(i, &o)| i as i64 + o).collect());
    if let Some(mapped) = mapped.as_ref().filter(|m| m.len() == vd) {
        let out: Vec<usize> = (0..vd).filter(|&i| mapped[i] < 0 || mapped[i] >= v as i64).collect();
        if let Some(&i) = out.first() {
            p.push(bad(format!(
                "`d2t` maps {} draft id(s) outside the target vocab 0..{v}, first: draft id {i} -> {}",
                out.len(),
                mapped[i]
            )));
        }
        if let Some(i) = (1..vd).find(|&i| mapped[i] <= mapped[i - 1]) {
            p.push(bad(format!(
                "`d2t` target ids are not strictly ascending: draft id {} -> {}, draft id {i} -> {}",
                i - 1,
                mapped[i - 1],
                mapped[i]
            )));
        }
    }
    if let Some(t2d) = t2d.filter(|t| t.len() == v) {
        let on: Vec<i64> = (0..v).filter(|&i| t2d[i]).map(|i| i as i64).collect();
        if on.len() != vd {
            p.push(bad(format!("`t2d` marks {} target ids, expected draft_vocab_size {vd}", on.len())));
        }
        if let Some(mapped) = &mapped
            && mapped.len() == vd
            && on.len() == vd
            && let Some(i) = (0..vd).find(|&i| on[i] != mapped[i])
        {
            p.push(bad(format!(
                "`t2d` and `d2t` disagree: draft id {i} maps to target id {} but the {i}-th id \
                     marked in t2d is {}",
                mapped[i], on[i]
            )));
        }
    }
    p
}

/// The t2d mask implied by `d2t` for a target vocab of `v` (ids outside `0..v` are skipped;
/// [`check_vocab_map`] reports them).
pub fn derive_t2d(d2t: &[i64], v: usize) -> Vec<bool> {
    let mut t2d = vec![false; v];
    for (i, &o) in d2t.iter().enumerate() {
        let id = i as i64 + o;
        if (0..v as i64).contains(&id) {
            t2d[id as usize] = true;
        }
    }
    t2d
}

/// Summary of a d2t mapping, for reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct D2tStats {
    /// Smallest offset.
    pub min_offset: i64,
    /// Largest offset.
    pub max_offset: i64,
    /// Target id of draft id 0.
    pub first_target_id: i64,
    /// Target id of the last draft id.
    pub last_target_id: i64,
    /// Whether every offset is 0 (draft id = target id).
    pub identity: bool,
}

/// Statistics of `d2t`; `None` when it is empty.
pub fn d2t_stats(d2t: &[i64]) -> Option<D2tStats> {
    let n = d2t.len();
    Some(D2tStats {
        min_offset: *d2t.iter().min()?,
        max_offset: *d2t.iter().max()?,
        first_target_id: d2t[0],
        last_target_id: (n - 1) as i64 + d2t[n - 1],
        identity: d2t.iter().all(|&o| o == 0),
    })
}

/// Every problem of a loaded drafter: config relations, layout, and the vocab map.
pub fn validate(cfg: &DrafterConfig, tensors: &TensorMap, target_hidden_explicit: bool) -> Vec<Problem> {
    let mut p: Vec<Problem> =
        cfg.problems().into_iter().map(|m| Problem::new("config", format!("config.json: {m}"))).collect();
    if !p.is_empty() {
        // The layout's expected shapes and the vocab map are sized by the config: a config past
        // its limits is reported alone, before anything is computed or allocated by it.
        p.extend(tensors.iter().filter_map(|(name, t)| check_finite(name, t)));
        return p;
    }
    let metas: BTreeMap<String, TensorMeta> = tensors.iter().map(|(k, t)| (k.clone(), t.into())).collect();
    p.extend(check_layout(cfg, &metas, target_hidden_explicit));
    let d2t = tensors.get(keys::D2T).filter(|t| t.dtype == Dtype::I64).and_then(|t| t.to_i64(keys::D2T).ok());
    let t2d: Option<Vec<bool>> =
        tensors.get(keys::T2D).filter(|t| t.dtype == Dtype::Bool).map(|t| t.data.iter().map(|&b| b != 0).collect());
    p.extend(check_vocab_map(cfg.vocab_size, cfg.draft_vocab_size, d2t.as_deref(), t2d.as_deref()));
    p.extend(tensors.iter().filter_map(|(name, t)| check_finite(name, t)));
    p
}

/// The problem of tensor `name` when it holds a NaN or an infinity: the one value check of every
/// weight aerie reads (drafter loaders, `inspect`, the target's head, embedding and layers),
/// naming the tensor and the first bad element.
pub fn check_finite(name: &str, t: &HostTensor) -> Option<Problem> {
    first_non_finite(t).map(|(i, v)| {
        Problem::new(
            "non-finite",
            format!("`{name}`: element {i} is {v}; a model with a NaN or infinite weight computes garbage and scores nothing"),
        )
    })
}

/// The first NaN or infinity of a float tensor (its flat index and value), found on the stored
/// bits (an all-ones exponent) without converting the tensor: one cheap pass at load time, so
/// no command evaluates, serves or exports a drafter whose numbers are not numbers.
pub fn first_non_finite(t: &HostTensor) -> Option<(usize, f32)> {
    let d = &t.data;
    match t.dtype {
        Dtype::F32 => d
            .chunks_exact(4)
            .position(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000 == 0x7f80_0000)
            .map(|i| (i, f32::from_le_bytes(d[4 * i..4 * i + 4].try_into().expect("4 bytes")))),
        Dtype::F16 => d
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00)
            .map(|i| (i, half::f16::from_le_bytes([d[2 * i], d[2 * i + 1]]).to_f32())),
        Dtype::BF16 => d
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80)
            .map(|i| (i, half::bf16::from_le_bytes([d[2 * i], d[2 * i + 1]]).to_f32())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_weights_are_found_in_every_float_dtype() {
        for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let t = HostTensor::from_f32(vec![4], &[0.5, -2.0, bad, 1.0], dtype);
                let (i, v) = first_non_finite(&t).unwrap();
                assert_eq!(i, 2, "{dtype}");
                assert!(v.is_nan() == bad.is_nan() && (v.is_nan() || v == bad), "{dtype}: {v}");
            }
            let big = HostTensor::from_f32(vec![3], &[65000.0, -1e-6, 0.0], dtype);
            assert_eq!(first_non_finite(&big), None, "{dtype}");
        }
    }

    #[test]
    fn vocab_map_invariants() {
        // V = 8, Vd = 3, ids [1, 4, 6]: d2t = [1, 3, 4].
        let d2t = [1, 3, 4];
        let t2d = derive_t2d(&d2t, 8);
        assert_eq!(t2d.iter().filter(|&&b| b).count(), 3);
        assert!(check_vocab_map(8, 3, Some(&d2t), Some(&t2d)).is_empty());
        let s = d2t_stats(&d2t).unwrap();
        assert_eq!((s.first_target_id, s.last_target_id, s.identity), (1, 6, false));

        let p = check_vocab_map(8, 3, Some(&[1, 3, 6]), None); // 2 + 6 = 8: out of range
        assert!(p[0].message.contains("outside the target vocab"), "{p:?}");
        let p = check_vocab_map(8, 3, Some(&[1, -1, 4]), None); // 1 -> 0 after 0 -> 1
        assert!(p[0].message.contains("strictly ascending"), "{p:?}");
        let mut wrong = t2d.clone();
        wrong.swap(6, 7);
        let p = check_vocab_map(8, 3, Some(&d2t), Some(&wrong));
        assert!(p[0].message.contains("disagree"), "{p:?}");
        wrong[0] = true;
        let p = check_vocab_map(8, 3, Some(&d2t), Some(&wrong));
        assert!(p[0].message.contains("marks 4 target ids"), "{p:?}");
    }
}
