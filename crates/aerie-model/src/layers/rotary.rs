//! RoPE applied on the host: `x·cos + rotate_half(x)·sin` as one pass per row.
//!
//! In burn ops ([`crate::rope::apply`]'s reference path) that is two narrows, a negation, a `cat`
//! and two broadcast products, forward and backward, over a strided view (the heads of a
//! projection are `[B, L, H, d]` swapped to `[B, H, L, d]`): burn-flex runs all of them element by
//! element through strided iterators, and the gradient comes back to the projection through a
//! strided reshape copy. On the CPU backend [`apply`] reads x through its strides, writes a
//! contiguous `[B, H, L, d]` output (the drafter reshapes it for grouped-query attention next)
//! and writes x's gradient in x's own memory order, so the swap and reshape before it are free in
//! the backward too.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, Element, Shape, Tensor, backend::Backend};
use rayon::prelude::*;

use super::host::{
    AdTensor, HostFloat, Runtime, ad_primitive, backward_all, contiguous, flex_primitive, from_ad, from_flex,
    host_tensor, record, with_float,
};

/// `x·cos + rotate_half(x)·sin` for `x: [B, H, L, d]` and constant tables `[L, d]` of x's dtype,
/// or `None` where the host kernel does not apply (another backend or dtype, tracked tables).
pub(crate) fn apply<B: Backend>(x: &Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Option<Tensor<B, 4>> {
    Some(match Runtime::of::<B>(&[x.dtype(), cos.dtype(), sin.dtype()])? {
        Runtime::Autodiff => {
            let [x, cos, sin] = [ad_primitive(x.clone()), ad_primitive(cos.clone()), ad_primitive(sin.clone())];
            if cos.is_tracked() || sin.is_tracked() {
                return None;
            }
            from_ad(autodiff_forward(x, cos.primitive, sin.primitive))
        }
        Runtime::Inference => {
            let [cos, sin] = [flex_primitive(cos.clone()), flex_primitive(sin.clone())];
            from_flex(host_forward(&flex_primitive(x.clone()), &cos, &sin))
        }
    })
}

#[derive(Debug)]
struct RotaryOp;

impl Backward<Flex, 1> for RotaryOp {
    /// x's strides (its values are not needed: the op is linear in x, and keeping x would hold
    /// the projection's output alive until the backward), cos, sin.
    type State = (Vec<isize>, FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_all(ops, grads, |(x_strides, cos, sin), grad| [host_backward(&x_strides, &cos, &sin, &grad)]);
    }
}

fn autodiff_forward(x: AdTensor, cos: FlexTensor, sin: FlexTensor) -> AdTensor {
    let out = host_forward(&x.primitive, &cos, &sin);
    let state = (x.primitive.layout().strides().to_vec(), cos, sin);
    record(RotaryOp, [&x], state, out)
}

/// A 4-D operand read through its strides; rows of `d` must be contiguous.
#[derive(Clone, Copy)]
struct Strided<'a, T> {
    data: &'a [T],
    offset: usize,
    strides: [usize; 4],
}

impl<'a, T> Strided<'a, T> {
    /// The row `[b, h, t, ..]`.
    fn row(&self, [b, h, t]: [usize; 3], d: usize) -> &'a [T] {
        let s = self.strides;
        &self.data[self.offset + b * s[0] + h * s[1] + t * s[2]..][..d]
    }
}

/// Strides of a dense tensor of `shape` laid out in the same dimension order as `strides` (the
/// largest stride outermost); the last dimension stays innermost.
fn dense_like(shape: &[usize], strides: &[isize]) -> [usize; 4] {
    let mut order = [0, 1, 2];
    order.sort_by_key(|&i| std::cmp::Reverse(strides[i]));
    let mut out = [0, 0, 0, 1];
    let mut step = shape[3];
    for &i in order.iter().rev() {
        out[i] = step;
        step *= shape[i];
    }
    out
}

/// `f(x_row, out_row, table row t)` for every `[b, h, t]` row, rows written through `out_strides`.
fn for_rows<T: HostFloat>(
    x: Strided<'_, T>,
    shape: [usize; 4],
    out_strides: [usize; 4],
    f: impl Fn(&[T], &mut [T], usize) + Sync,
) -> Vec<T> {
    let [b, h, l, d] = shape;
    let mut out = vec![T::ZERO; b * h * l * d];
    // One task per (b, h): its L rows are disjoint from every other task's whatever the layout.
    let out_ptr = SendPtr(out.as_mut_ptr());
    (0..b * h).into_par_iter().for_each(|bh| {
        let (bi, hi) = (bh / h, bh % h);
        let ptr = &out_ptr;
        for t in 0..l {
            let at = bi * out_strides[0] + hi * out_strides[1] + t * out_strides[2];
            // SAFETY: distinct [b, h, t] index distinct dense rows of d inside `out`.
            let row = unsafe { std::slice::from_raw_parts_mut(ptr.0.add(at), d) };
            f(x.row([bi, hi, t], d), row, t);
        }
    });
    out
}

struct SendPtr<T>(*mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

fn strided<T: HostFloat>(t: &FlexTensor) -> Option<Strided<'_, T>> {
    let layout = t.layout();
    let s = layout.strides();
    if s.len() != 4 || s[3] != 1 || s.iter().any(|&x| x < 0) {
        return None;
    }
    let strides = [s[0] as usize, s[1] as usize, s[2] as usize, 1];
    Some(Strided { data: t.storage::<T>(), offset: layout.start_offset(), strides })
}

fn dims(x: &FlexTensor, cos: &FlexTensor) -> [usize; 4] {
    shape_of(x.layout().shape(), cos)
}

fn shape_of(s: &Shape, cos: &FlexTensor) -> [usize; 4] {
    assert!(s.len() == 4, "RoPE takes [B, H, L, d]");
    assert_eq!(cos.layout().shape().as_slice(), [s[2], s[3]], "RoPE tables are not [L, d]");
    assert!(s[3].is_multiple_of(2), "RoPE needs an even head dim");
    [s[0], s[1], s[2], s[3]]
}

/// Contiguous `[B, H, L, d]` output.
fn host_forward(x: &FlexTensor, cos: &FlexTensor, sin: &FlexTensor) -> FlexTensor {
    let shape = dims(x, cos);
    let d = shape[3];
    let half = d / 2;
    with_float!(x.dtype(), T => {
        let (cos, sin) = (contiguous::<T>(cos), contiguous::<T>(sin));
        let owned;
        let xs = match strided::<T>(x) {
            Some(s) => s,
            None => {
                owned = x.to_contiguous();
                strided::<T>(&owned).expect("contiguous")
            }
        };
        let dense = [shape[1] * shape[2] * d, shape[2] * d, d, 1];
        let out = for_rows(xs, shape, dense, |x, y, t| {
            let (c, s) = (&cos[t * d..][..d], &sin[t * d..][..d]);
            for i in 0..half {
                y[i] = x[i] * c[i] - x[i + half] * s[i];
                y[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
            }
        });
        host_tensor(out, &Shape::from(shape.to_vec()))
    })
}

/// `dx_j = g_j·cos_j + (j < d/2 ? g_{j+d/2}·sin_{j+d/2} : −g_{j−d/2}·sin_{j−d/2})`, in the memory
/// order of x (whose strides are `x_strides`; the gradient has x's shape).
fn host_backward(x_strides: &[isize], cos: &FlexTensor, sin: &FlexTensor, grad: &FlexTensor) -> FlexTensor {
    let shape = shape_of(grad.layout().shape(), cos);
    let d = shape[3];
    let half = d / 2;
    with_float!(grad.dtype(), T => {
        let (cos, sin) = (contiguous::<T>(cos), contiguous::<T>(sin));
        let owned;
        let gs = match strided::<T>(grad) {
            Some(s) => s,
            None => {
                owned = grad.to_contiguous();
                strided::<T>(&owned).expect("contiguous")
            }
        };
        let out_strides = dense_like(&shape, x_strides);
        let dx = for_rows(gs, shape, out_strides, |g, y, t| {
            let (c, s) = (&cos[t * d..][..d], &sin[t * d..][..d]);
            for i in 0..half {
                y[i] = g[i] * c[i] + g[i + half] * s[i + half];
                y[i + half] = g[i + half] * c[i + half] - g[i] * s[i];
            }
        });
        let layout = Layout::new(Shape::from(shape.to_vec()), out_strides.map(|s| s as isize).to_vec(), 0);
        FlexTensor::new(Bytes::from_elems(dx), layout, T::dtype())
    })
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, TensorData};

    use super::super::host::AdFlex;
    use super::super::host::testing::{assert_close, host, on_threads, tensor, values};
    use super::*;
    use crate::rope::apply_reference;

    /// `[B, L, H, d]` swapped to `[B, H, L, d]`, the drafter's head view (strided).
    fn heads<B: Backend>(shape: [usize; 4], seed: u64, dtype: DType) -> Tensor<B, 4> {
        let [b, h, l, d] = shape;
        tensor::<B, 4>([b, l, h, d], seed, dtype).swap_dims(1, 2)
    }

    fn objective<B: Backend>(y: Tensor<B, 4>) -> Tensor<B, 1> {
        let w = tensor::<B, 4>(y.dims(), 50, y.dtype());
        (y * w).sum()
    }

    fn run(host_path: bool, shape: [usize; 4], dtype: DType) -> (Vec<f64>, Vec<f64>) {
        let [_, _, l, d] = shape;
        let x = tensor::<AdFlex, 4>([shape[0], l, shape[1], d], 1, dtype).require_grad();
        let xh = x.clone().swap_dims(1, 2);
        let (cos, sin) = (tensor::<AdFlex, 2>([l, d], 2, dtype), tensor::<AdFlex, 2>([l, d], 3, dtype));
        let y = if host_path { apply(&xh, &cos, &sin).expect("host path") } else { apply_reference(xh, &cos, &sin) };
        let grads = objective(y.clone()).backward();
        (host(y), host(x.grad(&grads).expect("gradient")))
    }

    /// Against the tensor path: exact in f64 up to rounding (1e-12), f32 to 1e-6 (two products
    /// and a sum per element).
    #[test]
    fn matches_the_tensor_path_values_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let (y, g) = run(true, [2, 3, 5, 8], dtype);
            let (y_r, g_r) = run(false, [2, 3, 5, 8], dtype);
            assert_close("y", &y, &y_r, tol);
            assert_close("dx", &g, &g_r, tol);
        }
    }

    /// Central differences in f64 (step 1e-5; the op is linear in x, so only rounding remains).
    #[test]
    fn gradients_match_finite_differences() {
        let [b, h, l, d] = [1, 2, 3, 4];
        let base = values(b * l * h * d, 1);
        let (cos, sin) = (tensor::<AdFlex, 2>([l, d], 2, DType::F64), tensor::<AdFlex, 2>([l, d], 3, DType::F64));
        let x_of = |v: Vec<f64>| {
            Tensor::<AdFlex, 4>::from_data(TensorData::new(v, [b, l, h, d]), (&Default::default(), DType::F64))
        };
        let eval = |v: Vec<f64>| host(objective(apply(&x_of(v).swap_dims(1, 2), &cos, &sin).unwrap()))[0];
        let x = x_of(base.clone()).require_grad();
        let grads = objective(apply(&x.clone().swap_dims(1, 2), &cos, &sin).unwrap()).backward();
        let analytic = host(x.grad(&grads).unwrap());
        for i in 0..base.len() {
            let (mut plus, mut minus) = (base.clone(), base.clone());
            plus[i] += 1e-5;
            minus[i] -= 1e-5;
            let numeric = (eval(plus) - eval(minus)) / 2e-5;
            assert!(
                (analytic[i] - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "x[{i}]: {} vs {numeric}",
                analytic[i]
            );
        }
    }

    #[test]
    fn result_does_not_depend_on_the_thread_count() {
        let on = |threads: usize| on_threads(threads, || run(true, [2, 3, 7, 6], DType::F32));
        assert_eq!(on(1), on(3));
    }

    /// Without autodiff, and on a contiguous input, the same values come out.
    #[test]
    fn inference_backend_and_contiguous_input() {
        let shape = [1, 2, 4, 6];
        let (cos, sin) = (tensor::<Flex, 2>([4, 6], 2, DType::F32), tensor::<Flex, 2>([4, 6], 3, DType::F32));
        for x in [heads::<Flex>(shape, 1, DType::F32), tensor::<Flex, 4>(shape, 1, DType::F32)] {
            let y = apply(&x, &cos, &sin).expect("host path");
            assert_close("y", &host(y), &host(apply_reference(x, &cos, &sin)), 1e-6);
        }
    }
}
