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

    /// The same layer with its weight stored `[in, out]` in memory (still `[out, in]` to
    /// callers, as a transposed view), the layout the target's loader gives its weights. On the
    /// CPU a product of a few rows then streams each weight row once in stored order
    /// (`kernels::matvec`'s row form) instead of one dot product per output column: for decoding,
    /// where the drafter runs one or two positions at a time. The same product, summed in
    /// another order.
    pub fn into_row_major(self) -> Self {
        let w = self.weight.val();
        let (device, dtype) = (w.device(), w.dtype());
        Self::new(Tensor::<B, 2>::from_data(w.transpose().into_data(), (&device, dtype)).transpose())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::host::testing::{host, tensor};
    use burn::backend::Flex;

    /// The re-laid weight holds the same values in the same logical shape, is stored by rows,
    /// and gives the checkpoint layout's product up to f32 rounding of a sum in another order
    /// (K = 70 terms of magnitude ≤ 4: 1e-5 relative to the sum of |terms|), at one and two rows.
    #[test]
    fn row_major_linear_is_the_same_layer() {
        let linear = Linear::<Flex>::new(tensor([37, 70], 1, DType::F32));
        let relaid = Linear::new(linear.weight.val()).into_row_major();
        assert_eq!(relaid.weight.val().dims(), [37, 70]);
        assert_eq!(host(relaid.weight.val()), host(linear.weight.val()));
        let stored = relaid.weight.val().transpose().into_primitive().tensor();
        assert_eq!(stored.layout().strides()[1], 1, "[in, out] rows are contiguous");
        for m in [1, 2] {
            let x = tensor::<Flex, 2>([m, 70], 2, DType::F32);
            let abs = Linear::<Flex>::new(linear.weight.val().abs()).forward(x.clone().abs());
            let (want, got) = (host(linear.forward(x.clone())), host(relaid.forward(x)));
            for ((w, g), s) in want.iter().zip(&got).zip(host(abs)) {
                assert!((w - g).abs() <= 1e-5 * (1.0 + s), "m = {m}: {g} vs {w}");
            }
        }
    }
}
