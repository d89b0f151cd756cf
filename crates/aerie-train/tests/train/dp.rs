//! Data parallelism: a step split over two replicas equals the one-replica step on the union
//! batch, to float tolerance (the sums are associated differently, nothing else changes).
//!
//! Tolerances: the loss and every parameter's gradient agree within 1e-5 relative (gradient
//! tensors compared by ‖g₁ - g₂‖ / ‖g₁‖). After one AdamW step at lr 1e-3 the weights agree within
//! 1e-5 absolute (1% of lr): Adam's first update g/(|g| + ε) turns the rounding of gradients that
//! nearly cancel (|g| ~ ε = 1e-8) into differences of a fraction of lr.

use aerie_data::shard::ShardDataset;
use aerie_model::checkpoint::{Dtype, load_target_head};
use aerie_model::{Drafter, TargetHead};
use aerie_train::config::{LossKind, OptimConfig};
use aerie_train::grads::with_stable_ids;
use aerie_train::init::{fresh_config, read_vocab_file};
use aerie_train::step::{MicroInput, Trainer};
use burn::tensor::{Tensor, TensorData};

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
    t.valid().to_tensors(Dtype::F32).into_iter().map(|(k, v)| (k, v.to_f32("w").unwrap_or_default())).collect()
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
    // Same micro-batch plan: 2 replicas × 1 micro-batch per step == 1 replica × 2 accumulated.
    let w = world();
    let a = config(&w, "acc", "", "max_steps = 3\ngrad_accumulation = 2");
    let b = config(&w, "dp", "", "max_steps = 3\ngrad_accumulation = 1");
    let sa = run(&a, 1, None).unwrap();
    let sb = run(&b, 2, None).unwrap();
    let (ta, tb) = (tensors(sa.final_checkpoint.as_ref().unwrap()), tensors(sb.final_checkpoint.as_ref().unwrap()));
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
    assert!(worst < 1e-5, "weights differ by up to {worst}");
}
