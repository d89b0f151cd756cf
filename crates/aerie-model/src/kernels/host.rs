//! What the host kernels share: recognising burn-flex behind a generic backend, moving tensors
//! between the generic and the concrete type, and the float types they run in.
//!
//! The kernels ([`super::mm`], [`super::matvec`], [`super::attention`], [`super::diagonal`],
//! [`super::swiglu`], [`super::rms_norm`], RoPE's in `rope/kernel.rs` and the TTT loss in
//! `ttt/fused.rs`) replace chains of burn-flex ops whose intermediate tensors autodiff would keep,
//! or which burn-flex runs slowly; every other backend (a GPU) and every other dtype keeps burn's
//! own ops.

use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::ops::{Add, Div, Mul, Sub};

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::{Autodiff, Flex};
use burn::tensor::{Bytes, DType, Shape, Tensor, TensorPrimitive, backend::Backend};

pub(crate) type AdFlex = Autodiff<Flex>;
pub(crate) type AdTensor = burn::tensor::ops::FloatTensor<AdFlex>;

/// Which host kernel applies to a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runtime {
    /// `Autodiff<Flex>`: forward on the host, backward registered as an autodiff op.
    Autodiff,
    /// `Flex`: forward only.
    Inference,
}

impl Runtime {
    /// The host kernel for backend `B` when every operand is f32, or every one f64.
    pub(crate) fn of<B: Backend>(dtypes: &[DType]) -> Option<Self> {
        let first = *dtypes.first()?;
        if !matches!(first, DType::F32 | DType::F64) || dtypes.iter().any(|&d| d != first) {
            return None;
        }
        if TypeId::of::<B>() == TypeId::of::<AdFlex>() {
            Some(Self::Autodiff)
        } else if TypeId::of::<B>() == TypeId::of::<Flex>() {
            Some(Self::Inference)
        } else {
            None
        }
    }
}

/// The identity between two names of one type (checked by [`Runtime::of`]'s `TypeId` test).
fn cast<S: 'static, T: 'static>(x: S) -> T {
    *(Box::new(x) as Box<dyn Any>).downcast::<T>().expect("same type")
}

/// The autodiff primitive of a tensor whose backend is `Autodiff<Flex>` ([`Runtime::Autodiff`]).
pub(crate) fn ad_primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> AdTensor {
    cast::<_, Tensor<AdFlex, D>>(t).into_primitive().tensor()
}

/// The host tensor of a tensor whose backend is `Flex` ([`Runtime::Inference`]).
pub(crate) fn flex_primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FlexTensor {
    cast::<_, Tensor<Flex, D>>(t).into_primitive().tensor()
}

/// Back from [`ad_primitive`].
pub(crate) fn from_ad<B: Backend, const D: usize>(t: AdTensor) -> Tensor<B, D> {
    cast(Tensor::<AdFlex, D>::from_primitive(TensorPrimitive::Float(t)))
}

/// Back from [`flex_primitive`].
pub(crate) fn from_flex<B: Backend, const D: usize>(t: FlexTensor) -> Tensor<B, D> {
    cast(Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(t)))
}

/// Put `out`, computed on the host from `inputs`, into the autodiff graph as the output of `op`,
/// which keeps `state` for its backward when any input is tracked.
pub(crate) fn record<Op: Backward<Flex, N>, const N: usize>(
    op: Op,
    inputs: [&AdTensor; N],
    state: Op::State,
    out: FlexTensor,
) -> AdTensor {
    match op.prepare::<NoCheckpointing>(inputs.map(|t| t.node.clone())).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// The body of a host op's backward: `gradients(state, output gradient)` gives one gradient per
/// input, handed to the inputs that are tracked.
pub(crate) fn backward_all<S, const N: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    gradients: impl FnOnce(S, FlexTensor) -> [FlexTensor; N],
) {
    let grad = grads.consume::<Flex>(&ops.node);
    for (parent, g) in ops.parents.into_iter().zip(gradients(ops.state, grad)) {
        if let Some(node) = parent {
            grads.register::<Flex>(node.id, g);
        }
    }
}

/// An output buffer written by parallel tasks at disjoint offsets.
pub(crate) struct OutPtr<T>(pub(crate) *mut T);
unsafe impl<T> Send for OutPtr<T> {}
unsafe impl<T> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// # Safety
    /// `off` stays inside the output.
    pub(crate) unsafe fn at(&self, off: isize) -> *mut T {
        unsafe { self.0.offset(off) }
    }
}

/// A read-only matrix operand for the parallel kernels: base pointer (at the layout's start
/// offset) and row/column strides.
pub(crate) struct View<T> {
    pub(crate) ptr: *const T,
    pub(crate) rs: isize,
    pub(crate) cs: isize,
}

impl<T> Clone for View<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for View<T> {}

// Read-only views into tensors that outlive the parallel section.
unsafe impl<T> Send for View<T> {}
unsafe impl<T> Sync for View<T> {}

/// The [`View`] of a 2-D tensor.
pub(crate) fn view<T: bytemuck::Pod + burn::tensor::Element>(t: &FlexTensor) -> View<T> {
    let layout = t.layout();
    let s = layout.strides();
    // SAFETY: the start offset is inside the storage the layout describes.
    let ptr = unsafe { t.storage::<T>().as_ptr().add(layout.start_offset()) };
    View { ptr, rs: s[0], cs: s[1] }
}

/// The tensor's values in row-major order, borrowed when already laid out so.
pub(crate) fn contiguous<T: HostFloat>(t: &FlexTensor) -> Cow<'_, [T]> {
    match t.as_slice::<T>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(t.to_contiguous().as_slice::<T>().expect("contiguous copy").to_vec()),
    }
}

/// A contiguous host tensor of `shape` holding `values`.
pub(crate) fn host_tensor<T: HostFloat>(values: Vec<T>, shape: &Shape) -> FlexTensor {
    FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(shape.clone()), T::dtype())
}

/// Evaluate `$body` with the type name `$T` bound to the float type of `$dtype` (the host kernels
/// are only dispatched for f32 and f64, see [`Runtime::of`]).
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            burn::tensor::DType::F32 => {
                type $T = f32;
                $body
            }
            burn::tensor::DType::F64 => {
                type $T = f64;
                $body
            }
            other => unreachable!("host kernel called in {other:?}"),
        }
    };
}
pub(crate) use with_float;

/// The float types the host kernels run in.
pub(crate) trait HostFloat:
    bytemuck::Pod
    + burn::tensor::Element
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    /// `self · a + b` rounded once (an FMA instruction where the CPU has one, libm's `fma`
    /// otherwise).
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// `C ← A B + β C` (the `gemm` crate on strided operands, single-threaded; C is not read when
    /// β = 0).
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
    );
}

macro_rules! host_float {
    ($t:ty) => {
        impl HostFloat for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            unsafe fn gemm(
                m: usize,
                k: usize,
                n: usize,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
            ) {
                // gemm: dst := alpha·dst + beta·lhs·rhs; `read_dst` false ignores dst's contents.
                unsafe {
                    gemm::gemm::<$t>(
                        m,
                        n,
                        k,
                        c,
                        1,
                        rsc,
                        beta != 0.0,
                        a,
                        csa,
                        rsa,
                        b,
                        csb,
                        rsb,
                        beta,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            }
        }
    };
}
host_float!(f32);
host_float!(f64);

#[cfg(test)]
pub(crate) mod testing {
    use burn::tensor::{DType, Tensor, TensorData, backend::Backend};

    /// Deterministic values in [-2, 2) (xorshift).
    pub(crate) fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
            })
            .collect()
    }

    /// A tensor of [`values`] made in f64, then cast to `dtype`.
    pub(crate) fn tensor<B: Backend, const D: usize>(shape: [usize; D], seed: u64, dtype: DType) -> Tensor<B, D> {
        let n = shape.iter().product();
        Tensor::<B, D>::from_data(TensorData::new(values(n, seed), shape), (&Default::default(), DType::F64))
            .cast(dtype)
    }

    pub(crate) fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
        t.into_data().convert::<f64>().into_vec::<f64>().unwrap()
    }

    /// `f` on a rayon pool of `threads` threads.
    pub(crate) fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(f)
    }

    /// Central differences of `eval` around `base` (every element of every input, step `h`)
    /// against the op's gradients `analytic`: |analytic − numeric| ≤ tol·(1 + |numeric|).
    pub(crate) fn assert_finite_differences(
        base: &[Vec<f64>],
        analytic: &[Vec<f64>],
        h: f64,
        tol: f64,
        eval: impl Fn(&[Vec<f64>]) -> f64,
    ) {
        for (which, analytic) in analytic.iter().enumerate() {
            for i in 0..base[which].len() {
                let (mut plus, mut minus) = (base.to_vec(), base.to_vec());
                plus[which][i] += h;
                minus[which][i] -= h;
                let numeric = (eval(&plus) - eval(&minus)) / (2.0 * h);
                assert!(
                    (analytic[i] - numeric).abs() <= tol * (1.0 + numeric.abs()),
                    "input {which}[{i}]: analytic {} vs numeric {numeric}",
                    analytic[i]
                );
            }
        }
    }

    pub(crate) fn assert_close(what: &str, x: &[f64], y: &[f64], tol: f64) {
        assert_eq!(x.len(), y.len(), "{what}: lengths");
        for (i, (a, b)) in x.iter().zip(y).enumerate() {
            assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what}[{i}]: {a} vs {b}");
        }
    }
}
