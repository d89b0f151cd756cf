//! The precision rule of every reduction (softmax, log-sum-exp, norms, attention scores):
//! half-precision activations are reduced in f32, so bf16 training and decoding keep the small
//! terms of long sums.

use burn::tensor::{DType, Tensor, backend::Backend};

/// Cast half-precision activations up to f32 for reductions; f32/f64 stay as they are (f64 is
/// used by the finite-difference gradient tests).
pub fn upcast<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.cast(DType::F32),
        _ => x,
    }
}

/// A tensor's values on the host as f32, whatever its float dtype: the widening from bf16/f16 is
/// exact, so every caller (captured features, logits to sample from, metrics) sees the values
/// the device held.
pub fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().expect("f32 values")
}
