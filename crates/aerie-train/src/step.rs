//! One optimizer step: collate the step's micro-batches (teacher included) on their replicas,
//! compute the step-wide normalisers, forward and backward each micro-batch, sum the gradients
//! over the replicas through the all-reduce seam ([`crate::collective`]), clip the global norm,
//! and take one AdamW step on float32 weights on every replica.
//!
//! Data parallelism: micro-batch j of a step goes to replica `j mod R`; every micro-batch's loss
//! is its share of the step objective (normalised by the whole step's token counts, see
//! [`crate::objective`]), so the summed gradient is that of the step's union batch whatever the
//! split. Each replica keeps its own copy of the weights and of the AdamW state; the all-reduce
//! hands every replica the same summed gradient, bit for bit, so all of them clip and step alike
//! and stay identical without any weights moving after a step. Replicas on distinct devices run
//! in one thread each, every thread on the trainer's burn stream (the module `fan_out` says why);
//! replicas on the same device (`--devices cpu,cpu`) run one after the other.
//! Every tracked op runs under [`aerie_model::autodiff`]'s guard, without which a replica's
//! backward can silently drop another replica's gradient (burn 0.21's graph sweep race).

use aerie_data::shard::SampleView;
use aerie_model::autodiff;
use aerie_model::ttt::batch::{TeacherSource, VocabStatsCache, collate};
use aerie_model::{Drafter, TargetHead, TeacherTargets, TttBatch, TttOptions, TttSums, ttt_forward};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Tensor};
use std::sync::Arc;

use crate::anchor::{Anchor, add_pull, anchor_of};
use crate::collective::{AllReduce, HostExchange, all_reduce_grads, copy_model, copy_record};
use crate::config::{LossKind, OptimConfig};
use crate::fan_out::per_replica;
use crate::grads::{accumulate, clip_factor, global_norm, make_contiguous, scale_grads, weights_checksum};
use crate::objective::{BatchMasks, Normalisers, micro_loss};
use crate::replay::Replay;
use crate::{Error, Result};

/// AdamW over a drafter.
pub type Adam<B> = OptimizerAdaptor<AdamW, Drafter<B>, B>;

/// The optimizer's state (moments and step count per parameter), as burn records it.
pub type OptimRecord<B> = <Adam<B> as Optimizer<Drafter<B>, B>>::Record;

/// burn's AdamW with every setting given explicitly (its defaults differ from PyTorch's: eps
/// 1e-5, weight decay 1e-4). No clipping here: [`crate::grads`] clips the global norm.
pub fn adamw<B: AutodiffBackend>(o: &OptimConfig) -> Adam<B> {
    AdamWConfig::new()
        .with_beta_1(o.betas[0] as f32)
        .with_beta_2(o.betas[1] as f32)
        .with_epsilon(o.eps as f32)
        .with_weight_decay(o.weight_decay as f32)
        .with_amsgrad(false)
        .with_cautious_weight_decay(false)
        .with_grad_clipping(None)
        .init()
}

/// A replica's device and its copy of the target head (`None`: a top-k teacher).
pub type DeviceHead<B> = (burn::tensor::ops::Device<B>, Option<TargetHead<<B as AutodiffBackend>::InnerBackend>>);

/// One device taking part in a step: its own weights and AdamW state, equal to every other
/// replica's after each step (the all-reduce gives all of them the same gradient).
pub struct Replica<B: AutodiffBackend> {
    /// Its device.
    pub device: B::Device,
    /// The target head on this device (`None`: the shards' top-k teacher is used).
    pub head: Option<TargetHead<B::InnerBackend>>,
    /// Its weights (only taken out during the optimizer step).
    model: Option<Drafter<B>>,
    optim: Adam<B>,
    /// The warm start's weights on this device, when the run is anchored to them.
    anchor: Option<Anchor<B::InnerBackend>>,
}

impl<B: AutodiffBackend> Replica<B> {
    /// This replica's weights.
    pub fn model(&self) -> &Drafter<B> {
        self.model.as_ref().expect("the model is only taken inside step")
    }
}

/// A micro-batch handed to [`Trainer::step`]: its samples and how to name them in errors.
pub struct MicroInput<'a> {
    /// The samples.
    pub samples: Vec<SampleView<'a>>,
    /// One label per sample (`DIR#INDEX (id N)`).
    pub labels: Vec<String>,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Default)]
pub struct StepReport {
    /// The step's objective (sum of the micro-batch shares).
    pub loss: f64,
    /// Per-step sums for the public metrics (loss_k, acc_k, α_k).
    pub sums: TttSums,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Real token positions.
    pub positions: f64,
    /// Padded tokens (Σ B·Lmax over micro-batches).
    pub padded_tokens: f64,
    /// The L2-SP penalty λ/2·Σ‖θ − θ₀‖² at the step's weights (before its update), when the run
    /// is anchored; not part of `loss`, which stays the distillation objective.
    pub anchor_penalty: Option<f64>,
    /// With on-policy replay (`optim.replay_weight`): the share of the step's pm positions that
    /// were cycle starts of the greedy walk ([`crate::replay`]). `loss` includes the replay term.
    pub replay_starts: Option<f64>,
}

/// The replicas (each with its weights and optimizer) and how their gradients are summed.
pub struct Trainer<B: AutodiffBackend> {
    replicas: Vec<Replica<B>>,
    all_reduce: Arc<dyn AllReduce<B::InnerBackend>>,
    ttt: TttOptions,
    loss: LossKind,
    max_grad_norm: f64,
    /// λ of the L2-SP anchor (0: none; [`Trainer::with_anchor`]).
    anchor_weight: f64,
    /// β of on-policy replay (0: none; [`Trainer::with_replay`]).
    replay_weight: f64,
    /// Activation dtype of the forward (the weights stay f32; see [`Trainer::with_compute_dtype`]).
    compute: DType,
    /// Each training sample's full-vocabulary teacher statistics after its first step, so the
    /// later epochs skip the pass over the whole target head (computed per sequence, so the bits
    /// do not depend on the batch a sample first came in, and a resumed run recomputes the same).
    vocab_stats: VocabStatsCache,
}

struct Prepared<B: AutodiffBackend> {
    batch: TttBatch<B>,
    masks: BatchMasks,
    labels: Vec<String>,
}

struct ReplicaOut {
    grads: Option<GradientsParams>,
    sums: TttSums,
    loss: f64,
    /// Cycle starts and pm positions of the replay walks (0 without replay).
    replay: (f64, f64),
}

fn lift<B: AutodiffBackend>(b: TttBatch<B::InnerBackend>) -> TttBatch<B> {
    TttBatch {
        input_ids: Tensor::from_inner(b.input_ids),
        loss_mask: Tensor::from_inner(b.loss_mask),
        valid: Tensor::from_inner(b.valid),
        aux: Tensor::from_inner(b.aux),
        teacher: TeacherTargets {
            p: Tensor::from_inner(b.teacher.p),
            pf: Tensor::from_inner(b.teacher.pf),
            in_draft: Tensor::from_inner(b.teacher.in_draft),
        },
    }
}

impl<B: AutodiffBackend> Trainer<B> {
    /// `model` must carry stable parameter ids ([`crate::grads::with_stable_ids`]) and live on
    /// `heads[0].0`; one replica per `(device, head)`: the first holds `model`, the others a copy
    /// made through host memory ([`copy_model`]). Gradients are summed by [`HostExchange`] unless
    /// [`Self::with_all_reduce`] says otherwise.
    pub fn new(
        model: Drafter<B>,
        devices: Vec<DeviceHead<B>>,
        ttt: TttOptions,
        loss: LossKind,
        optim: &OptimConfig,
    ) -> Result<Self> {
        ttt.validate()?;
        if devices.is_empty() {
            return Err(Error::Options("no device to train on".into()));
        }
        let mut replicas = Vec::with_capacity(devices.len());
        for (r, (device, head)) in devices.into_iter().enumerate() {
            let copy = if r == 0 { model.clone() } else { copy_model(&model, &device)? };
            replicas.push(Replica { device, head, model: Some(copy), optim: adamw(optim), anchor: None });
        }
        Ok(Self {
            replicas,
            all_reduce: Arc::new(HostExchange),
            ttt,
            loss,
            max_grad_norm: optim.max_grad_norm,
            anchor_weight: 0.0,
            replay_weight: 0.0,
            compute: DType::F32,
            vocab_stats: VocabStatsCache::new(),
        })
    }

    /// Run the forward in `dtype` over the f32 master weights (burn has no autocast): the aux
    /// features enter as `dtype`, every layer casts its weights to its input's dtype, norms,
    /// softmax and the loss reduce in f32, and gradients flow back through the casts to the f32
    /// weights, which AdamW updates in f32.
    pub fn with_compute_dtype(mut self, dtype: DType) -> Self {
        self.compute = dtype;
        self
    }

    /// Anchor every step to `warm_start`'s weights with L2-SP weight `weight` ([`crate::anchor`]):
    /// each replica keeps its own copy of them (made through host memory, as the replicas'
    /// weights are). `warm_start` must carry the stable parameter ids; a weight of 0 anchors
    /// nothing.
    pub fn with_anchor(mut self, weight: f64, warm_start: &Drafter<B>) -> Result<Self> {
        if weight == 0.0 {
            return Ok(self);
        }
        for (r, rep) in self.replicas.iter_mut().enumerate() {
            let own = if r == 0 { warm_start.clone() } else { copy_model(warm_start, &rep.device)? };
            rep.anchor = Some(anchor_of(&own));
        }
        self.anchor_weight = weight;
        Ok(self)
    }

    /// Add on-policy replay with weight `weight` to the soft-CE ([`crate::replay`]); 0 adds
    /// nothing and computes nothing. The TV and LK objectives take no replay.
    pub fn with_replay(mut self, weight: f64) -> Result<Self> {
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(Error::Options(format!("replay weight {weight}: must be a non-negative number")));
        }
        if weight > 0.0 && self.loss != LossKind::SoftCe {
            return Err(Error::Options(format!(
                "on-policy replay (optim.replay_weight) extends the soft_ce objective, not {:?}",
                self.loss
            )));
        }
        self.replay_weight = weight;
        Ok(self)
    }

    /// Sum the replicas' gradients with `all_reduce` (e.g. [`crate::collective::Nccl`] on CUDA).
    pub fn with_all_reduce(mut self, all_reduce: Arc<dyn AllReduce<B::InnerBackend>>) -> Self {
        self.all_reduce = all_reduce;
        self
    }

    /// The name of the all-reduce in use (`host`, `nccl`).
    pub fn all_reduce_name(&self) -> &'static str {
        self.all_reduce.name()
    }

    /// The current weights (the main device's replica; every replica holds the same).
    pub fn model(&self) -> &Drafter<B> {
        self.replicas[0].model()
    }

    /// The replicas (the first is the main device).
    pub fn replicas(&self) -> &[Replica<B>] {
        &self.replicas
    }

    /// The optimizer state (the main device's replica; every replica holds the same), for
    /// checkpoints.
    pub fn optimizer_record(&self) -> OptimRecord<B> {
        self.replicas[0].optim.to_record()
    }

    /// Restore optimizer state saved by [`Self::optimizer_record`] (on the main device) into
    /// every replica, the others getting a copy made through host memory ([`copy_record`]).
    pub fn load_optimizer_record(&mut self, record: OptimRecord<B>) {
        for (r, rep) in self.replicas.iter_mut().enumerate() {
            let own = if r == 0 { record.clone() } else { copy_record::<B, _>(record.clone(), &rep.device) };
            let optim = std::mem::replace(&mut rep.optim, adamw(&OptimConfig::default()));
            rep.optim = optim.load_record(own);
        }
    }

    /// One thread per replica when they are on distinct devices.
    fn parallel(&self) -> bool {
        self.replicas.iter().any(|r| r.device != self.replicas[0].device)
    }

    /// Collate micro-batch j on replica j mod R.
    fn prepare<'a>(&self, micro: Vec<MicroInput<'a>>) -> Result<Vec<Vec<Prepared<B>>>> {
        let r = self.replicas.len();
        let mut per: Vec<Vec<MicroInput<'a>>> = (0..r).map(|_| Vec::new()).collect();
        for (j, m) in micro.into_iter().enumerate() {
            per[j % r].push(m);
        }
        let cfg = self.model().config();
        let vocab = self.model().vocab();
        let work = |(rep, inputs): (&Replica<B>, Vec<MicroInput<'a>>)| -> Result<Vec<Prepared<B>>> {
            let teacher = match &rep.head {
                Some(h) => TeacherSource::CachedHead(h, &self.vocab_stats),
                None => TeacherSource::TopK,
            };
            inputs
                .into_iter()
                .map(|m| {
                    let mut batch =
                        lift::<B>(collate::<B::InnerBackend>(&m.samples, cfg, vocab, &teacher, &rep.device)?);
                    if batch.aux.dtype() != self.compute {
                        batch.aux = batch.aux.cast(self.compute);
                    }
                    let masks = BatchMasks::of(&batch);
                    Ok(Prepared { batch, masks, labels: m.labels })
                })
                .collect()
        };
        let jobs: Vec<_> = self.replicas.iter().zip(per).collect();
        per_replica(self.parallel(), jobs, work).into_iter().collect()
    }

    /// Forward and backward every micro-batch of one replica; gradients stay on its device.
    fn run_replica(
        &self,
        rep: &Replica<B>,
        batches: Vec<Prepared<B>>,
        norm: &Normalisers,
        step: u64,
    ) -> Result<ReplicaOut> {
        let model = rep.model();
        let mut out = ReplicaOut { grads: None, sums: TttSums::default(), loss: 0.0, replay: (0.0, 0.0) };
        for p in batches {
            let (fwd, loss) = autodiff::record(|| -> Result<_> {
                let fwd = ttt_forward(model, &p.batch, &self.ttt)?;
                // The walk reads this forward's hits: on-policy, no second forward.
                let replay = (self.replay_weight > 0.0).then(|| Replay::of(&fwd, &p.masks));
                if let Some(r) = &replay {
                    out.replay.0 += r.starts;
                    out.replay.1 += r.pm_positions;
                }
                let extra = replay
                    .as_ref()
                    .and_then(|r| r.term(&fwd, &self.ttt.step_weights, norm.positions, self.replay_weight));
                let loss = micro_loss(self.loss, &fwd, &p.batch, &p.masks, norm, &self.ttt.step_weights, extra);
                Ok((fwd, loss))
            })?;
            let value = loss.clone().into_scalar().elem::<f64>();
            if !value.is_finite() {
                return Err(Error::NonFinite { step, what: "loss", value, samples: p.labels, last_checkpoint: None });
            }
            out.loss += value;
            out.sums.add(&fwd);
            let mut grads = GradientsParams::from_grads(autodiff::backward(loss), model);
            make_contiguous(model, &mut grads);
            match out.grads.as_mut() {
                None => out.grads = Some(grads),
                Some(acc) => accumulate(model, acc, grads, &rep.device),
            }
        }
        Ok(out)
    }

    /// Forward and backward the micro-batches of one step, then the all-reduce: every replica's
    /// copy of the summed gradient of the step objective, unclipped (`report.grad_norm` is left
    /// 0). `step` (1-based) names the step in errors.
    fn summed_gradients(&self, micro: Vec<MicroInput<'_>>, step: u64) -> Result<(Vec<GradientsParams>, StepReport)> {
        if micro.is_empty() {
            return Err(Error::Options(format!("step {step}: no micro-batch")));
        }
        let padded: f64 =
            micro.iter().map(|m| (m.samples.len() * m.samples.iter().map(|s| s.len()).max().unwrap_or(0)) as f64).sum();
        let prepared = self.prepare(micro)?;
        let masks: Vec<&BatchMasks> = prepared.iter().flatten().map(|p| &p.masks).collect();
        let norm = Normalisers::of(&masks, self.ttt.ttt_length);

        let jobs: Vec<_> = self.replicas.iter().zip(prepared).collect();
        let outs = per_replica(self.parallel(), jobs, |(rep, b)| self.run_replica(rep, b, &norm, step));

        // Every replica's error is known before the all-reduce starts: a collective that one rank
        // never joins would wait for it forever.
        let mut report = StepReport { positions: norm.positions, padded_tokens: padded, ..StepReport::default() };
        let mut local = Vec::with_capacity(outs.len());
        let mut replay = (0.0, 0.0);
        for out in outs {
            let o = out?;
            report.loss += o.loss;
            replay = (replay.0 + o.replay.0, replay.1 + o.replay.1);
            merge_sums(&mut report.sums, &o.sums);
            local.push(o.grads);
        }
        if self.replay_weight > 0.0 {
            report.replay_starts = Some(if replay.1 > 0.0 { replay.0 / replay.1 } else { 0.0 });
        }
        let devices: Vec<B::Device> = self.replicas.iter().map(|r| r.device.clone()).collect();
        let summed = all_reduce_grads(self.all_reduce.as_ref(), self.model(), &devices, local)
            .map_err(|message| Error::Collective { step, via: self.all_reduce.name(), message })?;
        Ok((summed, report))
    }

    /// The summed gradient of one step's micro-batches as the main device's replica receives it
    /// from the all-reduce (the objective's alone: an L2-SP anchor's pull is added by
    /// [`Self::step`]), unclipped (`report.grad_norm` is left 0). `step` (1-based) names the
    /// step in errors.
    pub fn gradients(&self, micro: Vec<MicroInput<'_>>, step: u64) -> Result<(GradientsParams, StepReport)> {
        let (mut summed, report) = self.summed_gradients(micro, step)?;
        Ok((summed.swap_remove(0), report))
    }

    /// One optimizer step over `micro` at learning rate `lr`: the summed gradients, plus the
    /// anchor's pull when there is one, then on every replica global-norm clipping and AdamW (identical inputs, so identical weights after).
    ///
    /// The clip factor is computed ONCE, from the global norm of the all-reduced gradient as the
    /// main replica holds it, and every replica scales by that same number: a norm reduced on
    /// each device (its own kernels, on CUDA its own autotuned ones) could round differently
    /// and drift the replicas apart. [`Self::check_replicas_agree`] checks they did not, before
    /// each checkpoint.
    pub fn step(&mut self, micro: Vec<MicroInput<'_>>, lr: f64, step: u64) -> Result<StepReport> {
        let all_labels: Vec<String> = micro.iter().flat_map(|m| m.labels.iter().cloned()).collect();
        let (mut summed, mut report) = self.summed_gradients(micro, step)?;
        if self.anchor_weight > 0.0 {
            // Once per step, after the all-reduce: every replica adds the same pull to the same
            // summed gradient (the penalty is read back on the main replica only).
            for (r, (rep, grads)) in self.replicas.iter().zip(summed.iter_mut()).enumerate() {
                if let Some(anchor) = &rep.anchor {
                    let penalty = add_pull(rep.model(), anchor, self.anchor_weight, grads, r == 0);
                    if r == 0 {
                        report.anchor_penalty = Some(penalty);
                    }
                }
            }
        }
        let norm = global_norm(self.replicas[0].model(), &summed[0]);
        let factor = clip_factor(norm, self.max_grad_norm);
        let update = |(rep, mut grads): (&mut Replica<B>, GradientsParams)| {
            if let Some(f) = factor {
                scale_grads(rep.model(), &mut grads, f);
            }
            // A non-finite norm leaves the weights as they were (on every replica: one norm).
            if norm.is_finite() {
                let model = rep.model.take().expect("model present between steps");
                rep.model = Some(autodiff::record(|| rep.optim.step(lr, model, grads)));
            }
        };
        let parallel = self.parallel();
        let jobs: Vec<_> = self.replicas.iter_mut().zip(summed).collect();
        per_replica(parallel, jobs, update);
        report.grad_norm = norm;
        if !report.grad_norm.is_finite() {
            return Err(Error::NonFinite {
                step,
                what: "grad_norm",
                value: report.grad_norm,
                samples: all_labels,
                last_checkpoint: None,
            });
        }
        Ok(report)
    }

    /// A checksum of each replica's weights ([`weights_checksum`]), in replica order.
    pub fn replica_checksums(&self) -> Vec<u64> {
        self.replicas.iter().map(|r| weights_checksum(r.model())).collect()
    }

    /// That every replica holds the main replica's weights, bit for bit (compared by checksum):
    /// an error naming the replicas (and their devices) that differ. One replica: nothing to
    /// compare, nothing read.
    pub fn check_replicas_agree(&self) -> std::result::Result<(), String> {
        if self.replicas.len() < 2 {
            return Ok(());
        }
        let sums = self.replica_checksums();
        let differ: Vec<String> = sums
            .iter()
            .enumerate()
            .skip(1)
            .filter(|&(_, s)| *s != sums[0])
            .map(|(r, s)| format!("replica {r} ({:?}, checksum {s:016x})", self.replicas[r].device))
            .collect();
        if differ.is_empty() {
            return Ok(());
        }
        Err(format!(
            "the data-parallel replicas' weights differ: {} against replica 0 ({:?}, checksum {:016x}). Every \
             replica should hold the same weights after each step; the replicas drifted apart (a device's \
             arithmetic differs), so no checkpoint of them is written",
            differ.join(", "),
            self.replicas[0].device,
            sums[0]
        ))
    }

    /// The current weights without autodiff (for evaluation).
    pub fn valid(&self) -> Drafter<B::InnerBackend> {
        self.model().valid()
    }
}

/// Add `b`'s sums into `a`.
pub fn merge_sums(a: &mut TttSums, b: &TttSums) {
    for (x, y) in [
        (&mut a.ce, &b.ce),
        (&mut a.correct, &b.correct),
        (&mut a.m_count, &b.m_count),
        (&mut a.pm_count, &b.pm_count),
        (&mut a.alpha, &b.alpha),
    ] {
        if x.len() < y.len() {
            x.resize(y.len(), 0.0);
        }
        for (xi, yi) in x.iter_mut().zip(y) {
            *xi += yi;
        }
    }
    a.positions += b.positions;
}
