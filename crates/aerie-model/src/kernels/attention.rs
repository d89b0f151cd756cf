//! Causal attention over the TTT step-0 keys without keeping the score matrix.
//!
//! Every unrolled TTT step attends causally to the step-0 keys: a `[B, nKV, g·L, L]` score block
//! per step. Autodiff keeps the scores and the softmax of every step for the backward pass, which
//! at a Kimi-sized drafter (64 heads, L 2048, 7 steps) is 2–3 GiB per step, more memory than the
//! 1.2 B weights and their gradients together. On the CPU backend [`causal`] computes the block
//! in row chunks (FlashAttention's scheme, arXiv 2205.14135): the forward keeps only the output
//! and the row log-sum-exp, the backward recomputes each chunk's probabilities from them. Only
//! the keys at or before each query are multiplied, so it also does half the FLOPs.
//!
//! The result is `(softmax(S) · V, logsumexp(S))` per query row, which the drafter merges with the
//! later steps' diagonal scores (see `Eagle3Attention::forward_ttt`). Other backends and
//! half-precision dtypes take [`causal_reference`], the same function in burn tensor ops.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::flex::FlexTensor;
use burn::tensor::{Bool, Tensor, TensorData, backend::Backend};
use rayon::prelude::*;

use super::host::{
    AdTensor, HostFloat, Runtime, ad_primitive, backward_all, contiguous, flex_primitive, from_ad, from_flex,
    host_tensor, record, with_float,
};
use crate::precision::upcast;

/// Query rows per chunk: the chunk's scores (`CHUNK × L`) and their gradient stay in cache-sized
/// buffers, and the rows of a chunk share one pass over the keys.
const CHUNK: usize = 64;

/// `(softmax(q kᵀ + causal) v, logsumexp(q kᵀ + causal))` for `q: [B, nKV, g·L, d]` (already
/// scaled; row `r·L + t` is query position t, the grouped-query layout) and `k, v: [B, nKV, L, d]`;
/// returns `[B, nKV, g·L, d]` and `[B, nKV, g·L, 1]`, the latter in at least f32.
pub(crate) fn causal<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let packed: Option<Tensor<B, 4>> = match Runtime::of::<B>(&[q.dtype(), k.dtype(), v.dtype()]) {
        None => None,
        Some(Runtime::Autodiff) => {
            let [q, k, v] = [&q, &k, &v].map(|t| ad_primitive(t.clone()));
            Some(from_ad(autodiff_forward(q, k, v)))
        }
        Some(Runtime::Inference) => {
            let [q, k, v] = [&q, &k, &v].map(|t| flex_primitive(t.clone()));
            Some(from_flex(host_forward(&q, &k, &v)))
        }
    };
    match packed {
        Some(packed) => {
            let d = q.dims()[3];
            (packed.clone().narrow(3, 0, d), packed.narrow(3, d, 1))
        }
        None => causal_reference(q, k, v),
    }
}

/// [`causal`] in burn tensor ops with the full score block (every backend, every dtype).
pub(crate) fn causal_reference<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [b, nkv, gl, _] = q.dims();
    let l = k.dims()[2];
    let dtype = q.dtype();
    let mask = causal_mask::<B>(gl / l, l, &q.device()).expand([b, nkv, gl, l]);
    let s = upcast(q.matmul(k.swap_dims(2, 3))).mask_fill(mask, f32::NEG_INFINITY);
    let max = s.clone().detach().max_dim(3);
    let e = (s - max.clone()).exp();
    let sum = e.clone().sum_dim(3);
    let out = e.cast(dtype).matmul(v) / sum.clone().cast(dtype);
    (out, max + sum.log())
}

/// `[1, 1, g·L, L]` mask, true where key position s is after query position t (row `r·L + t`).
pub(crate) fn causal_mask<B: Backend>(groups: usize, l: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let mut mask = Vec::with_capacity(groups * l * l);
    for _ in 0..groups {
        for t in 0..l {
            mask.extend((0..l).map(|s| s > t));
        }
    }
    Tensor::from_data(TensorData::new(mask, [1, 1, groups * l, l]), device)
}

#[derive(Debug)]
struct CausalAttention;

impl Backward<Flex, 3> for CausalAttention {
    /// q, k, v and the packed `[out | lse]` output.
    type State = [FlexTensor; 4];

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_all(ops, grads, |[q, k, v, packed], grad| host_backward(&q, &k, &v, &packed, &grad));
    }
}

fn autodiff_forward(q: AdTensor, k: AdTensor, v: AdTensor) -> AdTensor {
    let packed = host_forward(&q.primitive, &k.primitive, &v.primitive);
    let state = [q.primitive.clone(), k.primitive.clone(), v.primitive.clone(), packed.clone()];
    record(CausalAttention, [&q, &k, &v], state, packed)
}

/// Shapes of one call: `bh = B·nKV` independent heads, `g·L` query rows, `L` keys, head dim `d`.
#[derive(Clone, Copy, Debug)]
struct Dims {
    bh: usize,
    groups: usize,
    l: usize,
    d: usize,
}

impl Dims {
    fn of(q: &FlexTensor, k: &FlexTensor, v: &FlexTensor) -> Self {
        let (qs, ks) = (q.layout().shape(), k.layout().shape());
        assert!(qs.len() == 4 && ks.len() == 4, "causal attention takes 4-D tensors");
        let (l, d) = (ks[2], ks[3]);
        assert!(l > 0 && qs[2] % l == 0, "query rows {} are not a multiple of the {l} keys", qs[2]);
        assert_eq!((qs[0], qs[1], qs[3]), (ks[0], ks[1], d), "q and k disagree");
        assert_eq!(v.layout().shape(), ks, "v and k disagree");
        Self { bh: qs[0] * qs[1], groups: qs[2] / l, l, d }
    }
}

/// The packed forward output `[B, nKV, g·L, d + 1]`: each row's output then its log-sum-exp.
fn host_forward(q: &FlexTensor, k: &FlexTensor, v: &FlexTensor) -> FlexTensor {
    let dims = Dims::of(q, k, v);
    let mut shape = q.layout().shape().clone();
    shape[3] = dims.d + 1;
    with_float!(q.dtype(), T => host_tensor(forward::<T>(dims, &contiguous(q), &contiguous(k), &contiguous(v)), &shape))
}

/// Gradients of q, k and v given the packed output and its packed gradient.
fn host_backward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    out: &FlexTensor,
    grad: &FlexTensor,
) -> [FlexTensor; 3] {
    let dims = Dims::of(q, k, v);
    with_float!(q.dtype(), T => {
        let [dq, dk, dv] = backward::<T>(
            dims,
            &contiguous(q),
            &contiguous(k),
            &contiguous(v),
            &contiguous(out),
            &contiguous(grad),
        );
        [host_tensor(dq, q.layout().shape()), host_tensor(dk, k.layout().shape()), host_tensor(dv, v.layout().shape())]
    })
}

/// Query chunks `(first position, rows)` of one group block of L rows.
fn chunks(l: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..l).step_by(CHUNK).map(move |t0| (t0, CHUNK.min(l - t0)))
}

/// `S = Q_c K[..n]ᵀ` into `s` (`c × n`, row stride n), for `c` query rows of stride `rsq`.
///
/// # Safety
/// `q` holds `c` rows of `d` at stride `rsq`, `k` at least `n` rows of `d`, `s` `c·n` values.
unsafe fn scores<T: HostFloat>(c: usize, n: usize, d: usize, q: *const T, rsq: usize, k: &[T], s: &mut [T]) {
    unsafe { T::gemm(c, d, n, q, rsq as isize, 1, k.as_ptr(), 1, d as isize, T::ZERO, s.as_mut_ptr(), n as isize) }
}

fn forward<T: HostFloat>(dims: Dims, q: &[T], k: &[T], v: &[T]) -> Vec<T> {
    let Dims { groups, l, d, .. } = dims;
    let mut out = vec![T::ZERO; dims.bh * groups * l * (d + 1)];
    // One task per (head, group) block of L query rows: their outputs are disjoint.
    out.par_chunks_mut(l * (d + 1)).enumerate().for_each(|(block, out)| {
        let head = block / groups;
        let q = &q[block * l * d..(block + 1) * l * d];
        let (k, v) = (&k[head * l * d..(head + 1) * l * d], &v[head * l * d..(head + 1) * l * d]);
        let mut s = vec![T::ZERO; CHUNK * l];
        for (t0, c) in chunks(l) {
            let n = t0 + c;
            let s = &mut s[..c * n];
            // SAFETY: rows t0..t0+c of q, the first n rows of k, and an s of c·n values.
            unsafe { scores(c, n, d, q[t0 * d..].as_ptr(), d, k, s) };
            for i in 0..c {
                let row = &mut s[i * n..(i + 1) * n];
                let valid = t0 + i + 1;
                let max = row[..valid].iter().copied().fold(T::NEG_INFINITY, |m, x| if x > m { x } else { m });
                let mut sum = T::ZERO;
                for x in &mut row[..valid] {
                    *x = (*x - max).exp();
                    sum = sum + *x;
                }
                for x in &mut row[..valid] {
                    *x = *x / sum;
                }
                row[valid..].fill(T::ZERO);
                out[(t0 + i) * (d + 1) + d] = max + sum.ln();
            }
            // SAFETY: P (c × n) times V's first n rows into c packed rows of stride d + 1.
            unsafe {
                T::gemm(
                    c,
                    n,
                    d,
                    s.as_ptr(),
                    n as isize,
                    1,
                    v.as_ptr(),
                    d as isize,
                    1,
                    T::ZERO,
                    out[t0 * (d + 1)..].as_mut_ptr(),
                    (d + 1) as isize,
                )
            };
        }
    });
    out
}

/// FlashAttention's backward per head: recompute `P = exp(S − lse)`, then `dV += Pᵀ dO`,
/// `dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O) + dlse)`, `dQ = dS K`, `dK += dSᵀ Q`. The g·L rows of a head
/// all add into its dK and dV, so a head is one task (its chunks in a fixed order: the result does
/// not depend on the thread count).
fn backward<T: HostFloat>(dims: Dims, q: &[T], k: &[T], v: &[T], out: &[T], grad: &[T]) -> [Vec<T>; 3] {
    let Dims { bh, groups, l, d } = dims;
    let (gl, w) = (groups * l, d + 1);
    let mut dq = vec![T::ZERO; bh * gl * d];
    let mut dk = vec![T::ZERO; bh * l * d];
    let mut dv = vec![T::ZERO; bh * l * d];
    dq.par_chunks_mut(gl * d).zip(dk.par_chunks_mut(l * d)).zip(dv.par_chunks_mut(l * d)).enumerate().for_each(
        |(head, ((dq, dk), dv))| {
            let q = &q[head * gl * d..(head + 1) * gl * d];
            let (k, v) = (&k[head * l * d..(head + 1) * l * d], &v[head * l * d..(head + 1) * l * d]);
            let (out, grad) = (&out[head * gl * w..(head + 1) * gl * w], &grad[head * gl * w..(head + 1) * gl * w]);
            let mut p = vec![T::ZERO; CHUNK * l];
            let mut ds = vec![T::ZERO; CHUNK * l];
            for group in 0..groups {
                for (t0, c) in chunks(l) {
                    let (r0, n) = (group * l + t0, t0 + c);
                    let (p, ds) = (&mut p[..c * n], &mut ds[..c * n]);
                    // SAFETY (every gemm below): row ranges r0..r0+c of q/out/grad/dq and the
                    // first n rows of k/v/dk/dv, all inside their head's slices; p and ds are c × n.
                    unsafe { scores(c, n, d, q[r0 * d..].as_ptr(), d, k, p) };
                    for i in 0..c {
                        let (row, valid) = (&mut p[i * n..(i + 1) * n], t0 + i + 1);
                        let lse = out[(r0 + i) * w + d];
                        for x in &mut row[..valid] {
                            *x = (*x - lse).exp();
                        }
                        row[valid..].fill(T::ZERO);
                    }
                    let d_out = grad[r0 * w..].as_ptr();
                    unsafe {
                        // dV[..n] += Pᵀ dO.
                        T::gemm(
                            n,
                            c,
                            d,
                            p.as_ptr(),
                            1,
                            n as isize,
                            d_out,
                            w as isize,
                            1,
                            T::ONE,
                            dv.as_mut_ptr(),
                            d as isize,
                        );
                        // dP = dO V[..n]ᵀ.
                        T::gemm(
                            c,
                            d,
                            n,
                            d_out,
                            w as isize,
                            1,
                            v.as_ptr(),
                            1,
                            d as isize,
                            T::ZERO,
                            ds.as_mut_ptr(),
                            n as isize,
                        );
                    }
                    for i in 0..c {
                        let r = r0 + i;
                        let (o, g) = (&out[r * w..r * w + d], &grad[r * w..r * w + d]);
                        let dot = o.iter().zip(g).fold(T::ZERO, |acc, (&a, &b)| acc + a * b);
                        let shift = grad[r * w + d] - dot;
                        for (x, &pij) in ds[i * n..(i + 1) * n].iter_mut().zip(&p[i * n..(i + 1) * n]) {
                            *x = pij * (*x + shift);
                        }
                    }
                    unsafe {
                        // dQ = dS K[..n].
                        T::gemm(
                            c,
                            n,
                            d,
                            ds.as_ptr(),
                            n as isize,
                            1,
                            k.as_ptr(),
                            d as isize,
                            1,
                            T::ZERO,
                            dq[r0 * d..].as_mut_ptr(),
                            d as isize,
                        );
                        // dK[..n] += dSᵀ Q.
                        T::gemm(
                            n,
                            c,
                            d,
                            ds.as_ptr(),
                            1,
                            n as isize,
                            q[r0 * d..].as_ptr(),
                            d as isize,
                            1,
                            T::ONE,
                            dk.as_mut_ptr(),
                            d as isize,
                        );
                    }
                }
            }
        },
    );
    [dq, dk, dv]
}

#[cfg(test)]
mod tests {
    use burn::tensor::DType;

    use super::super::host::AdFlex;
    use super::super::host::testing::{assert_close, assert_finite_differences, host, on_threads, tensor, values};
    use super::*;

    /// `Σ wo ∘ out + Σ wl ∘ lse` with fixed weights: exercises both outputs' gradients.
    fn objective<B: Backend>(out: Tensor<B, 4>, lse: Tensor<B, 4>, seed: u64) -> Tensor<B, 1> {
        let wo = tensor::<B, 4>(out.dims(), seed, out.dtype());
        let wl = tensor::<B, 4>(lse.dims(), seed + 1, lse.dtype());
        (out * wo).sum() + (lse * wl).sum()
    }

    type Grads = [Vec<f64>; 3];

    fn run(host_path: bool, shape: [usize; 5], dtype: DType) -> (Vec<f64>, Vec<f64>, Grads) {
        let _alone = crate::autodiff::exclusive();
        let [b, nkv, g, l, d] = shape;
        let q = tensor::<AdFlex, 4>([b, nkv, g * l, d], 1, dtype).require_grad();
        let k = tensor::<AdFlex, 4>([b, nkv, l, d], 2, dtype).require_grad();
        let v = tensor::<AdFlex, 4>([b, nkv, l, d], 3, dtype).require_grad();
        let (out, lse) = if host_path {
            causal(q.clone(), k.clone(), v.clone())
        } else {
            causal_reference(q.clone(), k.clone(), v.clone())
        };
        let grads = objective(out.clone(), lse.clone(), 10).backward();
        let grad = |t: &Tensor<AdFlex, 4>| host(t.grad(&grads).expect("gradient"));
        (host(out), host(lse), [grad(&q), grad(&k), grad(&v)])
    }

    /// Against the full-score tensor path, in f64 (agreement to rounding, 1e-10) and f32 (1e-4:
    /// sums of ~100 terms of size ~10 at f32's 6e-8 relative precision, different order), on
    /// shapes with several heads, groups and a query block that spans two chunks (L 70 > 64).
    #[test]
    fn matches_the_tensor_path_values_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 1e-4)] {
            let shape = [2, 2, 3, 70, 5];
            let (out, lse, grads) = run(true, shape, dtype);
            let (out_r, lse_r, grads_r) = run(false, shape, dtype);
            assert_close("out", &out, &out_r, tol);
            assert_close("lse", &lse, &lse_r, tol);
            for (name, (g, r)) in ["dq", "dk", "dv"].iter().zip(grads.iter().zip(&grads_r)) {
                assert_close(name, g, r, tol);
            }
        }
    }

    /// Central differences of the objective in f64 against the op's gradient (step 1e-5: error
    /// O(h²) ≈ 1e-10 on values of order 1, well inside the 1e-6 tolerance).
    #[test]
    fn gradients_match_finite_differences() {
        let _alone = crate::autodiff::exclusive();
        let [b, nkv, g, l, d] = [1, 1, 2, 5, 3];
        let shapes = [[b, nkv, g * l, d], [b, nkv, l, d], [b, nkv, l, d]];
        let base: Vec<Vec<f64>> = shapes.iter().zip(1..).map(|(s, seed)| values(s.iter().product(), seed)).collect();
        let eval = |inputs: &[Vec<f64>]| -> f64 {
            let t: Vec<Tensor<AdFlex, 4>> = inputs
                .iter()
                .zip(&shapes)
                .map(|(x, s)| Tensor::from_data(TensorData::new(x.clone(), *s), (&Default::default(), DType::F64)))
                .collect();
            let (out, lse) = causal(t[0].clone(), t[1].clone(), t[2].clone());
            objective(out, lse, 10).into_data().convert::<f64>().into_vec::<f64>().unwrap()[0]
        };
        let inputs: Vec<Tensor<AdFlex, 4>> = base
            .iter()
            .zip(&shapes)
            .map(|(x, s)| {
                Tensor::from_data(TensorData::new(x.clone(), *s), (&Default::default(), DType::F64)).require_grad()
            })
            .collect();
        let (out, lse) = causal(inputs[0].clone(), inputs[1].clone(), inputs[2].clone());
        let grads = objective(out, lse, 10).backward();
        let analytic: Vec<Vec<f64>> = inputs.iter().map(|x| host(x.grad(&grads).unwrap())).collect();
        assert_finite_differences(&base, &analytic, 1e-5, 1e-6, eval);
    }

    /// Each head and each query block is one task with a fixed order: bitwise the same result
    /// on 1 and 3 threads.
    #[test]
    fn result_does_not_depend_on_the_thread_count() {
        let on = |threads: usize| on_threads(threads, || run(true, [2, 3, 2, 90, 8], DType::F32));
        assert_eq!(on(1), on(3));
    }

    /// Without autodiff (drafting in `eval accept`) the same values come out.
    #[test]
    fn inference_backend_matches() {
        let shape = [1, 2, 2, 33, 4];
        let [b, nkv, g, l, d] = shape;
        let q = tensor::<Flex, 4>([b, nkv, g * l, d], 1, DType::F32);
        let k = tensor::<Flex, 4>([b, nkv, l, d], 2, DType::F32);
        let v = tensor::<Flex, 4>([b, nkv, l, d], 3, DType::F32);
        let (out, lse) = causal(q.clone(), k.clone(), v.clone());
        let (out_r, lse_r) = causal_reference(q, k, v);
        assert_close("out", &host(out), &host(out_r), 1e-5);
        assert_close("lse", &host(lse), &host(lse_r), 1e-5);
    }
}
