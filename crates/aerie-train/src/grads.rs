//! Gradient plumbing burn does not provide in the form training needs:
//!
//! - stable parameter ids: burn draws a random [`ParamId`] per parameter, and the optimizer's
//!   state is keyed by it; a resumed run rebuilds the drafter from its checkpoint, so ids are set
//!   from the canonical tensor name instead (`fc.weight` → its position in
//!   [`aerie_model::drafter::trainable_keys`]);
//! - summing the [`GradientsParams`] of one replica's micro-batches (across replicas: [`crate::collective`]);
//! - the GLOBAL gradient norm and PyTorch `clip_grad_norm_` rescaling (burn's optimizer clipping
//!   is per tensor, burn.md "Traps");
//! - row-major gradients for the CPU backend's element-wise ops.

use aerie_model::Drafter;
use aerie_model::drafter::trainable_keys;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};

use crate::{Error, Result};

struct StableIds {
    stack: Vec<String>,
    keys: Vec<String>,
    unknown: Vec<String>,
}

impl<B: Backend> ModuleMapper<B> for StableIds {
    // An enum module (the drafter layer's `Attention`) enters its variant (`Gqa`, `Mla`) as a
    // level of its own; canonical names have no such level.
    fn enter_module(&mut self, name: &str, container_type: &str) {
        if !container_type.starts_with("Enum:") {
            self.stack.push(name.to_string());
        }
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        if !container_type.starts_with("Enum:") {
            self.stack.pop();
        }
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let path = self.stack.join(".");
        let (id, tensor, mapper) = param.consume();
        let id = match self.keys.iter().position(|k| *k == path) {
            Some(i) => ParamId::from(i as u64 + 1),
            None => {
                self.unknown.push(path);
                id
            }
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Give every trainable parameter the id of its canonical name, so optimizer state saved by one
/// process applies to the drafter rebuilt by another.
pub fn with_stable_ids<B: Backend>(drafter: Drafter<B>) -> Result<Drafter<B>> {
    let keys = trainable_keys(drafter.config());
    let mut mapper = StableIds { stack: Vec::new(), keys, unknown: Vec::new() };
    let drafter = drafter.map(&mut mapper);
    if mapper.unknown.is_empty() {
        Ok(drafter)
    } else {
        Err(Error::Options(format!("internal: drafter parameters without a canonical name: {:?}", mapper.unknown)))
    }
}

/// Adds `from` into `into` for every parameter of the visited module, moving `from`'s tensors to
/// `device`.
struct Accumulate<'a, B: AutodiffBackend> {
    into: &'a mut GradientsParams,
    from: GradientsParams,
    device: B::Device,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Accumulate<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(g) = self.from.remove::<B::InnerBackend, D>(param.id) else { return };
        let g = g.to_device(&self.device);
        let sum = match self.into.remove::<B::InnerBackend, D>(param.id) {
            Some(acc) => acc + g,
            None => g,
        };
        self.into.register(param.id, sum);
    }
}

/// `into += from` over `model`'s parameters, on `device`.
pub fn accumulate<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    into: &mut GradientsParams,
    from: GradientsParams,
    device: &B::Device,
) {
    model.visit(&mut Accumulate::<B> { into, from, device: device.clone() });
}

struct Contiguous<'a> {
    grads: &'a mut GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Contiguous<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, aerie_model::kernels::contiguous(g));
        }
    }
}

/// Lay every gradient out in row-major order (see [`aerie_model::kernels::contiguous`]: the
/// gradients of transposed weights are strided views, which make every later element-wise op on
/// the CPU slow). The values are unchanged.
pub fn make_contiguous<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, grads: &mut GradientsParams) {
    model.visit(&mut Contiguous { grads });
}

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    total: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            // Rows first: burn-flex reduces a whole tensor of more than 64K elements in rayon
            // chunks whose combination order is not fixed; per-row sums are sequential, and the
            // row count stays under one chunk for every drafter tensor.
            self.total += g.square().sum_dim(D - 1).sum().into_scalar().elem::<f64>();
        }
    }
}

/// The global L2 norm over all of `model`'s gradients (one scalar per tensor summed in f64, in
/// parameter order, so it is reproducible bit for bit on the CPU).
pub fn global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, grads: &GradientsParams) -> f64 {
    let mut v = SquaredNorm { grads, total: 0.0 };
    model.visit::<SquaredNorm<'_>>(&mut v);
    v.total.sqrt()
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// PyTorch `clip_grad_norm_`: with total norm n, multiply every gradient by
/// `max_norm / (n + 1e-6)` when that is below 1. Returns n (before clipping). `max_norm` 0 only
/// measures.
pub fn clip_global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> f64 {
    let norm = global_norm::<B, M>(model, grads);
    if let Some(factor) = clip_factor(norm, max_norm) {
        scale_grads::<B, M>(model, grads, factor);
    }
    norm
}

/// PyTorch `clip_grad_norm_`'s factor for a total norm `norm`: `max_norm / (norm + 1e-6)` when
/// that is below 1, else `None` (no clipping; also for `max_norm` 0 and a non-finite norm).
/// Data parallelism computes it once, from the all-reduced gradient, and hands the same factor to
/// every replica ([`crate::step`]).
pub fn clip_factor(norm: f64, max_norm: f64) -> Option<f64> {
    let factor = max_norm / (norm + 1e-6);
    (max_norm > 0.0 && norm.is_finite() && factor < 1.0).then_some(factor)
}

/// Multiply every gradient of `model`'s parameters in `grads` by `factor`.
pub fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, grads: &mut GradientsParams, factor: f64) {
    model.visit::<Scale<'_>>(&mut Scale { grads, factor });
}

/// FNV-1a over every float parameter's f32 bits and shape, in parameter order.
struct Checksum {
    hash: u64,
}

impl Checksum {
    fn eat(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.hash ^= u64::from(b);
            self.hash = self.hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for Checksum {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        for d in t.dims() {
            self.eat(&(d as u64).to_le_bytes());
        }
        let data = t.into_data().convert::<f32>();
        let values: &[f32] = data.as_slice().expect("converted to f32");
        for v in values {
            self.eat(&v.to_bits().to_le_bytes());
        }
    }
}

/// A checksum of `model`'s weights (every float parameter's f32 bits, read through host memory
/// one tensor at a time): equal weights give equal checksums on every backend and device.
pub fn weights_checksum<B: Backend, M: Module<B>>(model: &M) -> u64 {
    let mut c = Checksum { hash: 0xcbf2_9ce4_8422_2325 };
    model.visit::<Checksum>(&mut c);
    c.hash
}
