//! The drafter's weights in f64 (shapes checked against the config) and the pieces of its one
//! decoder layer: fc, the projections, attention, the MLP and the head.

#![allow(dead_code)]
#![allow(clippy::needless_range_loop)]

use aerie_model::DrafterConfig;
use aerie_model::checkpoint::{HostTensor, TensorMap};

use super::*;

// ------------------------------------------------------------------------------------------------
// Weights
// ------------------------------------------------------------------------------------------------

pub(super) fn tensor<'a>(w: &'a TensorMap, key: &str) -> &'a HostTensor {
    w.get(key).unwrap_or_else(|| panic!("reference: missing tensor `{key}`"))
}

pub(super) fn load_mat(w: &TensorMap, key: &str, rows: usize, cols: usize) -> Mat {
    let t = tensor(w, key);
    assert_eq!(t.shape, vec![rows, cols], "reference: `{key}` has shape {:?}, expected [{rows}, {cols}]", t.shape);
    let v = t.to_f32(key).unwrap_or_else(|e| panic!("reference: {e}"));
    let mut m = vec![vec![0.0; cols]; rows];
    for r in 0..rows {
        for c in 0..cols {
            m[r][c] = v[r * cols + c] as f64;
        }
    }
    m
}

pub(super) fn load_vec(w: &TensorMap, key: &str, n: usize) -> Vec<f64> {
    let t = tensor(w, key);
    assert_eq!(t.shape, vec![n], "reference: `{key}` has shape {:?}, expected [{n}]", t.shape);
    t.to_f32(key).unwrap_or_else(|e| panic!("reference: {e}")).iter().map(|&x| x as f64).collect()
}

pub(super) fn load_ints(w: &TensorMap, key: &str, n: usize) -> Vec<i64> {
    let t = tensor(w, key);
    assert_eq!(t.shape, vec![n], "reference: `{key}` has shape {:?}, expected [{n}]", t.shape);
    t.to_i64(key).unwrap_or_else(|e| panic!("reference: {e}"))
}

/// The drafter's weights in f64, shapes checked against the config (eagle3.md §1 table).
#[derive(Debug, Clone)]
pub struct RefWeights {
    /// `embed_tokens.weight` [V][H].
    pub embed: Mat,
    /// `fc.weight` [H][A*Ht].
    pub fc: Mat,
    /// `fc_norm.{i}.weight` [Ht] for i in 0..A (empty unless `cfg.fc_norm`).
    pub fc_norm: Vec<Vec<f64>>,
    /// `midlayer.input_layernorm.weight` [H].
    pub input_ln: Vec<f64>,
    /// `midlayer.hidden_norm.weight` [H].
    pub hidden_norm: Vec<f64>,
    /// `midlayer.self_attn.q_proj.weight` [nH*d][2H].
    pub q: Mat,
    /// `midlayer.self_attn.k_proj.weight` [nKV*d][2H].
    pub k: Mat,
    /// `midlayer.self_attn.v_proj.weight` [nKV*d][2H].
    pub v: Mat,
    /// `midlayer.self_attn.o_proj.weight` [H][nH*d].
    pub o: Mat,
    /// `midlayer.post_attention_layernorm.weight` [H].
    pub post_ln: Vec<f64>,
    /// `midlayer.mlp.gate_proj.weight` [I][H].
    pub gate: Mat,
    /// `midlayer.mlp.up_proj.weight` [I][H].
    pub up: Mat,
    /// `midlayer.mlp.down_proj.weight` [H][I].
    pub down: Mat,
    /// `norm.weight` [H].
    pub norm: Vec<f64>,
    /// `lm_head.weight` [Vd][H].
    pub lm_head: Mat,
    /// `d2t` [Vd]: offsets, `target_id = draft_id + d2t[draft_id]`.
    pub d2t: Vec<i64>,
    /// `t2d` [V].
    pub t2d: Vec<bool>,
}

impl RefWeights {
    /// Read and shape-check every tensor the forward uses.
    pub fn load(cfg: &DrafterConfig, w: &TensorMap) -> Self {
        let h = cfg.hidden_size;
        let ht = cfg.target_hidden_size;
        let a = cfg.num_aux();
        let d = cfg.head_dim;
        let nh = cfg.num_attention_heads;
        let nkv = cfg.num_key_value_heads;
        let i = cfg.intermediate_size;
        let v = cfg.vocab_size;
        let vd = cfg.draft_vocab_size;
        let fc_norm = if cfg.fc_norm {
            (0..a).map(|j| load_vec(w, &format!("fc_norm.{j}.weight"), ht)).collect()
        } else {
            Vec::new()
        };
        Self {
            embed: load_mat(w, "embed_tokens.weight", v, h),
            fc: load_mat(w, "fc.weight", h, a * ht),
            fc_norm,
            input_ln: load_vec(w, "midlayer.input_layernorm.weight", h),
            hidden_norm: load_vec(w, "midlayer.hidden_norm.weight", h),
            q: load_mat(w, "midlayer.self_attn.q_proj.weight", nh * d, 2 * h),
            k: load_mat(w, "midlayer.self_attn.k_proj.weight", nkv * d, 2 * h),
            v: load_mat(w, "midlayer.self_attn.v_proj.weight", nkv * d, 2 * h),
            o: load_mat(w, "midlayer.self_attn.o_proj.weight", h, nh * d),
            post_ln: load_vec(w, "midlayer.post_attention_layernorm.weight", h),
            gate: load_mat(w, "midlayer.mlp.gate_proj.weight", i, h),
            up: load_mat(w, "midlayer.mlp.up_proj.weight", i, h),
            down: load_mat(w, "midlayer.mlp.down_proj.weight", h, i),
            norm: load_vec(w, "norm.weight", h),
            lm_head: load_mat(w, "lm_head.weight", vd, h),
            d2t: load_ints(w, "d2t", vd),
            t2d: load_ints(w, "t2d", v).iter().map(|&b| b != 0).collect(),
        }
    }

    /// Target id of draft id `j`: `j + d2t[j]` (eagle3.md §1, §4).
    pub fn target_id(&self, j: usize) -> usize {
        let t = j as i64 + self.d2t[j];
        assert!(t >= 0 && (t as usize) < self.t2d.len(), "d2t[{j}] = {} maps outside the target vocab", self.d2t[j]);
        t as usize
    }
}

// ------------------------------------------------------------------------------------------------
// Pieces of the layer
// ------------------------------------------------------------------------------------------------

/// `fc(f)` for one position (eagle3.md §1, §3 `h = fc(f)`); with `cfg.fc_norm` (EAGLE-3.1) each
/// of the A chunks of width Ht is first RMS-normalised with `fc_norm.{i}.weight`, eps =
/// `rms_norm_eps` (CHOICE: the config has one eps; the same one is used here).
pub fn ref_fc(cfg: &DrafterConfig, w: &RefWeights, f: &[f64]) -> Vec<f64> {
    let ht = cfg.target_hidden_size;
    let a = cfg.num_aux();
    assert_eq!(f.len(), a * ht, "aux feature width {} != A*Ht = {}", f.len(), a * ht);
    let input: Vec<f64> = if cfg.fc_norm {
        let mut x = Vec::with_capacity(a * ht);
        for c in 0..a {
            x.extend(ref_rmsnorm(&f[c * ht..(c + 1) * ht], &w.fc_norm[c], cfg.rms_norm_eps));
        }
        x
    } else {
        f.to_vec()
    };
    ref_matvec(&w.fc, &input)
}

/// The projections of one layer input row, before attention: returns
/// `(residual, q heads [nH][d], k heads [nKV][d], v heads [nKV][d])`, q and k RoPE'd at `pos`.
/// `x = cat(input_layernorm(emb), hidden_norm(h))`, embedding FIRST (eagle3.md §1);
/// residual is `h`, or `hidden_norm(h)` when `norm_before_residual` (vLLM).
pub(super) fn project_row(
    cfg: &DrafterConfig,
    w: &RefWeights,
    emb: &[f64],
    h: &[f64],
    pos: f64,
    inv_freq: &[f64],
    scaling: f64,
) -> (Vec<f64>, Mat, Mat, Mat) {
    let d = cfg.head_dim;
    let e = ref_rmsnorm(emb, &w.input_ln, cfg.rms_norm_eps);
    let hn = ref_rmsnorm(h, &w.hidden_norm, cfg.rms_norm_eps);
    let mut x = e.clone();
    x.extend_from_slice(&hn);
    let residual = if cfg.norm_before_residual { hn.clone() } else { h.to_vec() };
    let q = ref_matvec(&w.q, &x);
    let k = ref_matvec(&w.k, &x);
    let v = ref_matvec(&w.v, &x);
    let mut qh = Vec::new();
    for j in 0..cfg.num_attention_heads {
        qh.push(ref_rope(&q[j * d..(j + 1) * d], pos, inv_freq, scaling));
    }
    let mut kh = Vec::new();
    let mut vh = Vec::new();
    for g in 0..cfg.num_key_value_heads {
        kh.push(ref_rope(&k[g * d..(g + 1) * d], pos, inv_freq, scaling));
        vh.push(v[g * d..(g + 1) * d].to_vec());
    }
    (residual, qh, kh, vh)
}

/// Attention for one query row against an explicit list of (key heads, value heads) entries:
/// query head j uses kv head `j / (nH / nKV)` (HF `repeat_kv` = repeat_interleave), scores
/// `q·k / sqrt(d)`, softmax over all listed keys. Returns the concatenated heads [nH*d].
pub(super) fn attend(cfg: &DrafterConfig, q: &Mat, keys: &[&Mat], values: &[&Mat]) -> Vec<f64> {
    let d = cfg.head_dim;
    let groups = cfg.num_attention_heads / cfg.num_key_value_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; cfg.num_attention_heads * d];
    for j in 0..cfg.num_attention_heads {
        let g = j / groups;
        let mut scores = vec![0.0; keys.len()];
        for (n, kh) in keys.iter().enumerate() {
            let mut s = 0.0;
            for c in 0..d {
                s += q[j][c] * kh[g][c];
            }
            scores[n] = s * scale;
        }
        let p = ref_softmax(&scores);
        for (n, vh) in values.iter().enumerate() {
            for c in 0..d {
                out[j * d + c] += p[n] * vh[g][c];
            }
        }
    }
    out
}

/// After attention: `h = residual + o_proj(attn)`, `h = h + down(silu(gate(n)) * up(n))` with
/// `n = post_attention_layernorm(h)` (eagle3.md §1).
pub(super) fn finish_row(cfg: &DrafterConfig, w: &RefWeights, residual: &[f64], attn: &[f64]) -> Vec<f64> {
    let o = ref_matvec(&w.o, attn);
    let mut h1 = vec![0.0; residual.len()];
    for i in 0..h1.len() {
        h1[i] = residual[i] + o[i];
    }
    let n = ref_rmsnorm(&h1, &w.post_ln, cfg.rms_norm_eps);
    let g = ref_matvec(&w.gate, &n);
    let u = ref_matvec(&w.up, &n);
    let mut act = vec![0.0; g.len()];
    for i in 0..g.len() {
        act[i] = ref_silu(g[i]) * u[i];
    }
    let dn = ref_matvec(&w.down, &act);
    let mut h2 = vec![0.0; h1.len()];
    for i in 0..h2.len() {
        h2[i] = h1[i] + dn[i];
    }
    h2
}

/// Drafter logits over the draft vocab: `lm_head(norm(h))`.
pub fn ref_head(cfg: &DrafterConfig, w: &RefWeights, h: &[f64]) -> Vec<f64> {
    ref_matvec(&w.lm_head, &ref_rmsnorm(h, &w.norm, cfg.rms_norm_eps))
}

/// "Serving view" of the layer: a plain causal single-layer forward over explicit rows
/// (embedding row, incoming hidden row) at explicit positions; row n attends to rows 0..=n.
/// Returns the layer output h (pre final norm) per row. Used by the self-check to verify that
/// TTT step k at position t equals the last row of the chain
/// `[(emb(ids[s]), fc(f_s)) at s = 0..t] ++ [(emb(ids[t+j]), h_{j-1}[t]) at t+j, j = 1..k]`.
pub fn ref_causal_layer(
    cfg: &DrafterConfig,
    w: &RefWeights,
    emb: &[Vec<f64>],
    hidden: &[Vec<f64>],
    positions: &[f64],
) -> Mat {
    let (inv_freq, scaling) = ref_rope_inv_freq(cfg);
    let n = emb.len();
    let mut rows = Vec::new();
    for r in 0..n {
        rows.push(project_row(cfg, w, &emb[r], &hidden[r], positions[r], &inv_freq, scaling));
    }
    let mut out = Vec::new();
    for r in 0..n {
        let keys: Vec<&Mat> = (0..=r).map(|s| &rows[s].2).collect();
        let values: Vec<&Mat> = (0..=r).map(|s| &rows[s].3).collect();
        let attn = attend(cfg, &rows[r].1, &keys, &values);
        out.push(finish_row(cfg, w, &rows[r].0, &attn));
    }
    out
}
