//! Writes into a batched KV cache in place: `block[i]` (`[h, n, d]`) goes to row `rows[i]`,
//! columns `cols[i]..cols[i] + n` of a `[R, h, C, d]` cache. And the rollback of a batch-1
//! cache to its first columns ([`keep_columns`]).
//!
//! Why: a decode step of R rows writes one column per row; burn-flex's `slice_assign` always
//! copies the whole destination first (it clones the tensor it was handed before writing), so R
//! writes per layer cost R copies of the cache, quadratic in the batch. On the CPU backend a
//! uniquely owned contiguous cache is written where it lies; anything else (another backend, a
//! shared or strided cache) takes burn's `slice_assign`.

use burn::tensor::{Shape, Tensor, backend::Backend};

use super::host::{Runtime, contiguous, flex_primitive, from_flex, host_tensor, with_float};

/// `cache` with `block[i]` written at (`rows[i]`, `cols[i]..`), every head.
pub(crate) fn write_rows<B: Backend>(
    cache: Tensor<B, 4>,
    block: Tensor<B, 4>,
    rows: &[usize],
    cols: &[usize],
) -> Tensor<B, 4> {
    let [r, h, c, d] = cache.dims();
    let [nb, hb, n, db] = block.dims();
    assert!(
        hb == h && db == d && nb == rows.len() && nb == cols.len(),
        "kv write: block {:?} into {:?}",
        block.dims(),
        cache.dims()
    );
    assert!(
        rows.iter().zip(cols).all(|(&row, &col)| row < r && col + n <= c),
        "kv write: a block lies outside the cache"
    );
    let (cache, block) = match Runtime::of::<B>(&[cache.dtype(), block.dtype()]) {
        Some(Runtime::Inference) => {
            let mut dst = flex_primitive(cache);
            let src = flex_primitive(block);
            let whole = dst.is_contiguous()
                && dst.layout().start_offset() == 0
                && dst.bytes().len() == r * h * c * d * dst.dtype().size();
            if whole {
                let written = with_float!(dst.dtype(), T => {
                    let src = contiguous::<T>(&src);
                    match dst.try_storage_mut::<T>() {
                        Some(out) => {
                            for (i, (&row, &col)) in rows.iter().zip(cols).enumerate() {
                                for head in 0..h {
                                    let to = ((row * h + head) * c + col) * d;
                                    let from = (i * h + head) * n * d;
                                    out[to..to + n * d].copy_from_slice(&src[from..from + n * d]);
                                }
                            }
                            true
                        }
                        None => false,
                    }
                });
                if written {
                    return from_flex(dst);
                }
            }
            (from_flex(dst), from_flex(src))
        }
        _ => (cache, block),
    };
    let mut cache = cache;
    for (i, (&row, &col)) in rows.iter().zip(cols).enumerate() {
        cache = cache.slice_assign([row..row + 1, 0..h, col..col + n, 0..d], block.clone().narrow(0, i, 1));
    }
    cache
}

/// The first `n` columns of a `[B, h, C, d]` cache, as a contiguous tensor.
///
/// Why: a rollback (speculative decoding's rejected drafts) narrowed the cache to a strided view,
/// and the next step's `cat` then gathered it element by element: in `eval decode` the forward
/// after a rollback cost about 5 ms more than one after an accepted draft (SmolLM2, 150 cached
/// positions, 30 layers), a verify-only cost that plain decoding never pays. Here each head's
/// first `n · d` values, already contiguous, are copied as one block.
pub(crate) fn keep_columns<B: Backend>(cache: Tensor<B, 4>, n: usize) -> Tensor<B, 4> {
    let [b, h, c, d] = cache.dims();
    assert!(n <= c, "kv keep: {n} columns of {c}");
    if n == c {
        return cache;
    }
    if Runtime::of::<B>(&[cache.dtype()]) != Some(Runtime::Inference) {
        return cache.narrow(2, 0, n);
    }
    let t = flex_primitive(cache);
    let kept = with_float!(t.dtype(), T => {
        let src = contiguous::<T>(&t);
        let mut out = Vec::with_capacity(b * h * n * d);
        for block in src.chunks_exact(c * d) {
            out.extend_from_slice(&block[..n * d]);
        }
        host_tensor(out, &Shape::from(vec![b, h, n, d]))
    });
    from_flex(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::host::testing::{host, tensor};
    use burn::backend::Flex;
    use burn::tensor::DType;

    /// The in-place path equals burn's `slice_assign`, also when the cache is shared (then the
    /// caller's other handle keeps the old values).
    #[test]
    fn in_place_write_equals_slice_assign() {
        let cache = tensor::<Flex, 4>([3, 2, 5, 4], 1, DType::F32);
        let block = tensor::<Flex, 4>([2, 2, 2, 4], 2, DType::F32);
        let (rows, cols) = ([2, 0], [3, 1]);
        let mut want = cache.clone();
        for i in 0..2 {
            want = want
                .slice_assign([rows[i]..rows[i] + 1, 0..2, cols[i]..cols[i] + 2, 0..4], block.clone().narrow(0, i, 1));
        }
        let before = host(cache.clone());
        let shared = cache.clone();
        let got_shared = write_rows(cache, block.clone(), &rows, &cols);
        assert_eq!(host(got_shared.clone()), host(want.clone()));
        assert_eq!(host(shared), before, "a shared cache is copied, not written under its other owner");
        let got = write_rows(got_shared, block, &rows, &cols);
        assert_eq!(host(got), host(want));
    }

    /// The kept columns equal burn's `narrow`, from a contiguous and from a strided cache.
    #[test]
    fn keep_columns_equals_narrow() {
        let cache = tensor::<Flex, 4>([2, 3, 7, 4], 3, DType::F32);
        for n in [1, 5, 7] {
            assert_eq!(host(keep_columns(cache.clone(), n)), host(cache.clone().narrow(2, 0, n)), "n = {n}");
        }
        let strided = cache.clone().narrow(2, 0, 6);
        assert_eq!(host(keep_columns(strided.clone(), 2)), host(strided.narrow(2, 0, 2)));
    }
}
