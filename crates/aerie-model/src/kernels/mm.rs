//! 2-D matmul on burn-flex through the `gemm` crate, with its own autodiff op.
//!
//! The linear layers are ~96% of the TTT FLOPs. burn-flex's matmul goes through `gemm` as well,
//! but its autodiff backward materialises transposes and it parallelises in its own way; here
//! the forward and both backward products read strided operands directly and split the larger
//! of M and N over the rayon pool, one single-threaded `gemm` call per block (its AVX-512
//! kernels, ≈ 180 GFLOP/s per core on the drafter's shapes, 191–203 in isolation). Every output
//! element is accumulated in the same order whatever the split (gemm's k-blocking depends only
//! on K and the cache sizes), so results do not depend on the number of threads (tested).
//!
//! Backends other than burn-flex (and dtypes other than f32/f64) use burn's own matmul (see
//! [`super::host`] for how the backend is recognised without changing generic signatures).

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, binary};
use burn::backend::flex::FlexTensor;
use burn::tensor::{Shape, Tensor, backend::Backend};

use super::host::{
    AdTensor, HostFloat, OutPtr, Runtime, View, ad_primitive, flex_primitive, from_ad, from_flex, host_tensor, record,
    view, with_float,
};

/// Below this many multiply-adds one call on the calling thread is cheaper than splitting.
const SPLIT_THRESHOLD: usize = 1 << 20;

/// Up to this many rows of `a`, burn-flex's own matmul (the same `gemm`, with its own threading)
/// beats this module's split, except where [`super::matvec`] applies.
const SMALL_M: usize = 16;

/// `a · b` for `a: [M, K]`, `b: [K, N]` (any strides).
pub(crate) fn matmul<B: Backend>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> Tensor<B, 2> {
    if a.dims()[0] <= SMALL_M {
        if a.dims()[0] <= super::matvec::MAX_ROWS
            && Runtime::of::<B>(&[a.dtype(), b.dtype()]) == Some(Runtime::Inference)
            && let Some(c) = super::matvec::matmul(&flex_primitive(a.clone()), &flex_primitive(b.clone()))
        {
            return from_flex(c);
        }
        return a.matmul(b);
    }
    match Runtime::of::<B>(&[a.dtype(), b.dtype()]) {
        None => a.matmul(b),
        Some(Runtime::Autodiff) => from_ad(autodiff_matmul(ad_primitive(a), ad_primitive(b))),
        Some(Runtime::Inference) => from_flex(host_matmul(flex_primitive(a), flex_primitive(b))),
    }
}

#[derive(Debug)]
struct HostMatmul;

impl Backward<Flex, 2> for HostMatmul {
    /// `a` when `b` needs a gradient, `b` when `a` does.
    type State = (Option<FlexTensor>, Option<FlexTensor>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (a, b) = ops.state;
        binary::<Flex, _, _>(
            ops.parents,
            ops.node,
            grads,
            |g| host_matmul(g, b.expect("kept for a's gradient").transpose(0, 1)),
            |g| host_matmul(a.expect("kept for b's gradient").transpose(0, 1), g),
        );
    }
}

fn autodiff_matmul(a: AdTensor, b: AdTensor) -> AdTensor {
    let out = host_matmul(a.primitive.clone(), b.primitive.clone());
    let state = (b.is_tracked().then(|| a.primitive.clone()), a.is_tracked().then(|| b.primitive.clone()));
    record(HostMatmul, [&a, &b], state, out)
}

/// `[M, K] · [K, N]` on the host, contiguous `[M, N]` out.
fn host_matmul(a: FlexTensor, b: FlexTensor) -> FlexTensor {
    let (ad, bd) = (a.layout().shape().clone(), b.layout().shape().clone());
    let (m, k, n) = (ad[0], ad[1], bd[1]);
    assert_eq!(k, bd[0], "matmul: inner dimensions must match");
    // The output buffer is typed from the start: `FlexTensor::empty` zeroes a `Vec<u8>` and then
    // copies it once more to raise its alignment.
    with_float!(a.dtype(), T => {
        // Uninitialised: with k > 0 the gemm calls below write every element without reading it.
        let mut c: Vec<T> = if k == 0 { vec![T::ZERO; m * n] } else { Vec::with_capacity(m * n) };
        if m * n > 0 && k > 0 {
            gemm_split(m, k, n, view::<T>(&a), view::<T>(&b), OutPtr(c.as_mut_ptr()));
            // SAFETY: the gemm calls wrote all m·n elements (β = 0: C is written, never read).
            unsafe { c.set_len(m * n) };
        }
        host_tensor(c, &Shape::from(vec![m, n]))
    })
}

/// `C = A B` by single-threaded gemm calls on blocks of rows (or columns, whichever dimension is
/// larger) of C in parallel.
fn gemm_split<T: HostFloat>(m: usize, k: usize, n: usize, a: View<T>, b: View<T>, c: OutPtr<T>) {
    // SAFETY (for the callers below): the views cover m × k and k × n, C holds m × n at row stride rsc.
    let call = |m, k, n, a: View<T>, b: View<T>, c: *mut T, rsc| unsafe {
        T::gemm(m, k, n, a.ptr, a.rs, a.cs, b.ptr, b.rs, b.cs, T::ZERO, c, rsc)
    };
    use rayon::prelude::*;
    let threads = rayon::current_num_threads();
    let rsc = n as isize;
    if threads <= 1 || m.saturating_mul(n).saturating_mul(k) < SPLIT_THRESHOLD {
        call(m, k, n, a, b, c.0, rsc);
        return;
    }
    // Blocks of whole kernel tiles (multiples of 16), about two per thread.
    let along_m = m >= n;
    let len = if along_m { m } else { n };
    let block = len.div_ceil(2 * threads).next_multiple_of(16).max(16);
    (0..len.div_ceil(block)).into_par_iter().for_each(|i| {
        let start = i * block;
        let size = block.min(len - start);
        let s = start as isize;
        // SAFETY: blocks are disjoint ranges of C's rows (or columns), inside the operands.
        unsafe {
            if along_m {
                let a = View { ptr: a.ptr.offset(s * a.rs), ..a };
                call(size, k, n, a, b, c.at(s * rsc), rsc);
            } else {
                let b = View { ptr: b.ptr.offset(s * b.cs), ..b };
                call(m, k, size, a, b, c.at(s), rsc);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::host::AdFlex;
    use super::super::host::testing::{on_threads, tensor};
    use super::*;
    use burn::tensor::DType;

    fn data<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    /// Against burn's matmul, forward and both gradients, with a transposed operand and sizes
    /// that split unevenly; bitwise the same for 1 and 3 threads.
    #[test]
    fn host_matmul_matches_burn_and_ignores_thread_count() {
        let _alone = crate::autodiff::exclusive();
        let run = |threads: usize| {
            on_threads(threads, || {
                // Inputs from fixed host values, not the backend's global RNG (other tests draw
                // from it concurrently, so a reseed would not give both runs the same inputs).
                let a = tensor::<AdFlex, 2>([301, 70], 1, DType::F32);
                let bt = tensor::<AdFlex, 2>([517, 70], 2, DType::F32);
                let w = tensor::<AdFlex, 2>([301, 517], 3, DType::F32);
                let (a, bt) = (a.require_grad(), bt.require_grad());
                let ours = matmul(a.clone(), bt.clone().transpose());
                let g = (ours.clone() * w.clone()).sum().backward();
                let ours = (data(ours), data(a.grad(&g).unwrap()), data(bt.grad(&g).unwrap()));
                let theirs = a.clone().matmul(bt.clone().transpose());
                let g = (theirs.clone() * w).sum().backward();
                let theirs = (data(theirs), data(a.grad(&g).unwrap()), data(bt.grad(&g).unwrap()));
                (ours, theirs)
            })
        };
        let (one, theirs) = run(1);
        let (three, _) = run(3);
        assert_eq!(one, three, "thread count changed the result");
        for (what, x, y) in [("out", &one.0, &theirs.0), ("grad a", &one.1, &theirs.1), ("grad b", &one.2, &theirs.2)] {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                assert!((p - q).abs() <= 1e-4 * (1.0 + q.abs()), "{what}[{i}]: {p} vs {q}");
            }
        }
    }
}
