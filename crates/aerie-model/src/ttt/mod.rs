//! The training-time-test (TTT) objective of EAGLE-3 (eagle3.md §3; SpecForge
//! `core/eagle3.py`, `OnlineEagle3Model.forward`): K unrolled draft steps over every position at
//! once, each step attending to the step-0 keys causally and to its own earlier steps' keys at
//! the same position, scored against the teacher with soft cross-entropy.
//!
//! Batches are right-padded; a padded batch gives each sequence exactly the sums it gets alone
//! (causal attention never looks right, and every per-position quantity is masked). The loss is
//! normalised by the number of real token positions (B·L when nothing is padded).
//!
//! [`eval`] runs the forward over captured shards without weight updates: the metrics of
//! `aerie eval loss` and of training's periodic evaluation.

use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData, activation::log_softmax, backend::Backend};
use serde::Serialize;

use crate::drafter::{Drafter, TttCache};
use crate::kernels::host::HostFloat;
use crate::layers::Linear;
use crate::precision::{host_f32, upcast};
use crate::teacher::TeacherTargets;
use crate::{Error, Result};

pub mod batch;
pub mod eval;
mod fused;

/// One padded batch for the TTT forward.
#[derive(Debug, Clone)]
pub struct TttBatch<B: Backend> {
    /// Captured token ids x `[B, L]`, right-padded with 0.
    pub input_ids: Tensor<B, 2, Int>,
    /// Loss mask m `[B, L]` (1 on assistant tokens, 0 on padding).
    pub loss_mask: Tensor<B, 2>,
    /// 1 on real tokens, 0 on padding `[B, L]`.
    pub valid: Tensor<B, 2>,
    /// Concatenated aux features f `[B, L, A·Ht]`.
    pub aux: Tensor<B, 3>,
    /// Teacher, unshifted (row t = distribution of token t+1).
    pub teacher: TeacherTargets<B>,
}

/// How the objective is unrolled and weighted.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct TttOptions {
    /// K, the number of unrolled draft steps (reference default 7).
    pub ttt_length: usize,
    /// Weight of each step's loss (reference default 0.8^k); length K.
    pub step_weights: Vec<f64>,
    /// Whether [`StepStats::alpha_tok`] must carry gradient (the TV and LK objectives). The soft
    /// cross-entropy needs only `ce_tok`; without it the fused CPU path skips α's gradient (one
    /// `[B, L, Vd]` buffer and its backward per step) and `alpha_tok` is a constant.
    #[serde(default = "yes")]
    pub alpha_grad: bool,
}

fn yes() -> bool {
    true
}

impl TttOptions {
    /// K steps weighted `decay^k`, α differentiable.
    pub fn geometric(ttt_length: usize, decay: f64) -> Self {
        Self { ttt_length, step_weights: (0..ttt_length).map(|k| decay.powi(k as i32)).collect(), alpha_grad: true }
    }

    /// The same options with `alpha_grad` set.
    pub fn with_alpha_grad(mut self, alpha_grad: bool) -> Self {
        self.alpha_grad = alpha_grad;
        self
    }

    /// Check K ≥ 1 and one weight per step.
    pub fn validate(&self) -> Result<()> {
        if self.ttt_length == 0 {
            return Err(Error::Incompatible(
                "ttt_length (--ttt-length) is 0; it is the number of draft steps the loss unrolls and must be at least 1"
                    .into(),
            ));
        }
        let max_depth = crate::drafter::shape::MAX_DEPTH;
        if self.ttt_length > max_depth {
            return Err(Error::Incompatible(format!(
                "ttt_length (--ttt-length) {} is above the limit of {max_depth} draft steps",
                self.ttt_length
            )));
        }
        if self.step_weights.len() != self.ttt_length {
            return Err(Error::Shape(format!(
                "ttt_length {} needs exactly that many step weights, got {}",
                self.ttt_length,
                self.step_weights.len()
            )));
        }
        Ok(())
    }
}

impl Default for TttOptions {
    fn default() -> Self {
        Self::geometric(7, 0.8)
    }
}

/// Per-sequence sums of one unrolled step, each `[B]`.
#[derive(Debug, Clone)]
pub struct StepStats<B: Backend> {
    /// Σ_t pm·CE(p_k, q) (differentiable).
    pub ce_sum: Tensor<B, 1>,
    /// Σ_t pm·[argmax q = argmax p_k]; the row sum of `hit_tok`.
    pub correct: Tensor<B, 1>,
    /// Σ_t m (the acc denominator).
    pub m_count: Tensor<B, 1>,
    /// Σ_t pm (the α denominator).
    pub pm_count: Tensor<B, 1>,
    /// Σ_t pm·Σ_v min(pf_k, q) (differentiable).
    pub alpha_sum: Tensor<B, 1>,
    /// Per position pm·CE(p_k, q) `[B, L]` (differentiable); `ce_sum` is its row sum.
    pub ce_tok: Tensor<B, 2>,
    /// Per position pm·Σ_v min(pf_k, q) `[B, L]` (differentiable); `alpha_sum` is its row sum.
    /// Training objectives built on α per token (TV, LK) use it.
    pub alpha_tok: Tensor<B, 2>,
    /// Per position pm_k·[argmax q = argmax p_k] `[B, L]` (a constant: argmax has no gradient).
    /// Under the greedy rule a draft is accepted exactly when it is the target's argmax, so this
    /// says which drafts a verify cycle would accept; on-policy replay (aerie-train's
    /// `optim.replay_weight`) walks decoding's cycles over it.
    pub hit_tok: Tensor<B, 2>,
}

/// Result of one TTT forward.
#[derive(Debug, Clone)]
pub struct TttOutput<B: Backend> {
    /// Σ_k w_k · Σ ce_sum_k / positions (scalar, differentiable).
    pub loss: Tensor<B, 1>,
    /// One entry per step.
    pub steps: Vec<StepStats<B>>,
    /// Real token positions in the batch (the loss normaliser).
    pub positions: usize,
}

fn shift_left<B: Backend, const D: usize>(x: Tensor<B, D>, k: usize, pad: f32) -> Tensor<B, D> {
    if k == 0 {
        return x;
    }
    let dims = x.dims();
    let l = dims[1];
    let mut pad_dims = dims;
    pad_dims[1] = k.min(l);
    let pad = Tensor::<B, D>::full(pad_dims, pad, &x.device()).cast(x.dtype());
    if k >= l {
        return pad;
    }
    Tensor::cat(vec![x.narrow(1, k, l - k), pad], 1)
}

fn shift_ids<B: Backend>(x: Tensor<B, 2, Int>, k: usize) -> Tensor<B, 2, Int> {
    let [b, l] = x.dims();
    let pad = Tensor::<B, 2, Int>::zeros([b, k.min(l)], &x.device());
    if k >= l {
        return pad;
    }
    Tensor::cat(vec![x.narrow(1, k, l - k), pad], 1)
}

/// How [`ttt_forward_with`] computes each step's loss over the draft vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossPath {
    /// [`LossPath::Fused`] on CPU backends (burn-flex, burn-ndarray) with f32/f64 logits,
    /// [`LossPath::Tensor`] elsewhere (a GPU keeps everything on the device).
    #[default]
    Auto,
    /// burn tensor ops: log-softmax, products and reductions over `[B, L, Vd]`, each
    /// differentiated by autodiff. Works on every backend.
    Tensor,
    /// One fused pass per position on the host with analytic gradients (see `ttt/fused.rs`);
    /// falls back to `Tensor` for logits that are neither f32 nor f64.
    Fused,
}

impl LossPath {
    fn fused_for<B: Backend>(self, dtype: DType) -> bool {
        let host_backend = || {
            let name = core::any::type_name::<B>();
            name.contains("burn_flex") || name.contains("burn_ndarray")
        };
        matches!(dtype, DType::F32 | DType::F64)
            && match self {
                LossPath::Tensor => false,
                LossPath::Fused => true,
                LossPath::Auto => host_backend(),
            }
    }
}

/// Run the K-step training-time test on one batch.
pub fn ttt_forward<B: Backend>(drafter: &Drafter<B>, batch: &TttBatch<B>, opts: &TttOptions) -> Result<TttOutput<B>> {
    ttt_forward_with(drafter, batch, opts, LossPath::Auto)
}

/// [`ttt_forward`] with an explicit [`LossPath`] (both give the same values and gradients up to
/// float rounding; tests compare them).
pub fn ttt_forward_with<B: Backend>(
    drafter: &Drafter<B>,
    batch: &TttBatch<B>,
    opts: &TttOptions,
    path: LossPath,
) -> Result<TttOutput<B>> {
    opts.validate()?;
    let cfg = drafter.config();
    let [b, l] = batch.input_ids.dims();
    let aux_dims = batch.aux.dims();
    let expect_aux = cfg.num_aux() * cfg.target_hidden_size;
    if aux_dims != [b, l, expect_aux] {
        return Err(Error::Shape(format!(
            "aux features are {aux_dims:?}, the drafter expects [{b}, {l}, {expect_aux}] ({} layers × {})",
            cfg.num_aux(),
            cfg.target_hidden_size
        )));
    }
    let vd = cfg.draft_vocab_size;
    if batch.teacher.p.dims() != [b, l, vd] {
        return Err(Error::Shape(format!("teacher is {:?}, expected [{b}, {l}, {vd}]", batch.teacher.p.dims())));
    }
    let device = batch.aux.device();
    let positions = batch.valid.clone().sum().into_scalar().elem::<f64>().round() as usize;

    // The one shift: position t pairs f_t with the embedding of x_{t+1} and the teacher of
    // x_{t+2}; the loss mask is not shifted but zeroed at each sequence's last position.
    let ids = shift_ids(batch.input_ids.clone(), 1);
    let m = batch.loss_mask.clone() * shift_left(batch.valid.clone(), 1, 0.0);
    let pm = m.clone() * shift_left(batch.teacher.in_draft.clone(), 1, 0.0);

    // The activations follow the aux features' dtype (bf16 compute over f32 weights).
    let compute = batch.aux.dtype();
    let mut hidden = drafter.fuse_aux(batch.aux.clone());
    let mut cache = TttCache::default();
    let mut steps = Vec::with_capacity(opts.ttt_length);
    let mut loss: Option<Tensor<B, 1>> = None;
    let mut scorer: Option<Scorer<B>> = None;
    // The head's weight transposed once for all steps (see `Linear::weight_t`).
    let head_t = drafter.lm_head.weight_t(hidden.dtype());
    for (k, &weight) in opts.step_weights.iter().enumerate() {
        let (cos, sin) = drafter.rotary().tables::<B>(k, l, &device);
        let out = drafter.midlayer.forward_ttt(
            drafter.embed(shift_ids(ids.clone(), k)).cast(compute),
            hidden,
            &cos,
            &sin,
            &mut cache,
        );
        let logits = upcast(Linear::forward_t(drafter.norm.forward(out.clone()), &head_t));
        hidden = drafter.carry(out);
        let scorer = scorer.get_or_insert_with(|| Scorer::new(path, logits.dtype(), batch, &m, &pm));
        let step = scorer.step(logits, k, opts.alpha_grad);
        let step_loss = step.ce_sum.clone().sum().mul_scalar(weight / positions.max(1) as f64);
        loss = Some(match loss {
            Some(acc) => acc + step_loss,
            None => step_loss,
        });
        steps.push(step);
    }
    Ok(TttOutput { loss: loss.expect("K >= 1"), steps, positions })
}

/// Scores one step's logits against the teacher, by tensor ops or on the host.
enum Scorer<B: Backend> {
    Tensor { p: Tensor<B, 3>, pf: Tensor<B, 3>, m: Tensor<B, 2>, pm: Tensor<B, 2> },
    Host32(HostScorer<f32>),
    Host64(HostScorer<f64>),
}

struct HostScorer<T> {
    teacher: fused::HostTeacher<T>,
    m: Vec<f32>,
    pm: Vec<f32>,
    shape: [usize; 2],
}

impl<B: Backend> Scorer<B> {
    fn new(path: LossPath, dtype: DType, batch: &TttBatch<B>, m: &Tensor<B, 2>, pm: &Tensor<B, 2>) -> Self {
        let vd = batch.teacher.p.dims()[2];
        if !path.fused_for::<B>(dtype) {
            return Scorer::Tensor {
                p: shift_left(batch.teacher.p.clone(), 1, 1.0 / vd as f32),
                pf: shift_left(batch.teacher.pf.clone(), 1, 0.0),
                m: m.clone(),
                pm: pm.clone(),
            };
        }
        let shape = batch.input_ids.dims();
        let (m, pm) = (host_f32(m.clone()), host_f32(pm.clone()));
        match dtype {
            DType::F64 => Scorer::Host64(HostScorer {
                teacher: fused::HostTeacher::new(&batch.teacher.p, &batch.teacher.pf),
                m,
                pm,
                shape,
            }),
            _ => Scorer::Host32(HostScorer {
                teacher: fused::HostTeacher::new(&batch.teacher.p, &batch.teacher.pf),
                m,
                pm,
                shape,
            }),
        }
    }

    fn step(&self, logits: Tensor<B, 3>, k: usize, alpha_grad: bool) -> StepStats<B> {
        match self {
            Scorer::Tensor { p, pf, m, pm } => tensor_step(logits, p, pf, m, pm, k),
            Scorer::Host32(h) => host_step(h, logits, k, alpha_grad),
            Scorer::Host64(h) => host_step(h, logits, k, alpha_grad),
        }
    }
}

/// The tensor formulation of one step (eagle3.md §3).
fn tensor_step<B: Backend>(
    logits: Tensor<B, 3>,
    p: &Tensor<B, 3>,
    pf: &Tensor<B, 3>,
    m: &Tensor<B, 2>,
    pm: &Tensor<B, 2>,
    k: usize,
) -> StepStats<B> {
    let [b, l, vd] = logits.dims();
    let (m_k, pm_k) = (shift_left(m.clone(), k, 0.0), shift_left(pm.clone(), k, 0.0));
    let p_k = shift_left(p.clone(), k, 1.0 / vd as f32);
    let pf_k = shift_left(pf.clone(), k, 0.0);
    let logq = log_softmax(logits, 2);
    let ce_tok = pm_k.clone() * (p_k.clone() * logq.clone()).sum_dim(2).neg().reshape([b, l]);
    let ce_sum = ce_tok.clone().sum_dim(1).reshape([b]);
    let q = logq.clone().exp();
    let alpha_tok = pm_k.clone() * q.min_pair(pf_k).sum_dim(2).reshape([b, l]);
    let alpha_sum = alpha_tok.clone().sum_dim(1).reshape([b]);
    let hit = logq.detach().argmax(2).equal(p_k.argmax(2)).float().cast(pm_k.dtype()).reshape([b, l]);
    let hit_tok = pm_k.clone() * hit;
    let correct = hit_tok.clone().sum_dim(1).reshape([b]);
    StepStats {
        ce_sum,
        correct,
        m_count: m_k.sum_dim(1).reshape([b]),
        pm_count: pm_k.sum_dim(1).reshape([b]),
        alpha_sum,
        ce_tok,
        alpha_tok,
        hit_tok,
    }
}

/// The fused host formulation of one step: values from `fused::step`, gradients through
/// `fused::surrogate` (skipped where no gradient can flow: a backend without autodiff, or α when
/// `alpha_grad` is off).
fn host_step<B: Backend, T: HostFloat>(
    h: &HostScorer<T>,
    logits: Tensor<B, 3>,
    k: usize,
    alpha_grad: bool,
) -> StepStats<B> {
    let [b, l, vd] = logits.dims();
    let device = logits.device();
    let dtype = logits.dtype();
    let tracked = B::ad_enabled(&device);
    let (ce_grad, alpha_grad) = (tracked, tracked && alpha_grad);
    let z = logits.clone().detach().into_data().convert::<T>().into_vec::<T>().expect("logits data");
    let r = fused::step(&z, &h.teacher, &h.pm, h.shape, k, [ce_grad, alpha_grad]);
    drop(z);
    let vec1 = |v: Vec<f64>| Tensor::<B, 1>::from_data(TensorData::new(v, [b]), (&device, dtype));
    let tok = |v: Vec<T>| Tensor::<B, 1>::from_data(TensorData::new(v, [b * l]), (&device, dtype)).reshape([b, l]);
    let shifted_sums = |v: &[f32]| {
        let mut s = vec![0f64; b];
        for (r, acc) in s.iter_mut().enumerate() {
            *acc = (k..l).map(|t| v[r * l + t] as f64).sum();
        }
        s
    };
    let with_grad = |value: Tensor<B, 2>, g: Option<Vec<T>>| match g {
        Some(g) => value + fused::surrogate(&logits, g, [b, l, vd]),
        None => value,
    };
    let ce_tok = with_grad(tok(r.ce), r.g_ce);
    let alpha_tok = with_grad(tok(r.alpha), r.g_alpha);
    StepStats {
        ce_sum: ce_tok.clone().sum_dim(1).reshape([b]),
        correct: vec1(r.correct),
        m_count: vec1(shifted_sums(&h.m)),
        pm_count: vec1(shifted_sums(&h.pm)),
        alpha_sum: alpha_tok.clone().sum_dim(1).reshape([b]),
        ce_tok,
        alpha_tok,
        hit_tok: tok(r.hit),
    }
}

/// Host-side sums of [`StepStats`] over many batches, turned into the public metrics of
/// `aerie eval loss` and training logs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct TttSums {
    /// Σ ce_sum per step.
    pub ce: Vec<f64>,
    /// Σ correct per step.
    pub correct: Vec<f64>,
    /// Σ m per step.
    pub m_count: Vec<f64>,
    /// Σ pm per step.
    pub pm_count: Vec<f64>,
    /// Σ α per step.
    pub alpha: Vec<f64>,
    /// Real token positions seen.
    pub positions: f64,
}

/// Public teacher-forced metrics (eagle3.md §3). Field names are a stable interface.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct TttMetrics {
    /// Σ_k w_k loss_k.
    pub loss: f64,
    /// loss_k = Σ pm·CE / positions.
    pub loss_per_step: Vec<f64>,
    /// acc_k = Σ pm·[argmax match] / Σ m.
    pub acc_per_step: Vec<f64>,
    /// α_k = Σ pm·Σ min(pf, q) / Σ pm.
    pub accept_rate_per_step: Vec<f64>,
    /// 1 + Σ_k Π_{i≤k} acc_i.
    pub simulated_accept_length: f64,
    /// Loss-mask tokens counted at step 0.
    pub tokens: f64,
    /// Real token positions (the loss normaliser).
    pub positions: f64,
}

/// The sums on the host in f64. Widened there, not by a device cast: wgpu has no f64 (its
/// shaders cannot hold one), and the widening is exact either way.
fn to_vec<B: Backend>(t: Tensor<B, 1>) -> Vec<f64> {
    t.detach().into_data().convert::<f64>().into_vec::<f64>().expect("f64 data")
}

impl TttSums {
    /// Add one forward's sums.
    pub fn add<B: Backend>(&mut self, out: &TttOutput<B>) {
        let k = out.steps.len();
        for v in [&mut self.ce, &mut self.correct, &mut self.m_count, &mut self.pm_count, &mut self.alpha] {
            if v.len() < k {
                v.resize(k, 0.0);
            }
        }
        for (i, s) in out.steps.iter().enumerate() {
            self.ce[i] += to_vec(s.ce_sum.clone()).iter().sum::<f64>();
            self.correct[i] += to_vec(s.correct.clone()).iter().sum::<f64>();
            self.m_count[i] += to_vec(s.m_count.clone()).iter().sum::<f64>();
            self.pm_count[i] += to_vec(s.pm_count.clone()).iter().sum::<f64>();
            self.alpha[i] += to_vec(s.alpha_sum.clone()).iter().sum::<f64>();
        }
        self.positions += out.positions as f64;
    }

    /// Normalise into metrics with the given step weights.
    pub fn metrics(&self, step_weights: &[f64]) -> TttMetrics {
        let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let loss_per_step: Vec<f64> = self.ce.iter().map(|&c| div(c, self.positions)).collect();
        let acc_per_step: Vec<f64> = self.correct.iter().zip(&self.m_count).map(|(&c, &m)| div(c, m)).collect();
        let accept_rate_per_step = self.alpha.iter().zip(&self.pm_count).map(|(&a, &p)| div(a, p)).collect();
        let loss = loss_per_step.iter().zip(step_weights).map(|(l, w)| l * w).sum();
        TttMetrics {
            loss,
            simulated_accept_length: simulated_accept_length(&acc_per_step),
            loss_per_step,
            acc_per_step,
            accept_rate_per_step,
            tokens: self.m_count.first().copied().unwrap_or(0.0),
            positions: self.positions,
        }
    }
}

/// τ from conditional per-step rates: `1 + Σ_k Π_{i≤k} a_i` (eagle3.md §6).
pub fn simulated_accept_length(conditional: &[f64]) -> f64 {
    let mut prod = 1.0;
    1.0 + conditional
        .iter()
        .map(|a| {
            prod *= a;
            prod
        })
        .sum::<f64>()
}
