//! RMSNorm `w ∘ x / sqrt(mean(x²) + ε)` as one op on the CPU backend.
//!
//! In burn ops autodiff keeps the input, the normalised input and the scaled result of every call
//! (and burn-flex makes a pass over memory per op); this op keeps the input and the weight and
//! recomputes the row scale in the backward. A TTT step calls four norms on `[tokens, H]`.
//! Rows are reduced in one fixed order and the weight gradient is summed over fixed blocks of
//! rows in block order, so results do not depend on the thread count.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::flex::FlexTensor;
use burn::tensor::{Tensor, backend::Backend};
use rayon::prelude::*;

use super::host::{
    AdTensor, HostFloat, Runtime, ad_primitive, backward_all, contiguous, flex_primitive, from_ad, from_flex,
    host_tensor, record, with_float,
};

/// Rows per parallel task (and per partial weight gradient).
const ROWS: usize = 32;

/// The fused op for `x: [.., H]`, `w: [H]`, or `None` where burn's ops must be used.
pub(crate) fn rms_norm<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    w: &Tensor<B, 1>,
    eps: f64,
) -> Option<Tensor<B, D>> {
    if x.dims()[D - 1] != w.dims()[0] {
        return None;
    }
    Some(match Runtime::of::<B>(&[x.dtype(), w.dtype()])? {
        Runtime::Autodiff => from_ad(autodiff_forward(ad_primitive(x.clone()), ad_primitive(w.clone()), eps)),
        Runtime::Inference => from_flex(host_forward(&flex_primitive(x.clone()), &flex_primitive(w.clone()), eps)),
    })
}

#[derive(Debug)]
struct RmsNormOp;

impl Backward<Flex, 2> for RmsNormOp {
    /// x, w, ε.
    type State = (FlexTensor, FlexTensor, f64);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_all(ops, grads, |(x, w, eps), grad| host_backward(&x, &w, eps, &grad));
    }
}

fn autodiff_forward(x: AdTensor, w: AdTensor, eps: f64) -> AdTensor {
    let out = host_forward(&x.primitive, &w.primitive, eps);
    let state = (x.primitive.clone(), w.primitive.clone(), eps);
    record(RmsNormOp, [&x, &w], state, out)
}

/// `1 / sqrt(mean(x²) + ε)` of one row.
#[inline]
fn inv_rms<T: HostFloat>(x: &[T], eps: f64) -> T {
    let sq = x.iter().fold(T::ZERO, |acc, &v| acc + v * v);
    T::ONE / (sq / T::from_f64(x.len() as f64) + T::from_f64(eps)).sqrt()
}

fn host_forward(x: &FlexTensor, w: &FlexTensor, eps: f64) -> FlexTensor {
    fn run<T: HostFloat>(x: &[T], w: &[T], eps: f64) -> Vec<T> {
        let h = w.len();
        let mut out = vec![T::ZERO; x.len()];
        out.par_chunks_mut(ROWS * h).zip(x.par_chunks(ROWS * h)).for_each(|(out, x)| {
            for (y, x) in out.chunks_mut(h).zip(x.chunks(h)) {
                let r = inv_rms(x, eps);
                for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                    *y = w * (x * r);
                }
            }
        });
        out
    }
    with_float!(x.dtype(), T => host_tensor(run::<T>(&contiguous(x), &contiguous(w), eps), x.layout().shape()))
}

/// With u = dy ∘ w and r the row's scale: `dx = r u − x r³ mean(u ∘ x)`, `dw = Σ_rows dy ∘ x r`.
fn host_backward(x: &FlexTensor, w: &FlexTensor, eps: f64, grad: &FlexTensor) -> [FlexTensor; 2] {
    fn run<T: HostFloat>(x: &[T], w: &[T], eps: f64, dy: &[T]) -> [Vec<T>; 2] {
        let h = w.len();
        let mut dx = vec![T::ZERO; x.len()];
        let partials: Vec<Vec<T>> = dx
            .par_chunks_mut(ROWS * h)
            .zip(x.par_chunks(ROWS * h).zip(dy.par_chunks(ROWS * h)))
            .map(|(dx, (x, dy))| {
                let mut dw = vec![T::ZERO; h];
                for ((dx, x), dy) in dx.chunks_mut(h).zip(x.chunks(h)).zip(dy.chunks(h)) {
                    let r = inv_rms(x, eps);
                    let mut dot = T::ZERO;
                    for i in 0..h {
                        dot = dot + dy[i] * w[i] * x[i];
                    }
                    let c = r * r * r * dot / T::from_f64(h as f64);
                    for i in 0..h {
                        dx[i] = r * dy[i] * w[i] - x[i] * c;
                        dw[i] = dw[i] + dy[i] * x[i] * r;
                    }
                }
                dw
            })
            .collect();
        let mut dw = vec![T::ZERO; h];
        for p in partials {
            for (a, b) in dw.iter_mut().zip(p) {
                *a = *a + b;
            }
        }
        [dx, dw]
    }
    with_float!(x.dtype(), T => {
        let [dx, dw] = run::<T>(&contiguous(x), &contiguous(w), eps, &contiguous(grad));
        [host_tensor(dx, x.layout().shape()), host_tensor(dw, w.layout().shape())]
    })
}

#[cfg(test)]
mod tests {
    use burn::tensor::backend::AutodiffBackend;

    use burn::tensor::DType;

    use super::super::host::AdFlex;
    use super::super::host::testing::{assert_close, host, on_threads, tensor};
    use super::*;

    const EPS: f64 = 1e-5;

    fn reference<B: Backend>(x: Tensor<B, 3>, w: Tensor<B, 1>) -> Tensor<B, 3> {
        let h = w.dims()[0];
        let inv = x.clone().square().mean_dim(2).add_scalar(EPS).sqrt().recip();
        x * inv * w.reshape([1, 1, h])
    }

    /// `Σ c ∘ norm(x)` and its gradients through the fused op or burn's ops.
    fn run<B: AutodiffBackend>(fused: bool, shape: [usize; 3], dtype: DType) -> [Vec<f64>; 3] {
        let _alone = crate::autodiff::exclusive();
        let x = tensor::<B, 3>(shape, 1, dtype).require_grad();
        let w = tensor::<B, 1>([shape[2]], 2, dtype).require_grad();
        let y = if fused { rms_norm(&x, &w, EPS).expect("host op") } else { reference(x.clone(), w.clone()) };
        let grads = (y.clone() * tensor::<B, 3>(shape, 3, dtype)).sum().backward();
        [host(y), host(x.grad(&grads).unwrap()), host(w.grad(&grads).unwrap())]
    }

    /// Against burn's ops (f64 1e-12, f32 1e-5 relative: sums of 300 terms in another order),
    /// with more rows than one block (75 > 32) so the weight gradient sums several partials.
    #[test]
    fn matches_burn_values_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let shape = [3, 25, 300];
            let (ours, theirs) = (run::<AdFlex>(true, shape, dtype), run::<AdFlex>(false, shape, dtype));
            for (what, (a, b)) in ["y", "dx", "dw"].iter().zip(ours.iter().zip(&theirs)) {
                assert_close(what, a, b, tol);
            }
        }
        let (x, w) = (tensor::<Flex, 3>([2, 5, 64], 1, DType::F32), tensor::<Flex, 1>([64], 2, DType::F32));
        assert_close("inference", &host(rms_norm(&x, &w, EPS).unwrap()), &host(reference(x, w)), 1e-5);
    }

    /// Central differences in f64 (step 1e-6, tolerance 1e-6) on a tiny shape.
    #[test]
    fn gradients_match_finite_differences() {
        let shape = [1, 3, 4];
        let [_, dx, dw] = run::<AdFlex>(true, shape, DType::F64);
        let objective = |x: Tensor<AdFlex, 3>, w: Tensor<AdFlex, 1>| -> f64 {
            let y = rms_norm(&x, &w, EPS).unwrap();
            host((y * tensor::<AdFlex, 3>(shape, 3, DType::F64)).sum())[0]
        };
        let x0 = host(tensor::<AdFlex, 3>(shape, 1, DType::F64));
        let w0 = host(tensor::<AdFlex, 1>([4], 2, DType::F64));
        let make3 = |v: &[f64]| {
            Tensor::<AdFlex, 3>::from_data(
                burn::tensor::TensorData::new(v.to_vec(), shape),
                (&Default::default(), DType::F64),
            )
        };
        let make1 = |v: &[f64]| {
            Tensor::<AdFlex, 1>::from_data(
                burn::tensor::TensorData::new(v.to_vec(), [4]),
                (&Default::default(), DType::F64),
            )
        };
        let h = 1e-6;
        for i in 0..x0.len() {
            let (mut p, mut m) = (x0.clone(), x0.clone());
            p[i] += h;
            m[i] -= h;
            let numeric = (objective(make3(&p), make1(&w0)) - objective(make3(&m), make1(&w0))) / (2.0 * h);
            assert!((dx[i] - numeric).abs() < 1e-6 * (1.0 + numeric.abs()), "dx[{i}] {} vs {numeric}", dx[i]);
        }
        for i in 0..w0.len() {
            let (mut p, mut m) = (w0.clone(), w0.clone());
            p[i] += h;
            m[i] -= h;
            let numeric = (objective(make3(&x0), make1(&p)) - objective(make3(&x0), make1(&m))) / (2.0 * h);
            assert!((dw[i] - numeric).abs() < 1e-6 * (1.0 + numeric.abs()), "dw[{i}] {} vs {numeric}", dw[i]);
        }
    }

    /// Fixed row blocks summed in order: bitwise the same on 1 and 3 threads.
    #[test]
    fn result_does_not_depend_on_the_thread_count() {
        let on = |threads: usize| on_threads(threads, || run::<AdFlex>(true, [2, 70, 96], DType::F32));
        assert_eq!(on(1), on(3));
    }
}
