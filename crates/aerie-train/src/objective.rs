//! The training objectives over [`aerie_model::ttt_forward`]'s per-step sums (eagle3.md §3), with
//! normalisers taken over the WHOLE optimizer step (every micro-batch on every replica), so that
//! splitting a step across micro-batches or devices changes nothing but float rounding:
//!
//! - `soft_ce`: Σ_k w_k · Σ pm·CE(p_k, q) / positions, positions = real tokens of the step (the
//!   reference's B·L without padding; the loss `aerie eval loss` reports);
//! - `tv`: Σ_k w_k · Σ pm·(1 - α) / Σ pm_k, the mean total variation 1 - α per predicted token,
//!   α = Σ_v min(pf_k, q);
//! - `lk`: Σ_k w_k · Σ pm·[λ·KL(p_k‖q) + (1 - λ)(1 - α)] / Σ pm_k, λ = exp(-α) per token,
//!   detached. KL = CE - H(p_k); H only shifts the value (the gradient is λ·∇CE + ...).
//!
//! The normalisers need pm_k = m · in_draft shifted as the forward shifts it; [`Normalisers`]
//! computes them on the host from a collated batch before any forward runs.
//!
//! With `optim.replay_weight` β > 0 the soft-CE gains β · Σ_k w_k · Σ_t r_k[t]·ce_tok_k[t] /
//! positions, r the cycle starts of greedy decoding walked over the same forward's hits
//! ([`crate::replay`]).

use aerie_model::TttBatch;
use aerie_model::precision::host_f32;
use aerie_model::ttt::TttOutput;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::config::LossKind;

/// The masks of one collated micro-batch that the objectives need, on the host.
#[derive(Debug, Clone)]
pub struct BatchMasks {
    /// `[B, L]`.
    pub shape: [usize; 2],
    /// Real token positions (Σ valid).
    pub positions: f64,
    /// pm (before the per-step shift) `[B·L]`: m · in_draft at t + 1, m = loss mask · valid at t + 1.
    pub pm: Vec<f32>,
}

impl BatchMasks {
    /// Read the masks of `batch` (mirrors the one shift of `ttt_forward`).
    pub fn of<B: Backend>(batch: &TttBatch<B>) -> Self {
        let [b, l] = batch.input_ids.dims();
        let mask = host_f32(batch.loss_mask.clone());
        let valid = host_f32(batch.valid.clone());
        let in_draft = host_f32(batch.teacher.in_draft.clone());
        let mut pm = vec![0f32; b * l];
        for r in 0..b {
            for t in 0..l.saturating_sub(1) {
                let i = r * l + t;
                pm[i] = mask[i] * valid[i + 1] * in_draft[i + 1];
            }
        }
        Self { shape: [b, l], positions: valid.iter().map(|&v| v as f64).sum(), pm }
    }

    /// Σ pm_k (pm shifted left by k within each row).
    pub fn pm_count(&self, k: usize) -> f64 {
        let [b, l] = self.shape;
        (0..b).map(|r| self.pm[r * l + k.min(l)..(r + 1) * l].iter().map(|&v| v as f64).sum::<f64>()).sum()
    }

    /// pm_k as a `[B, L]` tensor.
    fn pm_k<B: Backend>(&self, k: usize, device: &B::Device) -> Tensor<B, 2> {
        let [b, l] = self.shape;
        let mut out = vec![0f32; b * l];
        for r in 0..b {
            for t in 0..l.saturating_sub(k) {
                out[r * l + t] = self.pm[r * l + t + k];
            }
        }
        Tensor::from_data(TensorData::new(out, [b, l]), device)
    }
}

/// Step-wide denominators.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Normalisers {
    /// Real token positions of the whole step.
    pub positions: f64,
    /// Σ pm_k of the whole step, per unrolled step k.
    pub pm: Vec<f64>,
}

impl Normalisers {
    /// Sum over the step's micro-batches.
    pub fn of(masks: &[&BatchMasks], ttt_length: usize) -> Self {
        Self {
            positions: masks.iter().map(|m| m.positions).sum(),
            pm: (0..ttt_length).map(|k| masks.iter().map(|m| m.pm_count(k)).sum()).collect(),
        }
    }
}

/// `[B, L]` shifted left by `k` along dim 1, zero-padded.
fn shift_left<B: Backend>(x: Tensor<B, 2>, k: usize) -> Tensor<B, 2> {
    let [b, l] = x.dims();
    if k == 0 {
        return x;
    }
    let pad = Tensor::zeros([b, k.min(l)], &x.device());
    if k >= l {
        return pad;
    }
    Tensor::cat(vec![x.narrow(1, k, l - k), pad], 1)
}

/// This micro-batch's share of the step's objective (scalar, differentiable); the step's
/// objective is the sum of the shares of its micro-batches. `extra` (the replay term, β times
/// [`crate::replay::Replay::term`]) is added to the soft-CE; the other objectives take none (the
/// config refuses the combination).
pub fn micro_loss<B: Backend>(
    kind: LossKind,
    out: &TttOutput<B>,
    batch: &TttBatch<B>,
    masks: &BatchMasks,
    norm: &Normalisers,
    weights: &[f64],
    extra: Option<Tensor<B, 1>>,
) -> Tensor<B, 1> {
    let device = batch.aux.device();
    match kind {
        LossKind::SoftCe => {
            // ttt_forward normalises by this batch's positions; rescale to the step's. The factor
            // is exactly 1 when the step is one micro-batch.
            let share = out.positions as f64 / norm.positions.max(1.0);
            let ce = if share == 1.0 { out.loss.clone() } else { out.loss.clone().mul_scalar(share) };
            match extra {
                Some(term) => ce + term,
                None => ce,
            }
        }
        LossKind::Tv | LossKind::Lk => {
            let entropy = (kind == LossKind::Lk).then(|| {
                let p = batch.teacher.p.clone();
                let [b, l, _] = p.dims();
                (p.clone() * p.clamp_min(1e-30).log()).sum_dim(2).neg().reshape([b, l])
            });
            let mut total: Option<Tensor<B, 1>> = None;
            for (k, (s, &w)) in out.steps.iter().zip(weights).enumerate() {
                let denom = norm.pm.get(k).copied().unwrap_or(0.0);
                if denom <= 0.0 {
                    continue;
                }
                let pm_k = masks.pm_k::<B>(k, &device);
                let tv_tok = pm_k.clone() - s.alpha_tok.clone();
                let tok = match &entropy {
                    None => tv_tok,
                    Some(h) => {
                        let lambda = s.alpha_tok.clone().detach().neg().exp();
                        let kl_tok = s.ce_tok.clone() - pm_k * shift_left(h.clone(), k + 1);
                        lambda.clone() * kl_tok + (lambda.neg().add_scalar(1.0)) * tv_tok
                    }
                };
                let term = tok.sum().mul_scalar(w / denom);
                total = Some(match total {
                    Some(t) => t + term,
                    None => term,
                });
            }
            // No predicted token in the whole step: a zero that still belongs to the graph.
            total.unwrap_or_else(|| out.loss.clone().mul_scalar(0.0))
        }
    }
}
