//! The SwiGLU gate `silu(gate) ∘ up` as one op on the CPU backend.
//!
//! Written with burn ops it is four tensors autodiff keeps for the backward pass (the gate, its
//! sigmoid, the silu and the up projection, each `[tokens, I]`, I the MLP width) besides the
//! product the down projection keeps. This op keeps only the gate and the up projection and
//! recomputes the sigmoid in the backward: at the Kimi drafter's I = 18432 that is 15% of all
//! the activations a TTT step keeps, and one pass over memory instead of four.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::flex::FlexTensor;
use burn::tensor::{Tensor, activation::silu, backend::Backend};
use rayon::prelude::*;

use super::host::{
    AdTensor, HostFloat, Runtime, ad_primitive, backward_all, contiguous, flex_primitive, from_ad, from_flex,
    host_tensor, record, with_float,
};

/// Elements per parallel task.
const BLOCK: usize = 1 << 14;

/// `silu(gate) ∘ up` (same shapes).
pub(crate) fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    if gate.dims() != up.dims() {
        return silu(gate) * up;
    }
    match Runtime::of::<B>(&[gate.dtype(), up.dtype()]) {
        None => silu(gate) * up,
        Some(Runtime::Autodiff) => from_ad(autodiff_forward(ad_primitive(gate), ad_primitive(up))),
        Some(Runtime::Inference) => from_flex(host_forward(&flex_primitive(gate), &flex_primitive(up))),
    }
}

#[derive(Debug)]
struct SwiGlu;

impl Backward<Flex, 2> for SwiGlu {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_all(ops, grads, |(gate, up), grad| host_backward(&gate, &up, &grad));
    }
}

fn autodiff_forward(gate: AdTensor, up: AdTensor) -> AdTensor {
    let out = host_forward(&gate.primitive, &up.primitive);
    let state = (gate.primitive.clone(), up.primitive.clone());
    record(SwiGlu, [&gate, &up], state, out)
}

fn host_forward(gate: &FlexTensor, up: &FlexTensor) -> FlexTensor {
    fn run<T: HostFloat>(g: &[T], u: &[T]) -> Vec<T> {
        let mut out = vec![T::ZERO; g.len()];
        out.par_chunks_mut(BLOCK).zip(g.par_chunks(BLOCK).zip(u.par_chunks(BLOCK))).for_each(|(o, (g, u))| {
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (T::ONE + (T::ZERO - g).exp()) * u;
            }
        });
        out
    }
    with_float!(gate.dtype(), T => host_tensor(run::<T>(&contiguous(gate), &contiguous(up)), gate.layout().shape()))
}

/// `d gate = dy ∘ up ∘ σ(g)(1 + g(1 − σ(g)))`, `d up = dy ∘ silu(g)`.
fn host_backward(gate: &FlexTensor, up: &FlexTensor, grad: &FlexTensor) -> [FlexTensor; 2] {
    fn run<T: HostFloat>(g: &[T], u: &[T], dy: &[T]) -> [Vec<T>; 2] {
        let (mut dg, mut du) = (vec![T::ZERO; g.len()], vec![T::ZERO; g.len()]);
        let inputs = g.par_chunks(BLOCK).zip(u.par_chunks(BLOCK)).zip(dy.par_chunks(BLOCK));
        dg.par_chunks_mut(BLOCK).zip(du.par_chunks_mut(BLOCK)).zip(inputs).for_each(|((dg, du), ((g, u), dy))| {
            for i in 0..g.len() {
                let s = T::ONE / (T::ONE + (T::ZERO - g[i]).exp());
                dg[i] = dy[i] * u[i] * s * (T::ONE + g[i] * (T::ONE - s));
                du[i] = dy[i] * g[i] * s;
            }
        });
        [dg, du]
    }
    with_float!(gate.dtype(), T => {
        let [dg, du] = run::<T>(&contiguous(gate), &contiguous(up), &contiguous(grad));
        [host_tensor(dg, gate.layout().shape()), host_tensor(du, up.layout().shape())]
    })
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::DType;

    use super::super::host::AdFlex;
    use super::super::host::testing::{assert_close, host, tensor};
    use super::*;

    /// `Σ w ∘ swiglu(gate, up)` and its gradients through the fused op or burn's ops.
    fn run<B: burn::tensor::backend::AutodiffBackend>(fused: bool, dtype: DType) -> [Vec<f64>; 3] {
        let _alone = crate::autodiff::exclusive();
        let shape = [3, 7, 1000];
        let g = tensor::<B, 3>(shape, 1, dtype).mul_scalar(3.0).require_grad();
        let u = tensor::<B, 3>(shape, 2, dtype).require_grad();
        let y = if fused { swiglu(g.clone(), u.clone()) } else { silu(g.clone()) * u.clone() };
        let grads = (y.clone() * tensor::<B, 3>(shape, 3, dtype)).sum().backward();
        [host(y), host(g.grad(&grads).unwrap()), host(u.grad(&grads).unwrap())]
    }

    /// Against burn's silu and product: f64 to 1e-12 (different but exact formulas), f32 to 1e-5.
    #[test]
    fn matches_burn_values_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let (ours, theirs) = (run::<AdFlex>(true, dtype), run::<AdFlex>(false, dtype));
            for (what, (a, b)) in ["y", "d gate", "d up"].iter().zip(ours.iter().zip(&theirs)) {
                assert_close(what, a, b, tol);
            }
        }
        let (g, u) = (tensor::<Flex, 2>([5, 300], 1, DType::F32), tensor::<Flex, 2>([5, 300], 2, DType::F32));
        assert_close("inference", &host(swiglu(g.clone(), u.clone())), &host(silu(g) * u), 1e-6);
    }
}
