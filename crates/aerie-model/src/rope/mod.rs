//! Rotary position embeddings in the HF Llama (`rotate_half`) convention, with the frequency
//! scalings of transformers' `modeling_rope_utils.py` (default, linear, llama3, yarn).
//!
//! burn's `RotaryEncoding` rotates interleaved pairs and has no scaling (burn.md), so the tables
//! are computed here in f64 on the host ([`Rotary`], for the drafter and the native target alike)
//! and applied as `x * cos + rotate_half(x) * sin` ([`apply`]: burn tensor ops, or on the CPU
//! backend the host kernel of `rope/kernel.rs`).

mod kernel;

use burn::tensor::{Tensor, TensorData, backend::Backend};

use crate::{RopeConfig, RopeScaling};

/// Inverse frequencies (length `head_dim / 2`) and the attention scaling that multiplies cos and
/// sin (1 except for YaRN), exactly as transformers computes them.
pub fn inv_freq(rope: &RopeConfig, head_dim: usize) -> (Vec<f64>, f64) {
    let d = head_dim as f64;
    let base: Vec<f64> = (0..head_dim / 2).map(|i| 1.0 / rope.theta.powf((2 * i) as f64 / d)).collect();
    match &rope.scaling {
        RopeScaling::Default => (base, 1.0),
        RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let old = *original_max_position_embeddings as f64;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            let scaled = base
                .iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect();
            (scaled, 1.0)
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
            let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let attention = match (attention_factor, mscale, mscale_all_dim) {
                (Some(a), _, _) => *a,
                (None, Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => {
                    get_mscale(*factor, *m) / get_mscale(*factor, *ma)
                }
                _ => get_mscale(*factor, 1.0),
            };
            let max_pos = *original_max_position_embeddings as f64;
            let correction_dim = |rotations: f64| {
                d * (max_pos / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * rope.theta.ln())
            };
            let low = correction_dim(*beta_fast).floor().max(0.0);
            let high = correction_dim(*beta_slow).ceil().min(d - 1.0);
            let high = if low == high { high + 0.001 } else { high };
            let freqs = base
                .iter()
                .enumerate()
                .map(|(i, &extrapolation)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation_factor = 1.0 - ramp;
                    let interpolation = extrapolation / factor;
                    interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
                })
                .collect();
            (freqs, attention)
        }
    }
}

/// cos/sin tables for one RoPE configuration; rows are built for the positions a forward needs.
#[derive(Debug, Clone)]
pub struct Rotary {
    inv_freq: Vec<f64>,
    attention_scaling: f64,
    head_dim: usize,
}

impl Rotary {
    /// Tables for `rope` at `head_dim`.
    pub fn new(rope: &RopeConfig, head_dim: usize) -> Self {
        let (inv_freq, attention_scaling) = inv_freq(rope, head_dim);
        Self { inv_freq, attention_scaling, head_dim }
    }

    /// `(cos, sin)` of shape `[L, head_dim]` for positions `start..start + len`, halves
    /// duplicated as HF does (`emb = cat(freqs, freqs)`).
    pub fn tables<B: Backend>(&self, start: usize, len: usize, device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let positions: Vec<usize> = (start..start + len).collect();
        self.tables_at(&positions, device)
    }

    /// [`Self::tables`] at arbitrary `positions`, one row each (tree verification puts siblings
    /// at one position).
    pub fn tables_at<B: Backend>(&self, positions: &[usize], device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let d = self.head_dim;
        let len = positions.len();
        let mut cos = Vec::with_capacity(len * d);
        let mut sin = Vec::with_capacity(len * d);
        for &p in positions {
            for _half in 0..2 {
                for &f in &self.inv_freq {
                    let angle = p as f64 * f;
                    cos.push((angle.cos() * self.attention_scaling) as f32);
                    sin.push((angle.sin() * self.attention_scaling) as f32);
                }
            }
        }
        let cos = Tensor::from_data(TensorData::new(cos, [len, d]), device);
        let sin = Tensor::from_data(TensorData::new(sin, [len, d]), device);
        (cos, sin)
    }
}

/// Apply RoPE to `x: [B, heads, L, d]` with tables `[L, d]`: `x * cos + rotate_half(x) * sin`
/// (on the CPU backend as one host pass, `rope/kernel.rs`).
pub fn apply<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Tensor<B, 4> {
    match kernel::apply(&x, cos, sin) {
        Some(y) => y,
        None => apply_reference(x, cos, sin),
    }
}

/// [`apply`] in burn tensor ops (every backend and dtype).
pub(crate) fn apply_reference<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Tensor<B, 4> {
    let [_, _, _, d] = x.dims();
    let x1 = x.clone().narrow(3, 0, d / 2);
    let x2 = x.clone().narrow(3, d / 2, d / 2);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    let cos = cos.clone().cast(x.dtype()).unsqueeze::<4>();
    let sin = sin.clone().cast(x.dtype()).unsqueeze::<4>();
    x * cos + rotated * sin
}
