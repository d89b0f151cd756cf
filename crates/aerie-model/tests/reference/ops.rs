//! Elementary operations, RoPE (HF transformers' inverse frequencies and scalings) and the
//! teacher's logits, each a formula written out in f64 loops.

#![allow(dead_code)]
#![allow(clippy::needless_range_loop)]

use aerie_model::{DrafterConfig, RopeScaling};

use super::*;

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
