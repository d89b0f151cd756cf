//! An independent, deliberately unoptimised f64 reference of the EAGLE-3 drafter forward and of
//! its training-time-test (TTT) metrics, written from `shared/reference/eagle3.md` (§1 the layer,
//! §3 the objective) with plain nested loops over `Vec<f64>`: no burn, no BLAS, no batching, no
//! masks-as-tensors. It is the ground truth the optimised burn implementation is tested against.
//!
//! Integration tests include it with `mod reference;`. Everything is computed in f64 from the f32
//! (or bf16/f16) values stored in the [`TensorMap`], so differences against an f32 implementation
//! are that implementation's rounding only.
//!
//! Conventions (eagle3.md §1): linear weights are `[out, in]` and `y[o] = Σ_i W[o][i] x[i]`; no
//! biases; RMSNorm is `w * x / sqrt(mean(x^2) + eps)`; RoPE uses the `rotate_half` convention.
//!
//! Choices where the spec leaves room are marked `CHOICE:` in the comments.
#![allow(dead_code)]
// Index loops are the point of this module: every sum is written out as in the formulas.
#![allow(clippy::needless_range_loop)]

use aerie_model::checkpoint::{Dtype, HostTensor, TensorMap};
use aerie_model::{AuxConvention, AuxLayers, DrafterConfig, RopeConfig, RopeScaling};

/// A row-major matrix: `m[row][col]`.
pub type Mat = Vec<Vec<f64>>;

// ------------------------------------------------------------------------------------------------
// Elementary operations
// ------------------------------------------------------------------------------------------------

/// `y = W x` for `W: [out][in]` (eagle3.md §1: weights are stored `[out, in]`, no bias).
pub fn ref_matvec(w: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; w.len()];
    for o in 0..w.len() {
        assert_eq!(w[o].len(), x.len(), "matvec: row {o} has {} columns, input has {}", w[o].len(), x.len());
        let mut acc = 0.0;
        for i in 0..x.len() {
            acc += w[o][i] * x[i];
        }
        y[o] = acc;
    }
    y
}

/// RMSNorm (eagle3.md §1): `out[i] = w[i] * x[i] / sqrt(mean_j(x[j]^2) + eps)`.
pub fn ref_rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    assert_eq!(x.len(), w.len(), "rmsnorm: input width {} != weight width {}", x.len(), w.len());
    let mut ss = 0.0;
    for &v in x {
        ss += v * v;
    }
    let inv = 1.0 / (ss / x.len() as f64 + eps).sqrt();
    let mut out = vec![0.0; x.len()];
    for i in 0..x.len() {
        out[i] = w[i] * (x[i] * inv);
    }
    out
}

/// `silu(x) = x * sigmoid(x)`.
pub fn ref_silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `log Σ exp(x)`, max-shifted.
pub fn ref_logsumexp(x: &[f64]) -> f64 {
    let mut mx = f64::NEG_INFINITY;
    for &v in x {
        if v > mx {
            mx = v;
        }
    }
    let mut s = 0.0;
    for &v in x {
        s += (v - mx).exp();
    }
    mx + s.ln()
}

/// Softmax, max-shifted.
pub fn ref_softmax(x: &[f64]) -> Vec<f64> {
    let mut mx = f64::NEG_INFINITY;
    for &v in x {
        if v > mx {
            mx = v;
        }
    }
    let mut e = vec![0.0; x.len()];
    let mut s = 0.0;
    for i in 0..x.len() {
        e[i] = (x[i] - mx).exp();
        s += e[i];
    }
    for v in e.iter_mut() {
        *v /= s;
    }
    e
}

/// `x - logsumexp(x)`.
pub fn ref_log_softmax(x: &[f64]) -> Vec<f64> {
    let lse = ref_logsumexp(x);
    x.iter().map(|&v| v - lse).collect()
}

/// Index of the maximum; ties go to the FIRST index (torch.argmax's documented behaviour on CPU).
pub fn ref_argmax(x: &[f64]) -> usize {
    let mut best = 0;
    for i in 1..x.len() {
        if x[i] > x[best] {
            best = i;
        }
    }
    best
}

// ------------------------------------------------------------------------------------------------
// RoPE
// ------------------------------------------------------------------------------------------------

/// RoPE inverse frequencies (length d/2) and the attention scaling that multiplies cos and sin,
/// following HF transformers `modeling_rope_utils.py` (`ROPE_INIT_FUNCTIONS`), with
/// `partial_rotary_factor = 1` so `dim = head_dim`. All in f64 (HF computes them in f32).
///
/// * default: `inv_freq[i] = 1 / theta^(2i/d)`, scaling 1.
/// * linear: `inv_freq[i] = default[i] / factor` (HF: "applying scaling to the inverse frequencies
///   is equivalent" to dividing positions by factor), scaling 1.
/// * llama3 (`_compute_llama3_parameters`): with `wavelen = 2π / inv_freq`,
///   `low_wl = orig / low_freq_factor`, `high_wl = orig / high_freq_factor`:
///   - `wavelen < high_wl`: unchanged;
///   - `wavelen > low_wl`: `inv_freq / factor`;
///   - otherwise: `s = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)`,
///     `(1 - s) * inv_freq / factor + s * inv_freq`.
///
///   Scaling 1.
/// * yarn (`_compute_yarn_parameters`, transformers 5 form; `factor` is always given here so the
///   `max_position_embeddings / original` fallback for a missing factor never applies):
///   - `get_mscale(s, m) = 1 if s <= 1 else 0.1 * m * ln(s) + 1`;
///   - attention_factor = the given one; else if mscale AND mscale_all_dim are both given and
///     non-zero (Python truthiness, `if mscale and mscale_all_dim`):
///     `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)`; else `get_mscale(factor)`
///     `= 0.1 ln(factor) + 1` (for factor > 1);
///   - `beta_fast`/`beta_slow` default 32/1 (HF `get(..) or 32`: a 0 also means the default);
///   - `corr_dim(r) = d * ln(orig / (r * 2π)) / (2 ln theta)`; `low = max(floor(corr_dim(beta_fast)), 0)`,
///     `high = min(ceil(corr_dim(beta_slow)), d - 1)` (truncate = true, HF default; the config
///     carries no `truncate`);
///   - `ramp[i] = clamp((i - low) / (high - low), 0, 1)` for i in 0..d/2 (`high += 0.001` if equal);
///   - `extrap_factor = 1 - ramp`; `inv_freq = (default / factor) * (1 - extrap_factor) + default * extrap_factor`.
pub fn ref_rope_inv_freq(cfg: &DrafterConfig) -> (Vec<f64>, f64) {
    let d = cfg.head_dim;
    assert!(d.is_multiple_of(2), "head_dim must be even");
    let base = cfg.rope.theta;
    let half = d / 2;
    let mut default = vec![0.0; half];
    for i in 0..half {
        default[i] = 1.0 / base.powf((2 * i) as f64 / d as f64);
    }
    match &cfg.rope.scaling {
        RopeScaling::Default => (default, 1.0),
        RopeScaling::Linear { factor } => (default.iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let old = *original_max_position_embeddings as f64;
            let low_wl = old / low_freq_factor;
            let high_wl = old / high_freq_factor;
            let mut out = vec![0.0; half];
            for i in 0..half {
                let f = default[i];
                let wavelen = 2.0 * std::f64::consts::PI / f;
                out[i] = if wavelen < high_wl {
                    f
                } else if wavelen > low_wl {
                    f / factor
                } else {
                    let s = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - s) * f / factor + s * f
                };
            }
            (out, 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            mscale,
            mscale_all_dim,
        } => {
            let factor = *factor;
            let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let attn = match attention_factor {
                Some(a) => *a,
                None => match (mscale, mscale_all_dim) {
                    (Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => get_mscale(factor, *m) / get_mscale(factor, *ma),
                    _ => get_mscale(factor, 1.0),
                },
            };
            let beta_fast = if *beta_fast == 0.0 { 32.0 } else { *beta_fast };
            let beta_slow = if *beta_slow == 0.0 { 1.0 } else { *beta_slow };
            let orig = *original_max_position_embeddings as f64;
            let dim = d as f64;
            let corr_dim = |rot: f64| dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
            let low = corr_dim(beta_fast).floor().max(0.0);
            let mut high = corr_dim(beta_slow).ceil().min(dim - 1.0);
            if low == high {
                high += 0.001;
            }
            let mut out = vec![0.0; half];
            for i in 0..half {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let extrap_factor = 1.0 - ramp;
                let interp = default[i] / factor;
                let extrap = default[i];
                out[i] = interp * (1.0 - extrap_factor) + extrap * extrap_factor;
            }
            (out, attn)
        }
    }
}

/// RoPE on one head vector (len d) at position `pos`, `rotate_half` convention (HF
/// `apply_rotary_pos_emb` with `emb = cat(freqs, freqs)`): for i < d/2, with
/// `c = cos(pos * f_i) * scaling`, `s = sin(pos * f_i) * scaling`:
/// `out[i] = x[i] c - x[i + d/2] s`, `out[i + d/2] = x[i + d/2] c + x[i] s`.
pub fn ref_rope(x: &[f64], pos: f64, inv_freq: &[f64], scaling: f64) -> Vec<f64> {
    let d = x.len();
    let half = d / 2;
    assert_eq!(inv_freq.len(), half, "rope: inv_freq has {} entries, head_dim/2 is {half}", inv_freq.len());
    let mut out = vec![0.0; d];
    for i in 0..half {
        let ang = pos * inv_freq[i];
        let c = ang.cos() * scaling;
        let s = ang.sin() * scaling;
        out[i] = x[i] * c - x[i + half] * s;
        out[i + half] = x[i + half] * c + x[i] * s;
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Teacher
// ------------------------------------------------------------------------------------------------

/// Full-vocabulary teacher logits from the target's final hidden state (already after the
/// target's final norm, eagle3.md §2): `logits[t][v] = Σ_i lm_head[v][i] * hidden[t][i]`.
pub fn ref_teacher_from_hidden(final_hidden: &[Vec<f64>], lm_head: &[Vec<f64>]) -> Mat {
    let mut out = Vec::with_capacity(final_hidden.len());
    for h in final_hidden {
        out.push(ref_matvec(lm_head, h));
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Weights
// ------------------------------------------------------------------------------------------------

fn tensor<'a>(w: &'a TensorMap, key: &str) -> &'a HostTensor {
    w.get(key).unwrap_or_else(|| panic!("reference: missing tensor `{key}`"))
}

fn load_mat(w: &TensorMap, key: &str, rows: usize, cols: usize) -> Mat {
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

fn load_vec(w: &TensorMap, key: &str, n: usize) -> Vec<f64> {
    let t = tensor(w, key);
    assert_eq!(t.shape, vec![n], "reference: `{key}` has shape {:?}, expected [{n}]", t.shape);
    t.to_f32(key).unwrap_or_else(|e| panic!("reference: {e}")).iter().map(|&x| x as f64).collect()
}

fn load_ints(w: &TensorMap, key: &str, n: usize) -> Vec<i64> {
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
fn project_row(
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
fn attend(cfg: &DrafterConfig, q: &Mat, keys: &[&Mat], values: &[&Mat]) -> Vec<f64> {
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
fn finish_row(cfg: &DrafterConfig, w: &RefWeights, residual: &[f64], attn: &[f64]) -> Vec<f64> {
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

// ------------------------------------------------------------------------------------------------
// Training-time test
// ------------------------------------------------------------------------------------------------

/// Per-step sums of one sequence's TTT metrics (eagle3.md §3), un-normalised so sequences can be
/// summed before dividing (see [`ref_metrics`]).
#[derive(Debug, Clone, Default)]
pub struct RefTtt {
    /// `Σ_t pm_k[t] * -(Σ_j p_k[t][j] * logq_k[t][j])`.
    pub ce_sum: Vec<f64>,
    /// `Σ_t pm_k[t] * [argmax logq_k[t] == argmax p_k[t]]`.
    pub correct: Vec<f64>,
    /// `Σ_t m_k[t]`.
    pub m_count: Vec<f64>,
    /// `Σ_t pm_k[t]`.
    pub pm_count: Vec<f64>,
    /// `Σ_t pm_k[t] * Σ_j min(pf_k[t][j], exp(logq_k[t][j]))`.
    pub alpha_sum: Vec<f64>,
    /// Drafter logits `lm_head(norm(h))` per step: [K][L][Vd].
    pub logits_per_step: Vec<Mat>,
    /// Layer output h per step, BEFORE the final norm (even with `norm_output`): [K][L][H].
    pub hidden_per_step: Vec<Mat>,
}

/// The shifted TTT targets of one sequence (eagle3.md §3, "shift once, never twice").
#[derive(Debug, Clone)]
pub struct RefTargets {
    /// `ids = x[1:] + [0]`.
    pub ids: Vec<i64>,
    /// `m` with `m[L-1] = 0` (NOT shifted).
    pub m: Vec<f64>,
    /// `pm[t] = m[t] * t2d[argmax_v T[t][v]]`.
    pub pm: Vec<f64>,
    /// `p[t][j] = softmax_j T[t][target_id(j)]`, [L][Vd], indexed by draft id.
    pub p: Mat,
    /// `pf[t][j] = exp(T[t][target_id(j)] - logsumexp_v T[t][v])`, [L][Vd].
    pub pf: Mat,
}

/// Build the shifted targets: `T = TL[1:] + [zero row]`, then `m`, `pm`, `p`, `pf` as documented
/// on [`RefTargets`]. At t = L-1 T is the zero row (p uniform 1/Vd, pf = 1/V) and m = pm = 0.
///
/// CHOICE: p and pf are indexed by draft id j (the lm_head row). With a valid d2t (§4: draft ids
/// sorted by target id) this is the "ascending target-id order" of §3.
pub fn ref_targets(
    cfg: &DrafterConfig,
    w: &RefWeights,
    ids: &[i64],
    loss_mask: &[f64],
    teacher_logits: &[Vec<f64>],
) -> RefTargets {
    let l = ids.len();
    let v = cfg.vocab_size;
    let vd = cfg.draft_vocab_size;
    assert!(l >= 1, "empty sequence");
    assert_eq!(loss_mask.len(), l, "loss_mask length");
    assert_eq!(teacher_logits.len(), l, "teacher_logits length");
    let mut sids = vec![0i64; l];
    let mut tshift: Mat = Vec::with_capacity(l);
    for t in 0..l {
        if t + 1 < l {
            sids[t] = ids[t + 1];
            assert_eq!(teacher_logits[t + 1].len(), v, "teacher logits must span the full vocab V");
            tshift.push(teacher_logits[t + 1].clone());
        } else {
            sids[t] = 0;
            tshift.push(vec![0.0; v]);
        }
    }
    let mut m = loss_mask.to_vec();
    m[l - 1] = 0.0;
    let mut pm = vec![0.0; l];
    let mut p = Vec::with_capacity(l);
    let mut pf = Vec::with_capacity(l);
    for t in 0..l {
        let a = ref_argmax(&tshift[t]);
        pm[t] = m[t] * if w.t2d[a] { 1.0 } else { 0.0 };
        let mut restricted = vec![0.0; vd];
        for j in 0..vd {
            restricted[j] = tshift[t][w.target_id(j)];
        }
        p.push(ref_softmax(&restricted));
        let lse = ref_logsumexp(&tshift[t]);
        pf.push(restricted.iter().map(|&x| (x - lse).exp()).collect());
    }
    RefTargets { ids: sids, m, pm, p, pf }
}

/// Training-time test of ONE sequence, exactly eagle3.md §3.
///
/// * `ids` = x (len L, target token ids), `loss_mask` (len L, 0/1), `aux` = f [L][A*Ht],
///   `teacher_logits` = TL [L][V] (full vocab, unshifted), `ttt_length` = K.
/// * `h = fc(f)`; for k in 0..K: `h = layer(embed(ids_k), h)`, logits = lm_head(norm(h)).
/// * Step k, position t: the query is RoPE'd at position t+k; it sees the step-0 keys/values at
///   positions s <= t (RoPE'd at s when created) and the keys/values of steps 1..k at the SAME
///   position t (step j's RoPE'd at t+j); one softmax over those t+1+k scores, scale 1/sqrt(d).
/// * Embedding input at step k, position t: `ids[t+k]` (0 past the end): shift_left after each step.
/// * Next step input: h (pre-norm), or norm(h) when `norm_output`; h is never shifted in time.
/// * Metrics at step k use `p_k[t] = p[t+k]` (uniform 1/Vd past the end), `pf_k[t] = pf[t+k]`
///   (0 past the end), `pm_k[t] = pm[t+k]`, `m_k[t] = m[t+k]` (0 past the end).
pub fn ref_ttt(
    cfg: &DrafterConfig,
    weights: &TensorMap,
    ids: &[i64],
    loss_mask: &[f64],
    aux: &[Vec<f64>],
    teacher_logits: &[Vec<f64>],
    ttt_length: usize,
) -> RefTtt {
    let w = RefWeights::load(cfg, weights);
    let l = ids.len();
    let vd = cfg.draft_vocab_size;
    assert_eq!(aux.len(), l, "aux length");
    for &x in ids {
        assert!(x >= 0 && (x as usize) < cfg.vocab_size, "token id {x} outside the target vocab");
    }
    let tg = ref_targets(cfg, &w, ids, loss_mask, teacher_logits);
    let (inv_freq, scaling) = ref_rope_inv_freq(cfg);

    // h = fc(f)
    let mut h: Mat = aux.iter().map(|f| ref_fc(cfg, &w, f)).collect();

    // Step-0 keys/values per position, and the diagonal keys/values of later steps:
    // cache_k[j][t] = k heads produced at step j, position t.
    let mut cache_k: Vec<Vec<Mat>> = Vec::new();
    let mut cache_v: Vec<Vec<Mat>> = Vec::new();

    let mut out = RefTtt {
        ce_sum: vec![0.0; ttt_length],
        correct: vec![0.0; ttt_length],
        m_count: vec![0.0; ttt_length],
        pm_count: vec![0.0; ttt_length],
        alpha_sum: vec![0.0; ttt_length],
        logits_per_step: Vec::new(),
        hidden_per_step: Vec::new(),
    };

    for k in 0..ttt_length {
        // Projections of every position at this step (RoPE position t + k).
        let mut residuals = Vec::with_capacity(l);
        let mut qs = Vec::with_capacity(l);
        let mut ks = Vec::with_capacity(l);
        let mut vs = Vec::with_capacity(l);
        for t in 0..l {
            let id = if t + k < l { tg.ids[t + k] } else { 0 };
            let emb = &w.embed[id as usize];
            let (r, q, kk, vv) = project_row(cfg, &w, emb, &h[t], (t + k) as f64, &inv_freq, scaling);
            residuals.push(r);
            qs.push(q);
            ks.push(kk);
            vs.push(vv);
        }
        cache_k.push(ks);
        cache_v.push(vs);

        // Attention + MLP per position.
        let mut h_out: Mat = Vec::with_capacity(l);
        for t in 0..l {
            let mut keys: Vec<&Mat> = Vec::new();
            let mut values: Vec<&Mat> = Vec::new();
            for s in 0..=t {
                keys.push(&cache_k[0][s]);
                values.push(&cache_v[0][s]);
            }
            for j in 1..=k {
                keys.push(&cache_k[j][t]);
                values.push(&cache_v[j][t]);
            }
            let attn = attend(cfg, &qs[t], &keys, &values);
            h_out.push(finish_row(cfg, &w, &residuals[t], &attn));
        }

        // Head and metrics.
        let uniform = vec![1.0 / vd as f64; vd];
        let zeros = vec![0.0; vd];
        let mut logits_k = Vec::with_capacity(l);
        for t in 0..l {
            let logits = ref_head(cfg, &w, &h_out[t]);
            let logq = ref_log_softmax(&logits);
            let in_range = t + k < l;
            let p_k = if in_range { &tg.p[t + k] } else { &uniform };
            let pf_k = if in_range { &tg.pf[t + k] } else { &zeros };
            let pm_k = if in_range { tg.pm[t + k] } else { 0.0 };
            let m_k = if in_range { tg.m[t + k] } else { 0.0 };
            let mut cross = 0.0;
            let mut overlap = 0.0;
            for j in 0..vd {
                cross += p_k[j] * logq[j];
                overlap += pf_k[j].min(logq[j].exp());
            }
            out.ce_sum[k] += pm_k * -cross;
            if ref_argmax(&logq) == ref_argmax(p_k) {
                out.correct[k] += pm_k;
            }
            out.m_count[k] += m_k;
            out.pm_count[k] += pm_k;
            out.alpha_sum[k] += pm_k * overlap;
            logits_k.push(logits);
        }
        out.logits_per_step.push(logits_k);

        // The next step consumes h (pre-norm), or norm(h) with norm_output (EAGLE-3.1).
        h = if cfg.norm_output {
            h_out.iter().map(|x| ref_rmsnorm(x, &w.norm, cfg.rms_norm_eps)).collect()
        } else {
            h_out.clone()
        };
        out.hidden_per_step.push(h_out);
    }
    out
}

/// Batch-level TTT metrics (eagle3.md §3).
#[derive(Debug, Clone, PartialEq)]
pub struct RefMetrics {
    /// `loss_k = Σ ce_sum_k / N_positions`.
    pub loss_k: Vec<f64>,
    /// `acc_k = Σ correct_k / Σ m_count_k` (0 when the denominator is 0).
    pub acc_k: Vec<f64>,
    /// `alpha_k = Σ alpha_sum_k / Σ pm_count_k` (0 when the denominator is 0).
    pub alpha_k: Vec<f64>,
    /// `Σ_k 0.8^k loss_k`.
    pub loss: f64,
    /// Conditional-rate accept length (§6, EAGLE paper): `1 + Σ_k Π_{i<=k} acc_i`.
    pub simulated_accept_length: f64,
}

/// Combine per-sequence sums. `n_positions` is the number of token positions, B*L for an
/// unpadded batch, the sum of real lengths for a padded one (eagle3.md §3 divides the loss by B*L).
///
/// CHOICE: a zero denominator (no masked positions) gives 0 rather than NaN; no epsilon is added
/// (SpecForge adds 1e-6 to the accuracy denominator; the spec does not).
pub fn ref_metrics(batch: &[RefTtt], n_positions: usize) -> RefMetrics {
    let k_len = batch.first().map(|r| r.ce_sum.len()).unwrap_or(0);
    let mut loss_k = vec![0.0; k_len];
    let mut acc_k = vec![0.0; k_len];
    let mut alpha_k = vec![0.0; k_len];
    for k in 0..k_len {
        let (mut ce, mut correct, mut m, mut pm, mut alpha) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for r in batch {
            assert_eq!(r.ce_sum.len(), k_len, "sequences with different ttt_length");
            ce += r.ce_sum[k];
            correct += r.correct[k];
            m += r.m_count[k];
            pm += r.pm_count[k];
            alpha += r.alpha_sum[k];
        }
        loss_k[k] = if n_positions > 0 { ce / n_positions as f64 } else { 0.0 };
        acc_k[k] = if m > 0.0 { correct / m } else { 0.0 };
        alpha_k[k] = if pm > 0.0 { alpha / pm } else { 0.0 };
    }
    let mut loss = 0.0;
    let mut w = 1.0;
    for k in 0..k_len {
        loss += w * loss_k[k];
        w *= 0.8;
    }
    let mut accept = 1.0;
    let mut prod = 1.0;
    for k in 0..k_len {
        prod *= acc_k[k];
        accept += prod;
    }
    RefMetrics { loss_k, acc_k, alpha_k, loss, simulated_accept_length: accept }
}

// ------------------------------------------------------------------------------------------------
// Deterministic random fixtures
// ------------------------------------------------------------------------------------------------

/// The fixtures' generator: aerie's own splitmix64 (Steele, Lea, Flood 2014).
pub use aerie_model::rng::SplitMix as SplitMix64;

/// The fixtures' draws on top of the generator's 64 bits.
pub trait FixtureDraws {
    /// Uniform in [lo, hi).
    fn between(&mut self, lo: f64, hi: f64) -> f64;
    /// Zero-mean uniform with standard deviation `std` (half-width `std * sqrt(3)`).
    fn centered(&mut self, std: f64) -> f64;
    /// Uniform integer in [0, n), by modulo.
    fn below_mod(&mut self, n: usize) -> usize;
}

impl FixtureDraws for SplitMix64 {
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    fn centered(&mut self, std: f64) -> f64 {
        let a = std * 3f64.sqrt();
        self.between(-a, a)
    }

    fn below_mod(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

fn seeded(seed: u64, salt: &str) -> SplitMix64 {
    // Mix the tensor name in so that adding a tensor does not shift the others' values.
    let mut s = seed ^ 0xA5A5_5A5A_DEAD_BEEF;
    for b in salt.bytes() {
        s = s.rotate_left(5) ^ b as u64;
        s = s.wrapping_mul(0x100_0000_01B3);
    }
    SplitMix64(s)
}

fn rand_f32(rng: &mut SplitMix64, n: usize, std: f64) -> Vec<f32> {
    (0..n).map(|_| rng.centered(std) as f32).collect()
}

fn rand_norm_weight(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.between(0.9, 1.1) as f32).collect()
}

/// The sorted draft vocabulary `random_tiny_checkpoint` picks for `(cfg, seed)`: Vd distinct
/// target ids in ascending order (all of 0..V when Vd == V).
pub fn random_draft_vocab(cfg: &DrafterConfig, seed: u64) -> Vec<usize> {
    let v = cfg.vocab_size;
    let vd = cfg.draft_vocab_size;
    assert!(vd <= v, "Vd > V");
    let mut rng = seeded(seed, "draft_vocab");
    let mut all: Vec<usize> = (0..v).collect();
    // Partial Fisher-Yates: the first vd entries are a uniform random subset.
    for i in 0..vd {
        let j = i + rng.below_mod(v - i);
        all.swap(i, j);
    }
    let mut ids = all[..vd].to_vec();
    ids.sort_unstable();
    ids
}

/// A random drafter checkpoint in canonical key naming (eagle3.md §1 table), all floats f32:
/// weights and embeddings zero-mean uniform with std 0.2, norm weights uniform in [0.9, 1.1],
/// `fc_norm.{i}.weight` only when `cfg.fc_norm`, and a valid d2t/t2d (§4) for the sorted draft
/// vocab [`random_draft_vocab`]. Deterministic in `(cfg, seed)`.
pub fn random_tiny_checkpoint(cfg: &DrafterConfig, seed: u64) -> TensorMap {
    let h = cfg.hidden_size;
    let ht = cfg.target_hidden_size;
    let a = cfg.num_aux();
    let d = cfg.head_dim;
    let nh = cfg.num_attention_heads;
    let nkv = cfg.num_key_value_heads;
    let i = cfg.intermediate_size;
    let v = cfg.vocab_size;
    let vd = cfg.draft_vocab_size;
    let std = 0.2;
    let mut m = TensorMap::new();
    let mat = |m: &mut TensorMap, key: &str, rows: usize, cols: usize| {
        let mut rng = seeded(seed, key);
        m.insert(
            key.to_string(),
            HostTensor::from_f32(vec![rows, cols], &rand_f32(&mut rng, rows * cols, std), Dtype::F32),
        );
    };
    mat(&mut m, "embed_tokens.weight", v, h);
    mat(&mut m, "fc.weight", h, a * ht);
    mat(&mut m, "midlayer.self_attn.q_proj.weight", nh * d, 2 * h);
    mat(&mut m, "midlayer.self_attn.k_proj.weight", nkv * d, 2 * h);
    mat(&mut m, "midlayer.self_attn.v_proj.weight", nkv * d, 2 * h);
    mat(&mut m, "midlayer.self_attn.o_proj.weight", h, nh * d);
    mat(&mut m, "midlayer.mlp.gate_proj.weight", i, h);
    mat(&mut m, "midlayer.mlp.up_proj.weight", i, h);
    mat(&mut m, "midlayer.mlp.down_proj.weight", h, i);
    mat(&mut m, "lm_head.weight", vd, h);
    let norm = |m: &mut TensorMap, key: &str, n: usize| {
        let mut rng = seeded(seed, key);
        m.insert(key.to_string(), HostTensor::from_f32(vec![n], &rand_norm_weight(&mut rng, n), Dtype::F32));
    };
    norm(&mut m, "midlayer.input_layernorm.weight", h);
    norm(&mut m, "midlayer.hidden_norm.weight", h);
    norm(&mut m, "midlayer.post_attention_layernorm.weight", h);
    norm(&mut m, "norm.weight", h);
    if cfg.fc_norm {
        for c in 0..a {
            norm(&mut m, &format!("fc_norm.{c}.weight"), ht);
        }
    }
    let vocab = random_draft_vocab(cfg, seed);
    let d2t: Vec<i64> = vocab.iter().enumerate().map(|(j, &t)| t as i64 - j as i64).collect();
    let mut t2d = vec![false; v];
    for &t in &vocab {
        t2d[t] = true;
    }
    m.insert("d2t".into(), HostTensor::from_i64(vec![vd], &d2t));
    m.insert("t2d".into(), HostTensor::from_bool(vec![v], &t2d));
    m
}

/// YaRN with the default betas (32, 1) and neither attention factor nor mscale: the scaling the
/// tiny tests run, stretched by `factor` over an original context of `original` positions.
pub fn plain_yarn(factor: f64, original: usize) -> RopeScaling {
    RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: None,
        mscale: None,
        mscale_all_dim: None,
    }
}

/// A tiny config whose every dimension differs, so transposed or confused shapes fail loudly:
/// H 16, Ht 12, I 24, nH 4, nKV 2, d 6 (not H/nH), V 40, Vd 24, A 3, default RoPE theta 10000.
pub fn tiny_config() -> DrafterConfig {
    DrafterConfig {
        hidden_size: 16,
        target_hidden_size: 12,
        intermediate_size: 24,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 6,
        rms_norm_eps: 1e-5,
        rope: RopeConfig { theta: 10000.0, scaling: RopeScaling::Default },
        max_position_embeddings: 256,
        vocab_size: 40,
        draft_vocab_size: 24,
        aux_layers: AuxLayers { ids: vec![1, 3, 5], convention: AuxConvention::OutputOfLayer },
        fc_norm: false,
        norm_output: false,
        norm_before_residual: false,
        target_name_or_path: None,
        mla: None,
    }
}

/// One random training sequence for `cfg`.
#[derive(Debug, Clone)]
pub struct RefSequence {
    /// Token ids x, len L, in 0..V.
    pub ids: Vec<i64>,
    /// Loss mask, len L: a 0 prompt prefix then random 0/1 with ~80% ones.
    pub loss_mask: Vec<f64>,
    /// Aux features f [L][A*Ht], std 1.
    pub aux: Mat,
    /// Target final hidden state [L][Ht], std 1.
    pub final_hidden: Mat,
    /// Target lm_head [V][Ht], std 0.5.
    pub target_lm_head: Mat,
    /// `ref_teacher_from_hidden(final_hidden, target_lm_head)` [L][V].
    pub teacher_logits: Mat,
}

/// A deterministic random sequence of length `len`. ids, aux, final_hidden and target_lm_head
/// are f32-representable, so an f32 implementation receives exactly the same inputs;
/// teacher_logits is their exact f64 product.
pub fn random_sequence(cfg: &DrafterConfig, len: usize, seed: u64) -> RefSequence {
    let mut rng = seeded(seed, "sequence");
    let f32r = |x: f64| x as f32 as f64;
    let ids: Vec<i64> = (0..len).map(|_| rng.below_mod(cfg.vocab_size) as i64).collect();
    let prompt = len / 4;
    let loss_mask: Vec<f64> = (0..len)
        .map(|t| {
            if t < prompt {
                0.0
            } else if rng.uniform() < 0.8 {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let aw = cfg.num_aux() * cfg.target_hidden_size;
    let aux: Mat = (0..len).map(|_| (0..aw).map(|_| f32r(rng.centered(1.0))).collect()).collect();
    let final_hidden: Mat =
        (0..len).map(|_| (0..cfg.target_hidden_size).map(|_| f32r(rng.centered(1.0))).collect()).collect();
    let target_lm_head: Mat =
        (0..cfg.vocab_size).map(|_| (0..cfg.target_hidden_size).map(|_| f32r(rng.centered(0.5))).collect()).collect();
    let teacher_logits = ref_teacher_from_hidden(&final_hidden, &target_lm_head);
    RefSequence { ids, loss_mask, aux, final_hidden, target_lm_head, teacher_logits }
}
