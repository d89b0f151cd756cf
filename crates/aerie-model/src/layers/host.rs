//! What the host kernels of this module share: recognising burn-flex behind a generic backend,
//! moving tensors between the generic and the concrete type, and the float types they run in.
//!
//! The kernels ([`super::mm`], [`super::attention`], [`super::swiglu`], [`super::rms_norm`]) replace
//! chains of burn-flex ops whose intermediate tensors autodiff would keep, or which burn-flex runs
//! slowly; every other backend (a GPU) and every other dtype keeps burn's own ops.

use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::ops::{Add, Div, Mul, Sub};

use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, backend::Backend};

pub(crate) type AdFlex = Autodiff<Flex>;

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

/// The identity between two names of one type (checked by the caller's `TypeId` test).
pub(crate) fn cast<S: 'static, T: 'static>(x: S) -> T {
    *(Box::new(x) as Box<dyn Any>).downcast::<T>().expect("same type")
}

/// The tensor's values in row-major order, borrowed when already laid out so.
pub(crate) fn contiguous<T: HostFloat>(t: &FlexTensor) -> Cow<'_, [T]> {
    match t.as_slice::<T>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(t.to_contiguous().as_slice::<T>().expect("contiguous copy").to_vec()),
    }
}

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
    fn from_f64(v: f64) -> Self;
    /// `C ← α A B + β C` (`matrixmultiply`'s strided gemm, single-threaded).
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
    ($t:ty, $gemm:path) => {
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
            fn from_f64(v: f64) -> Self {
                v as $t
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
                unsafe { $gemm(m, k, n, 1.0, a, rsa, csa, b, rsb, csb, beta, c, rsc, 1) }
            }
        }
    };
}
host_float!(f32, matrixmultiply::sgemm);
host_float!(f64, matrixmultiply::dgemm);

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

    pub(crate) fn assert_close(what: &str, x: &[f64], y: &[f64], tol: f64) {
        assert_eq!(x.len(), y.len(), "{what}: lengths");
        for (i, (a, b)) in x.iter().zip(y).enumerate() {
            assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what}[{i}]: {a} vs {b}");
        }
    }
}
