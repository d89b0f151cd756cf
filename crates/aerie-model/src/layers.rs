//! The building blocks of a Llama decoder layer with HF weight layouts: bias-free linear
//! (`weight` stored `[out, in]` as in the checkpoint, not burn's `[in, out]`), RMSNorm computed
//! in at least float32, and the SwiGLU MLP.

use burn::module::{Module, Param};
use burn::tensor::{DType, Tensor, backend::Backend};

use crate::kernels::{mm, rms_norm, swiglu};
use crate::precision::upcast;

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
/// fused op on the CPU backend, see `kernels/rms_norm.rs`).
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

/// SwiGLU: `down(silu(gate x) * up x)` (the gate fused on the CPU backend, see `kernels/swiglu.rs`).
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
