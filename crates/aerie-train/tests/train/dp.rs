//! Data parallelism: a step split over two replicas equals the one-replica step on the union
//! batch, to float tolerance (the sums are associated differently, nothing else changes), and the
//! replicas' gradients are summed through the all-reduce seam (`aerie_train::collective`), here
//! its host-memory exchange on two flex replicas (`cpu,cpu`).
//!
//! Tolerances: the loss and every parameter's gradient agree within 1e-5 relative (gradient
//! tensors compared by ‖g₁ - g₂‖ / ‖g₁‖). After one AdamW step at lr 1e-3 the weights agree within
//! 1e-5 absolute (1% of lr): Adam's first update g/(|g| + ε) turns the rounding of gradients that
//! nearly cancel (|g| ~ ε = 1e-8) into differences of a fraction of lr. Where every replica runs
//! one micro-batch of the step, the exchange adds the replicas' gradients in the order one device
//! accumulates the same micro-batches (g₀ + g₁), so weights are compared bit for bit there.

use aerie_data::shard::ShardDataset;
use aerie_model::checkpoint::{Dtype, load_target_head};
use aerie_model::{Drafter, TargetHead};
use aerie_train::collective::{AllReduce, HostExchange};
use aerie_train::config::{LossKind, OptimConfig};
use aerie_train::grads::with_stable_ids;
use aerie_train::init::{fresh_config, read_vocab_file};
use aerie_train::step::{MicroInput, Trainer};
use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::*;

fn trainer(w: &World, replicas: usize, loss: LossKind) -> Trainer<B> {
    let vocab = read_vocab_file(&w.vocab, None).unwrap();
    let dc = fresh_config(&w.target_dir, &vocab, &Default::default()).unwrap();
    let embed = aerie_model::checkpoint::HostTensor::from_f32(vec![V, H], &w.embed, Dtype::F32);
    let tensors = aerie_model::init::init_tensors(&dc, &vocab, Some(embed), 5);
    let model = with_stable_ids(Drafter::<B>::from_tensors(&dc, &tensors, &cpu()).unwrap()).unwrap();
    let head = load_target_head(&w.target_file).unwrap();
    let wt = Tensor::<burn::backend::Flex, 2>::from_data(TensorData::new(head.to_f32("h").unwrap(), [V, H]), &cpu());
    let head = TargetHead::new(wt, model.vocab(), 64);
    let optim = OptimConfig { lr: 1e-3, ..OptimConfig::default() };
    let devices = (0..replicas).map(|_| (cpu(), Some(head.clone()))).collect();
    Trainer::new(model, devices, aerie_model::TttOptions::default(), loss, &optim).unwrap()
}

fn micro<'a>(data: &'a ShardDataset, idx: &[usize]) -> MicroInput<'a> {
    MicroInput {
        samples: idx.iter().map(|&i| data.sample(i).unwrap()).collect(),
        labels: idx.iter().map(|i| format!("#{i}")).collect(),
    }
}

fn weights(t: &Trainer<B>) -> Vec<(String, Vec<f32>)> {
    replica_weights(t, 0)
}

fn replica_weights(t: &Trainer<B>, r: usize) -> Vec<(String, Vec<f32>)> {
    use burn::module::AutodiffModule;
    let model = t.replicas()[r].model().valid();
    model.to_tensors(Dtype::F32).into_iter().map(|(k, v)| (k, v.to_f32("w").unwrap_or_default())).collect()
}

fn bits(w: &[(String, Vec<f32>)]) -> Vec<(String, Vec<u32>)> {
    w.iter().map(|(k, v)| (k.clone(), v.iter().map(|x| x.to_bits()).collect())).collect()
}

/// The host exchange, counting its calls and the ranks of each, or failing on demand: shows that
/// the step's gradient sum goes through the seam.
#[derive(Debug, Default)]
struct Counting {
    calls: AtomicUsize,
    ranks: AtomicUsize,
    fail: bool,
}

impl AllReduce<Flex> for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn sum(
        &self,
        devices: &[burn::backend::flex::FlexDevice],
        per_rank: Vec<Vec<Tensor<Flex, 1>>>,
    ) -> Result<Vec<Vec<Tensor<Flex, 1>>>, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.ranks.store(per_rank.len(), Ordering::SeqCst);
        if self.fail {
            return Err("a rank went away".into());
        }
        HostExchange.sum(devices, per_rank)
    }
}

fn grad_vec(t: &Trainer<B>, g: &burn::optim::GradientsParams) -> Vec<(String, Vec<f32>)> {
    let keys = aerie_model::drafter::trainable_keys(t.model().config());
    keys.into_iter()
        .enumerate()
        .map(|(i, k)| {
            let id = burn::module::ParamId::from(i as u64 + 1);
            let v: Vec<f32> = if k.ends_with("norm.weight") {
                g.get::<burn::backend::Flex, 1>(id).unwrap().into_data().into_vec().unwrap()
            } else {
                g.get::<burn::backend::Flex, 2>(id).unwrap().into_data().into_vec().unwrap()
            };
            (k, v)
        })
        .collect()
}

#[test]
fn two_replica_step_equals_the_doubled_batch_step() {
    let w = world();
    let data = ShardDataset::open(&w.train).unwrap();
    for loss in [LossKind::SoftCe, LossKind::Tv, LossKind::Lk] {
        let mut one = trainer(&w, 1, loss);
        let mut two = trainer(&w, 2, loss);
        let union = || vec![micro(&data, &[0, 1, 2, 3])];
        let split = || vec![micro(&data, &[0, 1]), micro(&data, &[2, 3])];
        let (g1, r1) = one.gradients(union(), 1).unwrap();
        let (g2, r2) = two.gradients(split(), 1).unwrap();
        let rel = |a: f64, b: f64| (a - b).abs() / a.abs().max(1e-12);
        assert!(rel(r1.loss, r2.loss) < 1e-5, "{loss:?}: loss {} vs {}", r1.loss, r2.loss);
        assert_eq!(r1.positions, r2.positions);
        for ((k, a), (_, b)) in grad_vec(&one, &g1).iter().zip(grad_vec(&two, &g2)) {
            let norm: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            let diff: f64 = a.iter().zip(&b).map(|(&x, &y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
            assert!(norm > 0.0, "{loss:?}: no gradient for {k}");
            assert!(diff <= 1e-5 * norm, "{loss:?}: gradient of {k} differs by {diff:e} (norm {norm:e})");
        }
        let r1 = one.step(union(), 1e-3, 1).unwrap();
        let r2 = two.step(split(), 1e-3, 1).unwrap();
        assert!(rel(r1.grad_norm, r2.grad_norm) < 1e-5, "{loss:?}: grad norm {} vs {}", r1.grad_norm, r2.grad_norm);
        let (w1, w2) = (weights(&one), weights(&two));
        let mut worst = 0f32;
        for ((k1, a), (k2, b)) in w1.iter().zip(&w2) {
            assert_eq!(k1, k2);
            for (x, y) in a.iter().zip(b) {
                worst = worst.max((x - y).abs());
            }
        }
        assert!(worst < 1e-5, "{loss:?}: weights differ by up to {worst}");
        let before = trainer(&w, 1, loss);
        let moved = weights(&before).iter().zip(&w1).any(|((_, a), (_, b))| a != b);
        assert!(moved, "{loss:?}: the step changed no weight");
    }
}

#[test]
fn two_devices_through_train_match_grad_accumulation() {
    // Same micro-batch plan: 2 replicas × 1 micro-batch per step == 1 replica × 2 accumulated, bit
    // for bit (the exchange adds g₀ + g₁ as the one device does); 2 replicas × 2 micro-batches
    // vs 1 replica × 4 associate the four gradients differently: within 1e-5.
    let w = world();
    let compare = |a: &aerie_train::Summary, b: &aerie_train::Summary| -> f32 {
        let (ta, tb) = (tensors(a.final_checkpoint.as_ref().unwrap()), tensors(b.final_checkpoint.as_ref().unwrap()));
        let mut worst = 0f32;
        for ((na, ba), (nb, bb)) in ta.iter().zip(&tb) {
            assert_eq!(na, nb);
            if na == "d2t" || na == "t2d" {
                assert_eq!(ba, bb);
                continue;
            }
            for (x, y) in f32s(ba).iter().zip(f32s(bb)) {
                worst = worst.max((x - y).abs());
            }
        }
        worst
    };
    let acc2 = run(&config(&w, "acc2", "", "max_steps = 3\ngrad_accumulation = 2"), 1, None).unwrap();
    let dp2 = run(&config(&w, "dp2", "", "max_steps = 3\ngrad_accumulation = 1"), 2, None).unwrap();
    assert!(dp2.notes.iter().any(|n| n == "2 replicas, gradients summed by the host all-reduce"), "{:?}", dp2.notes);
    let worst = compare(&acc2, &dp2);
    assert!(worst == 0.0, "2 replicas × 1 vs 1 × 2: weights differ by up to {worst}");
    let acc4 = run(&config(&w, "acc4", "", "max_steps = 2\ngrad_accumulation = 4"), 1, None).unwrap();
    let dp22 = run(&config(&w, "dp22", "", "max_steps = 2\ngrad_accumulation = 2"), 2, None).unwrap();
    let worst = compare(&acc4, &dp22);
    assert!(worst < 1e-5, "2 replicas × 2 vs 1 × 4: weights differ by up to {worst}");
}

#[test]
fn two_replica_resume_is_bit_identical() {
    // `cpu,cpu`: stopped after step 3 (checkpoint at 2) and resumed on two replicas, the final
    // weights equal an uninterrupted two-replica run's bit for bit (every replica reloads the
    // main replica's AdamW state).
    let w = world();
    let body = "max_steps = 5\ngrad_accumulation = 1";
    let straight = run(&config(&w, "straight", "save_every = 2", body), 2, None).unwrap();
    let broken = config(&w, "broken", "save_every = 2", body);
    assert_eq!(run_until_on(&broken, 2, 3).steps, 3);
    let resumed = run(&broken, 2, Some(&broken.output_dir)).unwrap();
    assert!(resumed.resumed_from.as_ref().unwrap().ends_with("checkpoint-2"), "{:?}", resumed.resumed_from);
    assert_eq!(resumed.steps, 5);
    assert!(
        tensors(straight.final_checkpoint.as_ref().unwrap()) == tensors(resumed.final_checkpoint.as_ref().unwrap()),
        "two-replica resume changed the final weights"
    );
}

#[test]
fn replicas_step_in_lockstep_through_the_all_reduce_seam() {
    // Three steps of two micro-batches: one replica accumulating both, two replicas one each
    // through the counting exchange. Same weights bit for bit, on both replicas.
    let w = world();
    let data = ShardDataset::open(&w.train).unwrap();
    let mut one = trainer(&w, 1, LossKind::SoftCe);
    let seam = Arc::new(Counting::default());
    let mut two = trainer(&w, 2, LossKind::SoftCe).with_all_reduce(seam.clone());
    assert_eq!(two.all_reduce_name(), "counting");
    // Replica 1 starts from a copy made through host memory (`collective::copy_model`): exact.
    assert!(bits(&replica_weights(&two, 0)) == bits(&replica_weights(&two, 1)), "replica 1's starting copy differs");
    let steps = [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]];
    for (i, [a, b]) in steps.iter().enumerate() {
        let step = i as u64 + 1;
        let r1 = one.step(vec![micro(&data, a), micro(&data, b)], 1e-3, step).unwrap();
        let r2 = two.step(vec![micro(&data, a), micro(&data, b)], 1e-3, step).unwrap();
        assert_eq!(r1.grad_norm.to_bits(), r2.grad_norm.to_bits(), "step {step}: grad norm");
        assert_eq!(seam.calls.load(Ordering::SeqCst), i + 1, "one all-reduce per step");
        assert_eq!(seam.ranks.load(Ordering::SeqCst), 2);
    }
    let (w1, w2a, w2b) = (bits(&weights(&one)), bits(&replica_weights(&two, 0)), bits(&replica_weights(&two, 1)));
    assert!(w2a == w2b, "the two replicas' weights differ after 3 steps");
    assert!(w1 == w2a, "two replicas differ from one replica accumulating the same micro-batches");

    // A replica without a micro-batch adds zeros: the same gradient as one replica's.
    let (g1, _) = one.gradients(vec![micro(&data, &[12, 13])], 4).unwrap();
    let (g2, _) = two.gradients(vec![micro(&data, &[12, 13])], 4).unwrap();
    for ((k, a), (_, b)) in grad_vec(&one, &g1).iter().zip(grad_vec(&two, &g2)) {
        assert!(*a == b, "gradient of {k} with an idle replica");
    }

    // A failing all-reduce stops the step with the step and the seam named, weights untouched.
    let broken = Arc::new(Counting { fail: true, ..Counting::default() });
    let mut bad = trainer(&w, 2, LossKind::SoftCe).with_all_reduce(broken);
    let before = bits(&weights(&bad));
    let e = bad.step(vec![micro(&data, &[0, 1]), micro(&data, &[2, 3])], 1e-3, 7).unwrap_err().to_string();
    assert!(e.contains("step 7") && e.contains("counting all-reduce") && e.contains("a rank went away"), "{e}");
    assert!(before == bits(&weights(&bad)), "a failed step changed the weights");
}

/// The host exchange, except that rank 1 receives twice the sum: a replica whose copy of the
/// gradient drifted (on CUDA, a device whose autotuned kernels round differently).
#[derive(Debug, Default)]
struct Drifting;

impl AllReduce<Flex> for Drifting {
    fn name(&self) -> &'static str {
        "drifting"
    }

    fn sum(
        &self,
        devices: &[burn::backend::flex::FlexDevice],
        per_rank: Vec<Vec<Tensor<Flex, 1>>>,
    ) -> Result<Vec<Vec<Tensor<Flex, 1>>>, String> {
        let mut out = HostExchange.sum(devices, per_rank)?;
        out[1] = out[1].drain(..).map(|t| t.mul_scalar(2.0)).collect();
        Ok(out)
    }
}

/// One clip factor for every replica, computed once from the main replica's all-reduced
/// gradient: with clipping active, a replica handed twice the gradient is NOT renormalised back
/// to the others' (its own norm would give it half the factor and hide the drift), so replica 0
/// steps exactly as one device does and replica 1 moves apart; and a checkpoint save then
/// refuses, naming the replicas that differ, before writing anything.
#[test]
fn replicas_share_one_clip_factor_and_a_save_refuses_replicas_that_differ() {
    let w = world();
    let data = ShardDataset::open(&w.train).unwrap();
    let split = || vec![micro(&data, &[0, 1]), micro(&data, &[2, 3])];
    let mut one = trainer(&w, 1, LossKind::SoftCe);
    let r1 = one.step(split(), 1e-3, 1).unwrap();
    assert!(r1.grad_norm > 0.5, "the clip (max_grad_norm 0.5) must be active here: norm {}", r1.grad_norm);

    // Replicas in step agree, and the check says so.
    let mut two = trainer(&w, 2, LossKind::SoftCe);
    two.step(split(), 1e-3, 1).unwrap();
    let sums = two.replica_checksums();
    assert_eq!(sums[0], sums[1]);
    two.check_replicas_agree().unwrap();

    let mut drift = trainer(&w, 2, LossKind::SoftCe).with_all_reduce(Arc::new(Drifting));
    let r2 = drift.step(split(), 1e-3, 1).unwrap();
    assert_eq!(r1.grad_norm.to_bits(), r2.grad_norm.to_bits(), "the norm is the main replica's");
    assert!(bits(&weights(&one)) == bits(&replica_weights(&drift, 0)), "replica 0 steps as one device does");
    assert!(
        bits(&replica_weights(&drift, 0)) != bits(&replica_weights(&drift, 1)),
        "replica 1 was clipped by a factor of its own (its gradient renormalised to the others')"
    );
    let e = drift.check_replicas_agree().unwrap_err();
    assert!(e.contains("replica 1") && e.contains("replica 0") && e.contains("differ"), "{e}");

    // The save refuses before writing anything.
    let run = tempfile::tempdir().unwrap();
    let state = aerie_train::checkpoint::TrainingState {
        format: aerie_train::checkpoint::STATE_FORMAT.into(),
        step: 1,
        epoch: 0,
        cursor: 2,
        epoch_rng_state: 0,
        total_steps: 1,
        micro_per_step: 2,
        config_hash: String::new(),
        tokens: 0.0,
        padded_tokens: 0.0,
        elapsed_s: 0.0,
        aerie_version: String::new(),
        data: Vec::new(),
        anchor_checksum: None,
    };
    let e = aerie_train::checkpoint::save(run.path(), &drift, &state, "", None).unwrap_err().to_string();
    assert!(e.contains("checkpoint-1") && e.contains("replica 1"), "{e}");
    assert_eq!(std::fs::read_dir(run.path()).unwrap().count(), 0, "the refused save wrote files");
}
