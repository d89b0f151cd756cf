//! The attention of TTT step k ≥ 1: the step-0 causal block merged with one "diagonal" key per
//! later step (eagle3.md §3).
//!
//! Query row r (position t) attends to the step-0 keys 0..=t, whose softmax output o0 and
//! log-sum-exp lse0 come from [`super::attention::causal`], and to the key of position t written
//! by each step 1..=J. The merged output is a softmax over `[lse0, s_1, …, s_J]`:
//! `out = w0·o0 + Σ_j w_j·v_j[t]`, `s_j = q·k_j[t]`. In burn tensor ops ([`merge_reference`]) that
//! is, per step and per diagonal key, a grouped-query tiling of k_j and v_j (a `cat`), two
//! broadcast products and their reductions: on burn-flex these run element by element through
//! strided iterators, forward and backward, and were ≈ 15% of a SmolLM2-sized TTT step. On the
//! CPU backend [`merge`] does it in one pass per row with its own backward; GPUs keep the
//! tensor ops.

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
use crate::precision::upcast;

/// `w0·o0 + Σ_j w_j·v_j` with `(w0, w_j) = softmax([lse0, q·k_j])` per query row, for
/// `q, o0: [B, nKV, g·L, d]` (q already scaled; row `r·L + t` is position t), `lse0: [B, nKV, g·L, 1]`
/// and the diagonal keys and values `[B, nKV, L, d]` of steps 1..=J (J ≥ 1).
pub(crate) fn merge<B: Backend>(
    q: Tensor<B, 4>,
    o0: Tensor<B, 4>,
    lse0: Tensor<B, 4>,
    diagonal: &[(Tensor<B, 4>, Tensor<B, 4>)],
) -> Tensor<B, 4> {
    assert!(!diagonal.is_empty(), "merge needs at least one diagonal step");
    let mut dtypes = vec![q.dtype(), o0.dtype(), lse0.dtype()];
    dtypes.extend(diagonal.iter().flat_map(|(k, v)| [k.dtype(), v.dtype()]));
    let Some(runtime) = Runtime::of::<B>(&dtypes) else {
        return merge_reference(q, o0, lse0, diagonal);
    };
    // The J keys (values) stacked along the rows of each head: `[B, nKV, J·L, d]`, row `j·L + t`.
    let l = diagonal[0].0.dims()[2];
    let keys = Tensor::cat(diagonal.iter().map(|(k, _)| k.clone()).collect(), 2);
    let values = Tensor::cat(diagonal.iter().map(|(_, v)| v.clone()).collect(), 2);
    match runtime {
        Runtime::Autodiff => {
            let inputs = [q, o0, lse0, keys, values].map(ad_primitive);
            from_ad(autodiff_forward(inputs, l))
        }
        Runtime::Inference => {
            let [q, o0, lse0, keys, values] = [q, o0, lse0, keys, values].map(flex_primitive);
            from_flex(host_forward([&q, &o0, &lse0, &keys, &values], l))
        }
    }
}

/// [`merge`] in burn tensor ops (every backend, every dtype): scores and weights in at least f32.
pub(crate) fn merge_reference<B: Backend>(
    q: Tensor<B, 4>,
    o0: Tensor<B, 4>,
    lse0: Tensor<B, 4>,
    diagonal: &[(Tensor<B, 4>, Tensor<B, 4>)],
) -> Tensor<B, 4> {
    let dtype = q.dtype();
    let g = q.dims()[2] / diagonal[0].0.dims()[2];
    let diag: Vec<Tensor<B, 4>> =
        diagonal.iter().map(|(kd, _)| upcast((q.clone() * tile(kd.clone(), g)).sum_dim(3))).collect();
    // The row max (a constant for the gradient: the softmax does not depend on it).
    let mut max = lse0.clone().detach();
    for s in &diag {
        max = max.max_pair(s.clone().detach());
    }
    let e0 = (lse0 - max.clone()).exp();
    let mut denom = e0.clone();
    let mut out = o0 * e0.cast(dtype);
    for (s, (_, vd)) in diag.into_iter().zip(diagonal) {
        let e = (s - max.clone()).exp();
        denom = denom + e.clone();
        out = out + e.cast(dtype) * tile(vd.clone(), g);
    }
    out / denom.cast(dtype)
}

/// `[B, nKV, L, d]` → `[B, nKV, g·L, d]`, the whole block repeated g times along dim 2 (row
/// `r·L + t` holds position t), matching the grouped query layout. Written with `cat`, whose
/// backward burn 0.21 gets right (`repeat_dim`'s backward is wrong there, see tests/ttt.rs).
fn tile<B: Backend>(x: Tensor<B, 4>, g: usize) -> Tensor<B, 4> {
    if g == 1 { x } else { Tensor::cat(vec![x; g], 2) }
}

#[derive(Debug)]
struct MergeOp;

impl Backward<Flex, 5> for MergeOp {
    /// q, o0, lse0, stacked keys, stacked values; L.
    type State = ([FlexTensor; 5], usize);

    fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_all(ops, grads, |(inputs, l), grad| host_backward(inputs.each_ref(), l, &grad));
    }
}

fn autodiff_forward(inputs: [AdTensor; 5], l: usize) -> AdTensor {
    let primitives = inputs.each_ref().map(|t| t.primitive.clone());
    let out = host_forward(primitives.each_ref(), l);
    record(MergeOp, inputs.each_ref(), (primitives, l), out)
}

/// Shapes of one call: `bh = B·nKV` heads, `g` query groups of `L` rows, `J` diagonal steps.
#[derive(Clone, Copy, Debug)]
struct Dims {
    bh: usize,
    groups: usize,
    l: usize,
    d: usize,
    steps: usize,
}

impl Dims {
    fn of([q, o0, lse0, keys, values]: [&FlexTensor; 5], l: usize) -> Self {
        let (qs, ks) = (q.layout().shape(), keys.layout().shape());
        assert!(qs.len() == 4 && ks.len() == 4, "merge takes 4-D tensors");
        assert_eq!(o0.layout().shape(), qs, "o0 and q disagree");
        assert_eq!(lse0.layout().shape().as_slice(), [qs[0], qs[1], qs[2], 1], "lse0 and q disagree");
        assert_eq!(values.layout().shape(), ks, "diagonal values and keys disagree");
        assert_eq!((ks[0], ks[1], ks[3]), (qs[0], qs[1], qs[3]), "diagonal keys and q disagree");
        assert!(l > 0 && qs[2] % l == 0 && ks[2] % l == 0, "rows are not whole blocks of L = {l}");
        Self { bh: qs[0] * qs[1], groups: qs[2] / l, l, d: qs[3], steps: ks[2] / l }
    }
}

fn host_forward(inputs: [&FlexTensor; 5], l: usize) -> FlexTensor {
    let dims = Dims::of(inputs, l);
    let [q, o0, lse0, keys, values] = inputs;
    with_float!(q.dtype(), T => {
        let out = forward::<T>(
            dims,
            &contiguous(q),
            &contiguous(o0),
            &contiguous(lse0),
            &contiguous(keys),
            &contiguous(values),
        );
        host_tensor(out, q.layout().shape())
    })
}

fn host_backward(inputs: [&FlexTensor; 5], l: usize, grad: &FlexTensor) -> [FlexTensor; 5] {
    let dims = Dims::of(inputs, l);
    let [q, o0, lse0, keys, values] = inputs;
    with_float!(q.dtype(), T => {
        let grads = backward::<T>(
            dims,
            [&contiguous(q), &contiguous(o0), &contiguous(lse0), &contiguous(keys), &contiguous(values)],
            &contiguous(grad),
        );
        let shapes = [q, o0, lse0, keys, values].map(|t| t.layout().shape().clone());
        let mut grads = grads.into_iter();
        shapes.map(|s| host_tensor(grads.next().expect("five gradients"), &s))
    })
}

fn dot<T: HostFloat>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::ZERO, |acc, (&x, &y)| acc + x * y)
}

/// The merge weights of one row into `w` (`w[0]` for the step-0 block, `w[j]` for step j):
/// `softmax([lse0, q·k_1, …, q·k_J])`.
#[inline]
fn weights<T: HostFloat>(q: &[T], lse0: T, keys: impl Iterator<Item = impl AsRef<[T]>>, w: &mut [T]) {
    w[0] = lse0;
    for (w, k) in w[1..].iter_mut().zip(keys) {
        *w = dot(q, k.as_ref());
    }
    let max = w.iter().copied().fold(T::NEG_INFINITY, |m, x| if x > m { x } else { m });
    let mut sum = T::ZERO;
    for x in w.iter_mut() {
        *x = (*x - max).exp();
        sum = sum + *x;
    }
    for x in w.iter_mut() {
        *x = *x / sum;
    }
}

/// One task per head (its rows are independent; each head's key gradients are only its own).
fn forward<T: HostFloat>(dims: Dims, q: &[T], o0: &[T], lse0: &[T], keys: &[T], values: &[T]) -> Vec<T> {
    let Dims { groups, l, d, steps, .. } = dims;
    let (rows, kv) = (groups * l * d, steps * l * d);
    let mut out = vec![T::ZERO; dims.bh * rows];
    out.par_chunks_mut(rows).enumerate().for_each(|(head, out)| {
        let (q, o0) = (&q[head * rows..][..rows], &o0[head * rows..][..rows]);
        let lse0 = &lse0[head * groups * l..][..groups * l];
        let (keys, values) = (&keys[head * kv..][..kv], &values[head * kv..][..kv]);
        let mut w = vec![T::ZERO; steps + 1];
        for r in 0..groups * l {
            let t = r % l;
            let at = |j: usize| (j * l + t) * d;
            let qr = &q[r * d..][..d];
            weights(qr, lse0[r], (0..steps).map(|j| &keys[at(j)..][..d]), &mut w);
            let out = &mut out[r * d..][..d];
            for (y, &x) in out.iter_mut().zip(&o0[r * d..][..d]) {
                *y = w[0] * x;
            }
            for (j, &wj) in w[1..].iter().enumerate() {
                for (y, &v) in out.iter_mut().zip(&values[at(j)..][..d]) {
                    *y = *y + wj * v;
                }
            }
        }
    });
    out
}

/// With G the output row's gradient, `u0 = G·o0`, `u_j = G·v_j`, `ū = w0·u0 + Σ w_j·u_j`:
/// `do0 = w0·G`, `dlse0 = w0·(u0 − ū)`, `ds_j = w_j·(u_j − ū)`, `dq = Σ ds_j·k_j`,
/// `dk_j[t] += ds_j·q`, `dv_j[t] += w_j·G` (summed over the g rows of position t, in group order).
/// One task per head, rows in a fixed order: the result does not depend on the thread count.
fn backward<T: HostFloat>(dims: Dims, inputs: [&[T]; 5], grad: &[T]) -> [Vec<T>; 5] {
    let Dims { bh, groups, l, d, steps } = dims;
    let [q, o0, lse0, keys, values] = inputs;
    let (rows, kv, gl) = (groups * l * d, steps * l * d, groups * l);
    let mut dq = vec![T::ZERO; bh * rows];
    let mut do0 = vec![T::ZERO; bh * rows];
    let mut dlse = vec![T::ZERO; bh * gl];
    let mut dk = vec![T::ZERO; bh * kv];
    let mut dv = vec![T::ZERO; bh * kv];
    dq.par_chunks_mut(rows)
        .zip(do0.par_chunks_mut(rows))
        .zip(dlse.par_chunks_mut(gl))
        .zip(dk.par_chunks_mut(kv))
        .zip(dv.par_chunks_mut(kv))
        .enumerate()
        .for_each(|(head, ((((dq, do0), dlse), dk), dv))| {
            let (q, o0, grad) = (&q[head * rows..][..rows], &o0[head * rows..][..rows], &grad[head * rows..][..rows]);
            let lse0 = &lse0[head * gl..][..gl];
            let (keys, values) = (&keys[head * kv..][..kv], &values[head * kv..][..kv]);
            let mut w = vec![T::ZERO; steps + 1];
            let mut u = vec![T::ZERO; steps + 1];
            for r in 0..gl {
                let t = r % l;
                let at = |j: usize| (j * l + t) * d;
                let (qr, gr, o0r) = (&q[r * d..][..d], &grad[r * d..][..d], &o0[r * d..][..d]);
                weights(qr, lse0[r], (0..steps).map(|j| &keys[at(j)..][..d]), &mut w);
                u[0] = dot(gr, o0r);
                for j in 0..steps {
                    u[j + 1] = dot(gr, &values[at(j)..][..d]);
                }
                let mean = w.iter().zip(&u).fold(T::ZERO, |acc, (&w, &u)| acc + w * u);
                for (y, &g) in do0[r * d..][..d].iter_mut().zip(gr) {
                    *y = w[0] * g;
                }
                dlse[r] = w[0] * (u[0] - mean);
                let dqr = &mut dq[r * d..][..d];
                for j in 0..steps {
                    let ds = w[j + 1] * (u[j + 1] - mean);
                    for ((y, &k), (dk, &x)) in
                        dqr.iter_mut().zip(&keys[at(j)..][..d]).zip(dk[at(j)..][..d].iter_mut().zip(qr))
                    {
                        *y = *y + ds * k;
                        *dk = *dk + ds * x;
                    }
                    for (y, &g) in dv[at(j)..][..d].iter_mut().zip(gr) {
                        *y = *y + w[j + 1] * g;
                    }
                }
            }
        });
    [dq, do0, dlse, dk, dv]
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, TensorData};

    use super::super::host::AdFlex;
    use super::super::host::testing::{assert_close, assert_finite_differences, host, on_threads, tensor, values};
    use super::*;

    fn objective<B: Backend>(out: Tensor<B, 4>, seed: u64) -> Tensor<B, 1> {
        let w = tensor::<B, 4>(out.dims(), seed, out.dtype());
        (out * w).sum()
    }

    /// Shapes `[q/o0, lse0, k_1, v_1, …]` for `[b, nkv, g, l, d]` and J steps.
    fn shapes([b, nkv, g, l, d]: [usize; 5], steps: usize) -> Vec<[usize; 4]> {
        let mut s = vec![[b, nkv, g * l, d], [b, nkv, g * l, d], [b, nkv, g * l, 1]];
        s.extend((0..2 * steps).map(|_| [b, nkv, l, d]));
        s
    }

    fn call<B: Backend>(t: &[Tensor<B, 4>], host_path: bool) -> Tensor<B, 4> {
        let diagonal: Vec<_> = t[3..].chunks(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
        let f = if host_path { merge } else { merge_reference };
        f(t[0].clone(), t[1].clone(), t[2].clone(), &diagonal)
    }

    /// Output and the gradient of every input.
    fn run(host_path: bool, shape: [usize; 5], steps: usize, dtype: DType) -> (Vec<f64>, Vec<Vec<f64>>) {
        let _alone = crate::autodiff::exclusive();
        let t: Vec<Tensor<AdFlex, 4>> =
            shapes(shape, steps).into_iter().zip(1..).map(|(s, seed)| tensor(s, seed, dtype).require_grad()).collect();
        let out = call(&t, host_path);
        let grads = objective(out.clone(), 99).backward();
        (host(out), t.iter().map(|x| host(x.grad(&grads).expect("gradient"))).collect())
    }

    /// Against the tensor path in f64 (rounding only, 1e-10) and f32 (1e-5: a handful of terms of
    /// order 1 summed in a different order), with several heads, groups and steps.
    #[test]
    fn matches_the_tensor_path_values_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 1e-5)] {
            for (shape, steps) in [([2, 2, 3, 7, 5], 3), ([1, 1, 1, 4, 2], 1)] {
                let (out, grads) = run(true, shape, steps, dtype);
                let (out_r, grads_r) = run(false, shape, steps, dtype);
                assert_close("out", &out, &out_r, tol);
                for (i, (g, r)) in grads.iter().zip(&grads_r).enumerate() {
                    assert_close(&format!("grad of input {i}"), g, r, tol);
                }
            }
        }
    }

    /// Central differences in f64 against the op's gradient (step 1e-5, tolerance 1e-6 as for the
    /// causal kernel).
    #[test]
    fn gradients_match_finite_differences() {
        let _alone = crate::autodiff::exclusive();
        let (shape, steps) = ([1, 1, 2, 3, 2], 2);
        let shapes = shapes(shape, steps);
        let base: Vec<Vec<f64>> = shapes.iter().zip(1..).map(|(s, seed)| values(s.iter().product(), seed)).collect();
        let make = |inputs: &[Vec<f64>], grad: bool| -> Vec<Tensor<AdFlex, 4>> {
            inputs
                .iter()
                .zip(&shapes)
                .map(|(x, s)| {
                    let t = Tensor::from_data(TensorData::new(x.clone(), *s), (&Default::default(), DType::F64));
                    if grad { t.require_grad() } else { t }
                })
                .collect()
        };
        let eval = |inputs: &[Vec<f64>]| host(objective(call(&make(inputs, false), true), 99))[0];
        let t = make(&base, true);
        let grads = objective(call(&t, true), 99).backward();
        let analytic: Vec<Vec<f64>> = t.iter().map(|x| host(x.grad(&grads).unwrap())).collect();
        assert_finite_differences(&base, &analytic, 1e-5, 1e-6, eval);
    }

    #[test]
    fn result_does_not_depend_on_the_thread_count() {
        let on = |threads: usize| on_threads(threads, || run(true, [2, 3, 2, 9, 4], 3, DType::F32));
        assert_eq!(on(1), on(3));
    }

    /// Without autodiff (drafting) the same values come out.
    #[test]
    fn inference_backend_matches() {
        let t: Vec<Tensor<Flex, 4>> =
            shapes([1, 2, 2, 5, 3], 2).into_iter().zip(1..).map(|(s, seed)| tensor(s, seed, DType::F32)).collect();
        assert_close("out", &host(call(&t, true)), &host(call(&t, false)), 1e-5);
    }
}
