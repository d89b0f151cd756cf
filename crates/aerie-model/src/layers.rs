//! The building blocks of a Llama decoder layer with HF weight layouts: bias-free linear
//! (`weight` stored `[out, in]` as in the checkpoint, not burn's `[in, out]`), RMSNorm computed
//! in at least float32, and the SwiGLU MLP.

pub(crate) mod attention;
pub(crate) mod diagonal;
pub(crate) mod host;
mod matvec;
pub(crate) mod mm;
mod rms_norm;
pub(crate) mod rotary;
mod swiglu;

use burn::module::{Module, Param};
use burn::tensor::{DType, Tensor, backend::Backend};

/// The same tensor with its values in row-major memory order, on the CPU backend (other backends
/// and dtypes: returned as is).
///
/// Why: the gradient of a weight used transposed (every linear layer, see [`Linear::weight_t`])
/// comes out of autodiff as a transposed view, and burn-flex runs each later element-wise op on
/// it (the clipping norm, the clip, AdamW's moment updates) through its per-element strided
/// iterator: ≈ 10% of a quickstart training step. Training makes every gradient contiguous once.
pub fn contiguous<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    match host::Runtime::of::<B>(&[t.dtype()]) {
        Some(host::Runtime::Inference) => host::from_flex(host::flex_primitive(t).to_contiguous()),
        _ => t,
    }
}

/// Cast half-precision activations up to f32 for reductions; f32/f64 stay as they are (f64 is
/// used by the finite-difference gradient tests).
pub(crate) fn upcast<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.cast(DType::F32),
        _ => x,
    }
}

/// `y = x Wᵀ`, no bias; `weight: [out, in]` exactly as HF/SGLang store it.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[out, in]`.
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Linear<B> {
    /// Wrap an `[out, in]` weight.
    pub fn new(weight: Tensor<B, 2>) -> Self {
        Self { weight: Param::from_tensor(weight) }
    }

    /// Apply to `[.., in]` (any leading dims).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let in_features = dims[D - 1];
        let rows: usize = dims[..D - 1].iter().product();
        let w = self.weight.val();
        let [out_features, _] = w.dims();
        let w = w.cast(x.dtype());
        let y = mm::matmul(x.reshape([rows, in_features]), w.transpose());
        let mut out_dims = dims;
        out_dims[D - 1] = out_features;
        y.reshape(out_dims)
    }

    /// The weight as `[in, out]` in `dtype`, for [`Self::forward_t`]. Taking it once and reusing
    /// it over the unrolled TTT steps makes autodiff sum the steps' weight gradients on this
    /// contiguous `[in, out]` node and transpose once at the end; with [`Self::forward`] each
    /// step's gradient is added into a transposed (strided) view of `[out, in]`, which burn-flex
    /// does element by element.
    pub fn weight_t(&self, dtype: DType) -> Tensor<B, 2> {
        self.weight.val().cast(dtype).transpose()
    }

    /// [`Self::forward`] with the weight taken by [`Self::weight_t`].
    pub fn forward_t<const D: usize>(x: Tensor<B, D>, weight_t: &Tensor<B, 2>) -> Tensor<B, D> {
        let dims = x.dims();
        let in_features = dims[D - 1];
        let rows: usize = dims[..D - 1].iter().product();
        let [_, out_features] = weight_t.dims();
        let y = mm::matmul(x.reshape([rows, in_features]), weight_t.clone());
        let mut out_dims = dims;
        out_dims[D - 1] = out_features;
        y.reshape(out_dims)
    }
}

/// RMSNorm `w * x / sqrt(mean(x²) + eps)`, reduced in f32 whatever the activation dtype (one
/// fused op on the CPU backend, see `layers/rms_norm.rs`).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// `[H]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Epsilon inside the square root.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Wrap a `[H]` weight.
    pub fn new(weight: Tensor<B, 1>, eps: f64) -> Self {
        Self { weight: Param::from_tensor(weight), eps }
    }

    /// Normalise the last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        if let Some(y) = rms_norm::rms_norm(&x, &self.weight.val(), self.eps) {
            return y;
        }
        let dtype = x.dtype();
        let x = upcast(x);
        let inv_rms = x.clone().square().mean_dim(D - 1).add_scalar(self.eps).sqrt().recip();
        let w = self.weight.val().cast(x.dtype());
        let mut shape = [1; D];
        shape[D - 1] = w.dims()[0];
        (x * inv_rms * w.reshape(shape)).cast(dtype)
    }
}

/// SwiGLU: `down(silu(gate x) * up x)` (the gate fused on the CPU backend, see `layers/swiglu.rs`).
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[I, H]`.
    pub gate_proj: Linear<B>,
    /// `[I, H]`.
    pub up_proj: Linear<B>,
    /// `[H, I]`.
    pub down_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// Apply to `[.., H]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.down_proj.forward(swiglu::swiglu(self.gate_proj.forward(x.clone()), self.up_proj.forward(x)))
    }

    /// [`Self::forward`] with the weights taken by [`Linear::weight_t`] (gate, up, down).
    pub fn forward_t<const D: usize>(x: Tensor<B, D>, [gate, up, down]: &[Tensor<B, 2>; 3]) -> Tensor<B, D> {
        Linear::forward_t(swiglu::swiglu(Linear::forward_t(x.clone(), gate), Linear::forward_t(x, up)), down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, TensorPrimitive};

    /// A transposed view comes back with the same values in row-major memory; a contiguous
    /// tensor comes back as it was.
    #[test]
    fn contiguous_keeps_values_and_lays_them_out_row_major() {
        let dev = Default::default();
        let t = Tensor::<Flex, 2>::random([5, 7], Distribution::Normal(0.0, 1.0), &dev).transpose();
        let strided = |t: &Tensor<Flex, 2>| match t.clone().into_primitive() {
            TensorPrimitive::Float(p) => !p.is_contiguous(),
            TensorPrimitive::QFloat(_) => unreachable!(),
        };
        assert!(strided(&t));
        let c = contiguous(t.clone());
        assert!(!strided(&c));
        assert_eq!(c.to_data().to_vec::<f32>().unwrap(), t.to_data().to_vec::<f32>().unwrap());
        assert_eq!(contiguous(c.clone()).to_data(), c.to_data());
    }
}
