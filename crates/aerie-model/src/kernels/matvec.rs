//! A few rows times a weight matrix on burn-flex, reading the weights once: the native target's
//! decode step (M = 1) and verify pass (M = k + 1), and the drafter's steps.
//!
//! Those products are bound by reading the weights from memory (SmolLM2-135M: 0.54 GB of f32 per
//! token, against ≈ 24 GB/s on the 2-core development machine). `gemm` packs its operands into
//! its own layout at every call, so a decode step read and wrote the weights more than once: in a
//! perf profile of `aerie eval decode`, gemm's packing and its 4 × 4 kernel took 64% of the time.
//! Here each task streams its part of the weights once, in stored order (a chunk of weight rows,
//! or a block of columns of a transposed weight), with the M × K rows of `a` held in cache.
//!
//! The order of every output element's sum depends only on K and the weights' layout (fused
//! multiply-add chains over fixed chunks of k, added in a fixed order), so row i of the result does
//! not depend on the other rows, on M or on the thread count (tested): a verify pass computes
//! exactly the logits decoding would.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;

use super::host::{HostFloat, View, contiguous, host_tensor, view, with_float};

/// How the weights `b: [K, N]` are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `b[k, ·]` contiguous (the native target's `[in, out]` weights): out rows += a[i, k] · b[k, ·].
    Rows,
    /// `b[·, j]` contiguous (a transposed `[out, in]` weight, the drafter's): out[i, j] = a[i, ·] · b[·, j].
    Columns,
}

/// Up to this many rows of `a` (a decode step, M = 1; a chain verify pass, M = k + 1; a drafting
/// step) streaming the weights beats `gemm`; at M = 16 gemm's register tiles win (LM head
/// 576 × 49152 on two threads: 47 ms against 75 ms here, while at M = 4 27 ms here against 31 ms).
pub(crate) const MAX_ROWS: usize = 8;

/// Below this many weights one call on the calling thread beats a fork-join.
const SPLIT_THRESHOLD: usize = 1 << 17;

/// Weight rows per task of the row form. Each task streams its rows (one contiguous stretch of
/// memory) into its own M × N partial sums, which are then added in chunk order: a fixed split,
/// whatever the thread count. Splitting the columns instead would cut each weight row into pieces
/// of a few cache lines on the target's 576- and 1536-wide matrices.
const ROW_CHUNK: usize = 64;

/// Partial sums per dot product in the column form: k mod 64 picks the lane, so eight AVX2
/// registers of independent chains; the lanes are then added in a fixed pairwise tree.
const LANES: usize = 64;

/// `a · b` for `a: [M, K]` (any strides) and `b: [K, N]` with contiguous rows or columns, as a
/// contiguous `[M, N]` tensor; `None` when `b` has neither layout, or when the CPU lacks fused
/// multiply-add (x86-64 without AVX2 and FMA), where the caller keeps burn's matmul.
pub(crate) fn matmul(a: &FlexTensor, b: &FlexTensor) -> Option<FlexTensor> {
    matmul_on(isa()?, a, b)
}

/// [`matmul`] in a given variant of the kernels, which the CPU must support.
fn matmul_on(isa: Isa, a: &FlexTensor, b: &FlexTensor) -> Option<FlexTensor> {
    let (ad, bd) = (a.layout().shape().clone(), b.layout().shape().clone());
    let (m, k, n) = (ad[0], ad[1], bd[1]);
    assert_eq!(k, bd[0], "matmul: inner dimensions must match");
    let strides = b.layout().strides();
    let form = if strides[1] == 1 {
        Form::Rows
    } else if strides[0] == 1 {
        Form::Columns
    } else {
        return None;
    };
    Some(with_float!(a.dtype(), T => {
        if k == 0 || m * n == 0 {
            return Some(host_tensor(vec![T::ZERO; m * n], &Shape::from(vec![m, n])));
        }
        let (x, w) = (contiguous::<T>(a), view::<T>(b));
        // SAFETY: `w` addresses the k × n weights.
        let c = unsafe {
            match form {
                Form::Rows => by_rows(isa, &x, m, k, n, w),
                Form::Columns => by_columns(isa, &x, m, k, n, w),
            }
        };
        host_tensor(c, &Shape::from(vec![m, n]))
    }))
}

/// Whether to fork: the product is large enough, and there is more than one thread.
fn parallel(threads_worth_it: bool) -> bool {
    threads_worth_it && rayon::current_num_threads() > 1
}

/// Row form: chunks of [`ROW_CHUNK`] weight rows into partial sums, added in chunk order.
///
/// # Safety
/// `w` addresses k × n weights with contiguous rows.
unsafe fn by_rows<T: HostFloat>(isa: Isa, x: &[T], m: usize, k: usize, n: usize, w: View<T>) -> Vec<T> {
    use rayon::prelude::*;
    let chunks = k.div_ceil(ROW_CHUNK).max(1);
    let mut partial = vec![T::ZERO; chunks * m * n];
    // SAFETY: chunk t reads weight rows t·ROW_CHUNK.. inside k (caller's contract).
    let run = |(t, p): (usize, &mut [T])| unsafe {
        let k0 = t * ROW_CHUNK;
        run_on(isa, RowsChunk { x, k, n, w, k0, rows: ROW_CHUNK.min(k - k0), p })
    };
    if parallel(chunks > 1 && k * n >= SPLIT_THRESHOLD) {
        partial.par_chunks_mut(m * n).enumerate().for_each(run);
    } else {
        partial.chunks_mut(m * n).enumerate().for_each(run);
    }
    let (first, rest) = partial.split_at_mut(m * n);
    for p in rest.chunks(m * n) {
        for (c, &p) in first.iter_mut().zip(p) {
            *c = *c + p;
        }
    }
    partial.truncate(m * n);
    partial
}

/// Column form: blocks of output columns, each column's weights one contiguous dot product.
///
/// # Safety
/// `w` addresses k × n weights with contiguous columns.
unsafe fn by_columns<T: HostFloat>(isa: Isa, x: &[T], m: usize, k: usize, n: usize, w: View<T>) -> Vec<T> {
    use rayon::prelude::*;
    // Transposed out (c[j, i]) so that a block of columns is one contiguous slice.
    let mut ct = vec![T::ZERO; n * m];
    let split = parallel(k * n >= SPLIT_THRESHOLD);
    let block = if split { n.div_ceil(2 * rayon::current_num_threads()) } else { n };
    // SAFETY: block b covers columns b·block.. inside n (caller's contract).
    let run = |(b, out): (usize, &mut [T])| unsafe { run_on(isa, ColumnsBlock { x, m, k, w, j0: b * block, out }) };
    if split {
        ct.par_chunks_mut(block * m).enumerate().for_each(run);
    } else {
        ct.chunks_mut(block * m).enumerate().for_each(run);
    }
    let mut c = vec![T::ZERO; m * n];
    for (j, col) in ct.chunks(m).enumerate() {
        for (i, &v) in col.iter().enumerate() {
            c[i * n + j] = v;
        }
    }
    c
}

/// Which compiled variant of the kernels the CPU runs: they are written once, in portable code
/// that the compiler vectorises, and compiled for AVX-512 (the one-row product on two threads:
/// 18–20 GB/s against 16–17 GB/s for the AVX2 build on the development machine) and for AVX2.
/// Both give the same bits (the same fused multiply-adds in the same order; tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "aarch64")]
    Neon,
}

/// `None` without hardware fused multiply-add (there `mul_add` is a libm call per element and
/// burn's matmul is faster).
fn isa() -> Option<Isa> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static ISA: OnceLock<Option<Isa>> = OnceLock::new();
        *ISA.get_or_init(|| {
            let fma = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if fma && is_x86_feature_detected!("avx512f") {
                Some(Isa::Avx512)
            } else if fma {
                Some(Isa::Avx2)
            } else {
                None
            }
        })
    }
    #[cfg(target_arch = "aarch64")]
    {
        Some(Isa::Neon)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// A kernel body compiled once per [`Isa`]: [`run_on`] inlines `run` into a wrapper that has
/// the ISA's target features, so its loops vectorise for them (the pattern of `pulp::WithSimd`).
trait Kernel {
    /// # Safety
    /// The kernel's own contract (its pointers address what it reads).
    unsafe fn run(self);
}

/// Run `kernel` in the variant the CPU supports.
///
/// # Safety
/// The kernel's contract; `isa` came from [`isa`].
unsafe fn run_on<K: Kernel>(isa: Isa, kernel: K) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn avx512<K: Kernel>(kernel: K) {
        unsafe { kernel.run() }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2<K: Kernel>(kernel: K) {
        unsafe { kernel.run() }
    }
    // SAFETY: the CPU has the variant's features (`isa`).
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512(kernel),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2(kernel),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => kernel.run(),
        }
    }
}

/// Partial sums per column block of the row form: M × (this / M) values, 32 KiB in f32, stay in
/// L1 while the chunk's weight rows stream past (without blocking, the LM head's M × 49152 sums
/// went through L2 on every pass: 2.2× slower at M = 16).
const ROW_BLOCK_VALUES: usize = 8192;

/// Weight rows per pass over the partial sums: each pass loads and stores the sums once for this
/// many fused multiply-adds per element. Eight rather than four (the same chains, so the same bits)
/// halves that traffic; on the development machine, cold weights, two threads: SmolLM2's
/// 576 × 1536 product 0.13–0.16 ms against 0.20–0.23 ms at M = 1 and 0.14–0.20 against 0.25–0.27
/// at M = 2 (alternating builds, best of 20). Sixteen was slower on the LM head.
const WEIGHT_ROWS: usize = 8;

/// `p += x[:, k0..k0+rows] · w[k0..k0+rows, :]` (`p` is M × N), each element a chain of fused
/// multiply-adds in k order, [`WEIGHT_ROWS`] weight rows per pass over the partial sums. Rows `k0 .. k0 +
/// rows` of `w` (contiguous rows) are inside it.
struct RowsChunk<'a, T> {
    x: &'a [T],
    k: usize,
    n: usize,
    w: View<T>,
    k0: usize,
    rows: usize,
    p: &'a mut [T],
}

impl<T: HostFloat> Kernel for RowsChunk<'_, T> {
    #[inline(always)]
    unsafe fn run(self) {
        let Self { x, k, n, w, k0, rows, p } = self;
        let m = p.len() / n;
        let width = (ROW_BLOCK_VALUES / m).next_multiple_of(16);
        for j0 in (0..n).step_by(width) {
            let cols = width.min(n - j0);
            // SAFETY: inside the weights per the contract.
            let row =
                |kk: usize| unsafe { std::slice::from_raw_parts(w.ptr.offset(kk as isize * w.rs + j0 as isize), cols) };
            let mut kk = k0;
            while kk + WEIGHT_ROWS <= k0 + rows {
                let w: [&[T]; WEIGHT_ROWS] = std::array::from_fn(|q| row(kk + q));
                let a = |i: usize| -> [T; WEIGHT_ROWS] { std::array::from_fn(|q| x[i * k + kk + q]) };
                let mut rest = &mut p[..];
                let mut i = 0;
                // Four (then two) rows of sums per pass over the weights: each weight loaded
                // serves all of them, where one row per pass re-read the weights from L2 once per
                // row.
                while rest.len() >= 4 * n {
                    let (four, tail) = rest.split_at_mut(4 * n);
                    let (o01, o23) = four.split_at_mut(2 * n);
                    let ((o0, o1), (o2, o3)) = (o01.split_at_mut(n), o23.split_at_mut(n));
                    let o = [
                        &mut o0[j0..j0 + cols],
                        &mut o1[j0..j0 + cols],
                        &mut o2[j0..j0 + cols],
                        &mut o3[j0..j0 + cols],
                    ];
                    pass4(o, w, [a(i), a(i + 1), a(i + 2), a(i + 3)]);
                    (rest, i) = (tail, i + 4);
                }
                while rest.len() >= 2 * n {
                    let (pair, tail) = rest.split_at_mut(2 * n);
                    let (o0, o1) = pair.split_at_mut(n);
                    pass2(&mut o0[j0..j0 + cols], &mut o1[j0..j0 + cols], w, a(i), a(i + 1));
                    (rest, i) = (tail, i + 2);
                }
                if !rest.is_empty() {
                    pass1(&mut rest[j0..j0 + cols], w, a(i));
                }
                kk += WEIGHT_ROWS;
            }
            for kk in kk..k0 + rows {
                let w0 = row(kk);
                for (a, o) in x.chunks_exact(k).zip(p.chunks_exact_mut(n)) {
                    for (o, &w0) in o[j0..j0 + cols].iter_mut().zip(w0) {
                        *o = w0.mul_add(a[kk], *o);
                    }
                }
            }
        }
    }
}

/// `o + a · w` over R weights: one fused multiply-add chain in weight-row order.
#[inline(always)]
fn fma_chain<T: HostFloat, const R: usize>(mut o: T, w: [T; R], a: [T; R]) -> T {
    for q in 0..R {
        o = w[q].mul_add(a[q], o);
    }
    o
}

/// `o += a · w` over R weight rows, element by element.
#[inline(always)]
fn pass1<T: HostFloat, const R: usize>(o: &mut [T], w: [&[T]; R], a: [T; R]) {
    let n = o.len();
    let w: [&[T]; R] = std::array::from_fn(|q| &w[q][..n]);
    for j in 0..n {
        o[j] = fma_chain(o[j], std::array::from_fn(|q| w[q][j]), a);
    }
}

/// [`pass1`] for two rows of sums at once (the slices are distinct and cut to one length, so
/// LLVM vectorises the loop without alias or bounds checks once this is inlined).
#[inline(always)]
fn pass2<T: HostFloat, const R: usize>(o0: &mut [T], o1: &mut [T], w: [&[T]; R], a: [T; R], b: [T; R]) {
    let n = o0.len();
    let (o1, w): (&mut [T], [&[T]; R]) = (&mut o1[..n], std::array::from_fn(|q| &w[q][..n]));
    for j in 0..n {
        let wj: [T; R] = std::array::from_fn(|q| w[q][j]);
        (o0[j], o1[j]) = (fma_chain(o0[j], wj, a), fma_chain(o1[j], wj, b));
    }
}

/// [`pass1`] for four rows of sums at once.
#[inline(always)]
fn pass4<T: HostFloat, const R: usize>([o0, o1, o2, o3]: [&mut [T]; 4], w: [&[T]; R], [a, b, c, d]: [[T; R]; 4]) {
    let n = o0.len();
    let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
    let w: [&[T]; R] = std::array::from_fn(|q| &w[q][..n]);
    for j in 0..n {
        let wj: [T; R] = std::array::from_fn(|q| w[q][j]);
        (o0[j], o1[j], o2[j], o3[j]) =
            (fma_chain(o0[j], wj, a), fma_chain(o1[j], wj, b), fma_chain(o2[j], wj, c), fma_chain(o3[j], wj, d));
    }
}

/// `out[j, i] = x[i, :] · w[:, j0 + j]` for the `out.len() / m` columns from `j0` (contiguous
/// columns, inside `w`).
struct ColumnsBlock<'a, T> {
    x: &'a [T],
    m: usize,
    k: usize,
    w: View<T>,
    j0: usize,
    out: &'a mut [T],
}

impl<T: HostFloat> Kernel for ColumnsBlock<'_, T> {
    #[inline(always)]
    unsafe fn run(self) {
        let Self { x, m, k, w, j0, out } = self;
        for (j, out) in out.chunks_exact_mut(m).enumerate() {
            // SAFETY: inside the weights per the contract.
            let col = unsafe { std::slice::from_raw_parts(w.ptr.offset((j0 + j) as isize * w.cs), k) };
            for (o, a) in out.iter_mut().zip(x.chunks_exact(k)) {
                *o = dot(a, col);
            }
        }
    }
}

/// `Σ a[k] b[k]`: k mod [`LANES`] picks one of the fused multiply-add chains, which are then
/// added pairwise.
#[inline(always)]
fn dot<T: HostFloat>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let (ac, at) = a.as_chunks::<LANES>();
    let (bc, bt) = b.as_chunks::<LANES>();
    for (ac, bc) in ac.iter().zip(bc) {
        for l in 0..LANES {
            acc[l] = ac[l].mul_add(bc[l], acc[l]);
        }
    }
    for (l, (&a, &b)) in at.iter().zip(bt).enumerate() {
        acc[l] = a.mul_add(b, acc[l]);
    }
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            acc[l] = acc[l] + acc[l + half];
        }
        half /= 2;
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::super::host::testing::{on_threads, values};
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{DType, Tensor, TensorData};

    fn tensor(shape: [usize; 2], seed: u64, dtype: DType) -> Tensor<Flex, 2> {
        let v: Vec<f64> = values(shape[0] * shape[1], seed);
        Tensor::<Flex, 2>::from_data(TensorData::new(v, shape), &Default::default()).cast(dtype)
    }

    fn run(a: &Tensor<Flex, 2>, b: &Tensor<Flex, 2>) -> Vec<f64> {
        let (a, b) = (a.clone().into_primitive().tensor(), b.clone().into_primitive().tensor());
        let c = matmul(&a, &b).expect("kernel applies");
        let t = Tensor::<Flex, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(c));
        t.cast(DType::F64).into_data().into_vec::<f64>().unwrap()
    }

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum();
            }
        }
        c
    }

    fn f64s(t: &Tensor<Flex, 2>) -> Vec<f64> {
        t.clone().cast(DType::F64).into_data().into_vec::<f64>().unwrap()
    }

    /// Both weight layouts, f64 (1e-12: the same sum in another order) and f32 (1e-5 relative to
    /// the sum of |terms|, rounding over K ≤ 300 terms), M from 1 to 16, K and N not multiples of
    /// the lane count or block width, and a strided `a`.
    #[test]
    fn matches_the_naive_product_in_both_layouts() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            for &(m, k, n) in &[(1, 7, 5), (4, 300, 1100), (16, 129, 77), (3, 64, 2100), (7, 70, 130)] {
                let a = tensor([k, m], 1, dtype).transpose(); // strided [m, k]
                let b_rows = tensor([k, n], 2, dtype);
                let b_cols = tensor([n, k], 2, dtype).transpose(); // column-major [k, n]
                for (layout, b) in [("rows", b_rows), ("columns", b_cols)] {
                    let (av, bv) = (f64s(&a), f64s(&b));
                    let want = naive(&av, &bv, m, k, n);
                    let abs: Vec<f64> = {
                        let (aa, ba): (Vec<f64>, Vec<f64>) =
                            (av.iter().map(|v| v.abs()).collect(), bv.iter().map(|v| v.abs()).collect());
                        naive(&aa, &ba, m, k, n)
                    };
                    let got = run(&a, &b);
                    for (i, ((g, w), s)) in got.iter().zip(&want).zip(&abs).enumerate() {
                        assert!((g - w).abs() <= tol * (1.0 + s), "{dtype:?} {layout} {m}×{k}×{n} [{i}]: {g} vs {w}");
                    }
                }
            }
        }
    }

    /// The AVX2 build of the kernels gives the same bits as the AVX-512 one, in both layouts.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_avx512_builds_agree_bitwise() {
        if isa() != Some(Isa::Avx512) {
            return; // this CPU runs only the AVX2 build, which the other tests cover
        }
        let (m, k, n) = (5, 2 * ROW_CHUNK + 21, 333);
        let a = tensor([m, k], 11, DType::F32).into_primitive().tensor();
        for b in [tensor([k, n], 12, DType::F32), tensor([n, k], 12, DType::F32).transpose()] {
            let b = b.into_primitive().tensor();
            let bits = |isa| {
                let c = matmul_on(isa, &a, &b).expect("kernel applies");
                c.as_slice::<f32>().expect("contiguous").iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(bits(Isa::Avx2), bits(Isa::Avx512));
        }
    }

    /// The row form is, bitwise, one fused multiply-add chain in k order per chunk of
    /// [`ROW_CHUNK`] weight rows, the chunks' sums added in order.
    #[test]
    fn row_form_is_chunked_fma_chains() {
        let (m, k, n) = (3, 2 * ROW_CHUNK + 37, 50);
        let (a, b) = (tensor([m, k], 5, DType::F32), tensor([k, n], 6, DType::F32));
        let (av, bv) = (f64s(&a), f64s(&b));
        let got = run(&a, &b);
        for i in 0..m {
            for j in 0..n {
                let mut total = 0f32;
                for k0 in (0..k).step_by(ROW_CHUNK) {
                    let mut s = 0f32;
                    for kk in k0..(k0 + ROW_CHUNK).min(k) {
                        s = (bv[kk * n + j] as f32).mul_add(av[i * k + kk] as f32, s);
                    }
                    total = if k0 == 0 { s } else { total + s };
                }
                assert_eq!(got[i * n + j], total as f64, "[{i}, {j}]");
            }
        }
    }

    /// Row i of the product is the same bits whatever M and whatever the thread count, in both
    /// layouts, with N large enough to be split over threads, and M = 7 so that the row form
    /// runs its four-, two- and one-row passes.
    #[test]
    fn rows_do_not_depend_on_m_or_threads() {
        let (k, n) = (200, 3000);
        let a = tensor([7, k], 7, DType::F32);
        for b in [tensor([k, n], 8, DType::F32), tensor([n, k], 8, DType::F32).transpose()] {
            let all = on_threads(1, || run(&a, &b));
            assert_eq!(all, on_threads(3, || run(&a, &b)), "thread count changed the result");
            for i in 0..7 {
                let one = on_threads(2, || run(&a.clone().slice([i..i + 1, 0..k]), &b));
                assert_eq!(&all[i * n..(i + 1) * n], &one[..], "row {i} alone differs");
            }
        }
    }
}
