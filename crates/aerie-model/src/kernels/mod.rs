//! Fused ops for the hot spots of the drafter's TTT step and of the native target's decoding,
//! each a host kernel on the CPU backend (burn-flex, with or without autodiff) and burn's own
//! tensor ops on every other backend and dtype.
//!
//! burn-flex runs each burn op as its own, mostly single-threaded sweep over memory, and autodiff
//! keeps every intermediate tensor; these kernels do one pass per row and keep only what their
//! backward needs. [`host`] recognises burn-flex behind a generic backend; the kernels are the
//! matmul ([`mm`], with [`matvec`] for a few rows), causal attention ([`attention`]) and its merge
//! with the TTT diagonal keys ([`diagonal`]), RMSNorm ([`rms_norm`]), the SwiGLU gate
//! ([`swiglu`]) and the batched KV cache's in-place writes ([`kv_write`]). RoPE's kernel lives with RoPE (`rope/kernel.rs`), the TTT loss's with the TTT
//! objective (`ttt/fused.rs`).

pub(crate) mod attention;
pub(crate) mod diagonal;
pub(crate) mod host;
pub(crate) mod kv_write;
mod matvec;
pub(crate) mod mm;
pub(crate) mod rms_norm;
pub(crate) mod swiglu;

use burn::tensor::{Tensor, backend::Backend};

/// The same tensor with its values in row-major memory order, on the CPU backend (other backends
/// and dtypes: returned as is).
///
/// Why: the gradient of a weight used transposed (every linear layer, see
/// [`crate::layers::Linear::weight_t`]) comes out of autodiff as a transposed view, and burn-flex
/// runs each later element-wise op on it (the clipping norm, the clip, AdamW's moment updates)
/// through its per-element strided iterator: ≈ 10% of a quickstart training step. Training makes
/// every gradient contiguous once.
pub fn contiguous<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    match host::Runtime::of::<B>(&[t.dtype()]) {
        Some(host::Runtime::Inference) => host::from_flex(host::flex_primitive(t).to_contiguous()),
        _ => t,
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
