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
use burn::tensor::{Bytes, Shape, Tensor, backend::Backend};
use rayon::prelude::*;

use crate::kernels::host::{
    AdTensor, HostFloat, OutPtr, Runtime, ad_primitive, backward_all, contiguous, flex_primitive, from_ad, from_flex,
    record, with_float,
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

impl<'a, T: HostFloat> Strided<'a, T> {
    /// `t` read in place, or `None` when its rows are not contiguous (or a stride is negative).
    fn of(t: &'a FlexTensor) -> Option<Self> {
        let layout = t.layout();
        let s = layout.strides();
        if s.len() != 4 || s[3] != 1 || s.iter().any(|&x| x < 0) {
            return None;
        }
        let strides = [s[0] as usize, s[1] as usize, s[2] as usize, 1];
        Some(Self { data: t.storage::<T>(), offset: layout.start_offset(), strides })
    }

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

/// `[B, H, L, d]` of `input`, checked against the `[L, d]` tables.
fn dims(input: &FlexTensor, cos: &FlexTensor) -> [usize; 4] {
    let s = input.layout().shape();
    assert!(s.len() == 4, "RoPE takes [B, H, L, d]");
    assert_eq!(cos.layout().shape().as_slice(), [s[2], s[3]], "RoPE tables are not [L, d]");
    assert!(s[3].is_multiple_of(2), "RoPE needs an even head dim");
    [s[0], s[1], s[2], s[3]]
}

/// `rotate(input row, cos row, sin row, output row)` for every `[b, h, t]` row of `input` (read
/// through its strides), into a dense tensor of input's shape laid out in the dimension order of
/// the strides `order_of`.
fn map_rows<T: HostFloat>(
    input: &FlexTensor,
    cos: &FlexTensor,
    sin: &FlexTensor,
    order_of: &[isize],
    rotate: impl Fn(&[T], &[T], &[T], &mut [T]) + Sync,
) -> FlexTensor {
    let shape = dims(input, cos);
    let [b, h, l, d] = shape;
    let (cos, sin) = (contiguous::<T>(cos), contiguous::<T>(sin));
    let copy;
    let x = match Strided::<T>::of(input) {
        Some(x) => x,
        None => {
            copy = input.to_contiguous();
            Strided::of(&copy).expect("contiguous")
        }
    };
    let strides = dense_like(&shape, order_of);
    let mut out = vec![T::ZERO; b * h * l * d];
    // One task per (b, h): its L rows are disjoint from every other task's whatever the order.
    let ptr = OutPtr(out.as_mut_ptr());
    (0..b * h).into_par_iter().for_each(|bh| {
        let (bi, hi) = (bh / h, bh % h);
        let ptr = &ptr;
        for t in 0..l {
            let at = bi * strides[0] + hi * strides[1] + t * strides[2];
            // SAFETY: distinct [b, h, t] index distinct dense rows of d inside `out`.
            let row = unsafe { std::slice::from_raw_parts_mut(ptr.at(at as isize), d) };
            rotate(x.row([bi, hi, t], d), &cos[t * d..][..d], &sin[t * d..][..d], row);
        }
    });
    let layout = Layout::new(Shape::from(shape.to_vec()), strides.map(|s| s as isize).to_vec(), 0);
    FlexTensor::new(Bytes::from_elems(out), layout, T::dtype())
}

/// Contiguous `[B, H, L, d]` output.
fn host_forward(x: &FlexTensor, cos: &FlexTensor, sin: &FlexTensor) -> FlexTensor {
    // Any decreasing strides order the dimensions as written: a row-major output.
    let contiguous_order = [3, 2, 1, 0];
    with_float!(x.dtype(), T => map_rows::<T>(x, cos, sin, &contiguous_order, |x, c, s, y| {
        let half = x.len() / 2;
        for i in 0..half {
            y[i] = x[i] * c[i] - x[i + half] * s[i];
            y[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
        }
    }))
}

/// `dx_j = g_j·cos_j + (j < d/2 ? g_{j+d/2}·sin_{j+d/2} : −g_{j−d/2}·sin_{j−d/2})`, in the memory
/// order of x (whose strides are `x_strides`; the gradient has x's shape).
fn host_backward(x_strides: &[isize], cos: &FlexTensor, sin: &FlexTensor, grad: &FlexTensor) -> FlexTensor {
    with_float!(grad.dtype(), T => map_rows::<T>(grad, cos, sin, x_strides, |g, c, s, y| {
        let half = g.len() / 2;
        for i in 0..half {
            y[i] = g[i] * c[i] + g[i + half] * s[i + half];
            y[i + half] = g[i + half] * c[i + half] - g[i] * s[i];
        }
    }))
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, TensorData};

    use super::*;
    use crate::kernels::host::AdFlex;
    use crate::kernels::host::testing::{assert_close, assert_finite_differences, host, on_threads, tensor, values};
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
        let _alone = crate::autodiff::exclusive();
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
        let _alone = crate::autodiff::exclusive();
        let [b, h, l, d] = [1, 2, 3, 4];
        let base = values(b * l * h * d, 1);
        let (cos, sin) = (tensor::<AdFlex, 2>([l, d], 2, DType::F64), tensor::<AdFlex, 2>([l, d], 3, DType::F64));
        let x_of = |v: Vec<f64>| {
            Tensor::<AdFlex, 4>::from_data(TensorData::new(v, [b, l, h, d]), (&Default::default(), DType::F64))
        };
        let eval = |v: &[Vec<f64>]| host(objective(apply(&x_of(v[0].clone()).swap_dims(1, 2), &cos, &sin).unwrap()))[0];
        let x = x_of(base.clone()).require_grad();
        let grads = objective(apply(&x.clone().swap_dims(1, 2), &cos, &sin).unwrap()).backward();
        assert_finite_differences(&[base], &[host(x.grad(&grads).unwrap())], 1e-5, 1e-6, eval);
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
