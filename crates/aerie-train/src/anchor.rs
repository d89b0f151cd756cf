//! L2-SP anchoring (Li, Grandvalet and Davoine, "Explicit inductive bias for transfer learning
//! with convolutional networks", arXiv 1802.01483): a fine-tune from a warm start adds
//! λ/2·Σ‖θ − θ₀‖² over the drafter's trainable weights, θ₀ the warm start's, so that training on
//! a new domain pulls the drafter toward it without forgetting what it already drafts well.
//!
//! The penalty does not depend on the data, so it is not formed per micro-batch (it would be
//! counted once per micro-batch and per replica): its gradient λ·(θ − θ₀) is added ONCE to the
//! step's summed gradient, after the all-reduce and before the global-norm clip, on every replica
//! alike (the same weights, the same θ₀, the same element-wise arithmetic, so the replicas stay
//! identical). The clip then sees the gradient of the whole objective, as PyTorch's
//! `loss + penalty` followed by `clip_grad_norm_` would.
//!
//! θ₀ is not saved with checkpoints: a resumed run reloads it from the warm start, and
//! `state.json` records θ₀'s checksum so a warm start that changed on disk is refused.

use std::collections::HashMap;

use aerie_model::Drafter;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};

/// θ₀ on one device: every trainable weight, flattened, by its stable parameter id
/// ([`crate::grads::with_stable_ids`]).
#[derive(Debug, Clone)]
pub struct Anchor<B: Backend> {
    theta0: HashMap<ParamId, Tensor<B, 1>>,
}

struct Collect<B: Backend> {
    theta0: HashMap<ParamId, Tensor<B, 1>>,
}

impl<B: Backend> ModuleVisitor<B> for Collect<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        let n = t.dims().iter().product::<usize>();
        self.theta0.insert(param.id, t.reshape([n]));
    }
}

impl<B: Backend> Anchor<B> {
    /// θ₀ = `warm_start`'s weights (built with stable ids, on the device the anchor is used on).
    pub fn of(warm_start: &Drafter<B>) -> Self {
        let mut c = Collect { theta0: HashMap::new() };
        warm_start.visit(&mut c);
        Self { theta0: c.theta0 }
    }

    /// Parameters anchored.
    pub fn len(&self) -> usize {
        self.theta0.len()
    }

    /// Whether nothing is anchored.
    pub fn is_empty(&self) -> bool {
        self.theta0.is_empty()
    }
}

/// Adds `weight·(θ − θ₀)` to each anchored parameter's gradient and sums ‖θ − θ₀‖².
struct Pull<'a, B: AutodiffBackend> {
    anchor: &'a Anchor<B::InnerBackend>,
    grads: &'a mut GradientsParams,
    weight: f64,
    measure: bool,
    squared: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Pull<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(t0) = self.anchor.theta0.get(&param.id) else { return };
        let theta = param.val().inner();
        let diff = theta.clone() - t0.clone().reshape(theta.dims());
        if self.measure {
            // Rows first, then the rows' sums, in f64 across tensors: the same reproducible
            // reduction order as the global gradient norm (crate::grads).
            self.squared += diff.clone().square().sum_dim(D - 1).sum().into_scalar().elem::<f64>();
        }
        let pull = diff.mul_scalar(self.weight);
        let g = match self.grads.remove::<B::InnerBackend, D>(param.id) {
            Some(g) => g + pull,
            None => pull,
        };
        self.grads.register(param.id, g);
    }
}

/// Add the penalty's gradient `weight·(θ − θ₀)` of `model`'s current weights θ into `grads`
/// (registering it for a parameter without one). With `measure`, returns the penalty
/// `weight/2·Σ‖θ − θ₀‖²` (read back to the host, one scalar per tensor); without, 0 and no read.
pub fn add_pull<B: AutodiffBackend>(
    model: &Drafter<B>,
    anchor: &Anchor<B::InnerBackend>,
    weight: f64,
    grads: &mut GradientsParams,
    measure: bool,
) -> f64 {
    let mut v = Pull::<B> { anchor, grads, weight, measure, squared: 0.0 };
    model.visit(&mut v);
    0.5 * weight * v.squared
}

/// Σ‖θ − θ₀‖² over the anchored weights of `model` (no autodiff): how far a drafter is from its
/// warm start, for tests and reports.
pub fn squared_distance<B: Backend>(model: &Drafter<B>, anchor: &Anchor<B>) -> f64 {
    struct Dist<'a, B: Backend> {
        anchor: &'a Anchor<B>,
        total: f64,
    }
    impl<B: Backend> ModuleVisitor<B> for Dist<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(t0) = self.anchor.theta0.get(&param.id) {
                let theta = param.val();
                let diff = theta.clone() - t0.clone().reshape(theta.dims());
                self.total += diff.square().sum_dim(D - 1).sum().into_scalar().elem::<f64>();
            }
        }
    }
    let mut d = Dist { anchor, total: 0.0 };
    model.visit(&mut d);
    d.total
}

/// The anchor of a trainer's model: θ₀ taken from the inner (non-autodiff) weights.
pub fn anchor_of<B: AutodiffBackend>(warm_start: &Drafter<B>) -> Anchor<B::InnerBackend> {
    Anchor::of(&warm_start.valid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aerie_model::checkpoint::{Dtype, synthetic};
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{DType, TensorData};

    type AD = Autodiff<Flex>;

    fn drafter(seed: u64) -> Drafter<AD> {
        let cfg = synthetic::tiny_config();
        let ckpt = synthetic::random_drafter(&cfg, Dtype::F32, seed);
        let d = Drafter::<AD>::from_tensors_as(&cfg, &ckpt.tensors, &Default::default(), DType::F64).unwrap();
        crate::grads::with_stable_ids(d).unwrap()
    }

    /// `model` with entry `i` of `fc.weight` moved by `delta`.
    fn bumped(model: &Drafter<AD>, i: usize, delta: f64) -> Drafter<AD> {
        let mut d = model.clone();
        let w = d.fc.weight.val();
        let [r, c] = w.dims();
        let mut bump = vec![0f64; r * c];
        bump[i] = delta;
        let bump = Tensor::<AD, 1>::from_data(TensorData::new(bump, [r * c]), &Default::default())
            .cast(w.dtype())
            .reshape([r, c]);
        let (id, _, mapper) = d.fc.weight.consume();
        d.fc.weight = Param::from_mapped_value(id, (w + bump).detach(), mapper);
        d
    }

    /// The penalty computed on the host in f64, one element at a time (burn-flex's tensor sums
    /// round like f32 at ~1e-7 relative, too coarse for a finite difference of a ~20-sized sum).
    fn penalty(model: &Drafter<AD>, anchor: &Anchor<Flex>, weight: f64) -> f64 {
        struct Host<'a> {
            anchor: &'a Anchor<Flex>,
            total: f64,
        }
        impl ModuleVisitor<Flex> for Host<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
                let Some(t0) = self.anchor.theta0.get(&param.id) else { return };
                let a: Vec<f64> = param.val().into_data().convert::<f64>().into_vec().unwrap();
                let b: Vec<f64> = t0.clone().into_data().convert::<f64>().into_vec().unwrap();
                self.total += a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>();
            }
        }
        let mut h = Host { anchor, total: 0.0 };
        model.valid().visit(&mut h);
        0.5 * weight * h.total
    }

    #[test]
    fn the_pull_is_the_gradient_of_the_penalty_by_finite_differences() {
        let (warm, now) = (drafter(1), drafter(2));
        let anchor = anchor_of(&warm);
        assert!(!anchor.is_empty());
        let weight = 0.37;
        let mut grads = GradientsParams::new();
        let p = add_pull(&now, &anchor, weight, &mut grads, true);
        // The value logged: burn's sums against the host's, to their f32-like rounding.
        let host = penalty(&now, &anchor, weight);
        assert!((p - host).abs() <= 1e-6 * host, "{p} vs {host}");
        assert!((squared_distance(&now.valid(), &anchor) * 0.5 * weight - host).abs() <= 1e-6 * host);
        let g = grads.get::<Flex, 2>(now.fc.weight.id).expect("fc has a pull").into_data().convert::<f64>();
        let g: Vec<f64> = g.into_vec().unwrap();
        // The penalty is quadratic, so central differences have no truncation error; 2^-8 is
        // exact in f32, through which the bump passes.
        let eps = (2f64).powi(-8);
        for i in [0, 7, g.len() / 2, g.len() - 1] {
            let fd = (penalty(&bumped(&now, i, eps), &anchor, weight)
                - penalty(&bumped(&now, i, -eps), &anchor, weight))
                / (2.0 * eps);
            assert!((g[i] - fd).abs() <= 1e-6 * g[i].abs().max(fd.abs()).max(1e-3), "fc[{i}]: {} vs {fd}", g[i]);
        }
        // At θ = θ₀ the penalty and its pull vanish.
        let mut zero = GradientsParams::new();
        assert_eq!(add_pull(&warm, &anchor, weight, &mut zero, true), 0.0);
    }

    #[test]
    fn the_pull_adds_to_the_gradient_already_there() {
        let (warm, now) = (drafter(1), drafter(2));
        let anchor = anchor_of(&warm);
        let mut alone = GradientsParams::new();
        add_pull(&now, &anchor, 1.0, &mut alone, false);
        let mut grads = GradientsParams::new();
        let ones = now.fc.weight.val().inner().ones_like();
        grads.register(now.fc.weight.id, ones);
        assert_eq!(add_pull(&now, &anchor, 1.0, &mut grads, false), 0.0, "not measured");
        let a: Vec<f64> =
            alone.get::<Flex, 2>(now.fc.weight.id).unwrap().into_data().convert::<f64>().into_vec().unwrap();
        let b: Vec<f64> =
            grads.get::<Flex, 2>(now.fc.weight.id).unwrap().into_data().convert::<f64>().into_vec().unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| (x + 1.0 - y).abs() < 1e-12));
    }
}
