//! Borrowed views of one sample inside a memory-mapped shard. Nothing is copied on access except
//! where the bytes cannot be reinterpreted in place (a misaligned tensor from a foreign writer):
//! for an f32 dataset, [`HiddenRows::as_f32`] hands the trainer the mapped pages themselves, so
//! reading `aux_hidden` costs page faults, not copies. Keep it that way: a copy of aux_hidden per
//! step is the dominant cost of a data loader at Ht = 7168.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::path::Path;

use super::codec;
use super::encoding::FloatDtype;
use super::encoding::{self, HiddenDtype};
use super::header::Shard;
use crate::{Error, Result};

/// Per-dataset widths and dtypes the views need.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) aux_width: usize,
    pub(crate) hidden_size: usize,
    pub(crate) dtype: HiddenDtype,
    /// K, or 0 without a top-k teacher.
    pub(crate) k: usize,
    /// Storage of `teacher_topk_logprobs`: the same in every shard.
    pub(crate) logprobs_dtype: Option<FloatDtype>,
    /// The target vocabulary V: token ids lie in `0..V`.
    pub(crate) vocab: usize,
}

/// One sample: `len()` tokens of every tensor, borrowed from the dataset.
#[derive(Clone, Copy)]
pub struct SampleView<'a> {
    pub(crate) shard: &'a Shard,
    pub(crate) layout: &'a Layout,
    /// Index inside the shard.
    pub(crate) local: usize,
    /// Index in the dataset.
    pub(crate) index: usize,
}

impl<'a> SampleView<'a> {
    /// Position in the dataset (0-based, in shard order).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The shard file holding this sample, for error messages.
    pub fn shard_path(&self) -> &'a Path {
        &self.shard.path
    }

    /// The source sample id, when the dataset stores `sample_ids`.
    pub fn sample_id(&self) -> Option<i64> {
        self.shard.sample_ids.as_ref().map(|ids| ids[self.local])
    }

    /// Tokens in the sample (never 0).
    pub fn len(&self) -> usize {
        let r = self.tokens();
        r.end - r.start
    }

    /// Always false (empty samples are refused on write and on open); present for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn tokens(&self) -> Range<usize> {
        self.shard.offsets[self.local]..self.shard.offsets[self.local + 1]
    }

    /// Rows `tokens()` of a [T, width] tensor stored at `range` with `elem`-byte elements.
    fn rows(&self, range: &Range<usize>, width: usize, elem: usize) -> &'a [u8] {
        self.row_bytes(range, width * elem)
    }

    /// Rows `tokens()` of a [T, ·] tensor stored at `range` with `row`-byte rows.
    fn row_bytes(&self, range: &Range<usize>, row: usize) -> &'a [u8] {
        let t = self.tokens();
        let base = range.start;
        &self.shard.mmap[base + t.start * row..base + t.end * row]
    }

    fn hidden(&self, codes: &Range<usize>, scales: &Range<usize>, width: usize) -> HiddenRows<'a> {
        let dtype = self.layout.dtype;
        let group = dtype.group(self.layout.hidden_size).unwrap_or(width);
        let scales = if dtype.is_scaled() { self.row_bytes(scales, 4 * (width / group)) } else { &[] };
        HiddenRows { bytes: self.row_bytes(codes, dtype.row_bytes(width)), scales, dtype, width, group }
    }

    /// Token ids, borrowed from the map when aligned (always, for files written by this crate
    /// or by the `safetensors` libraries), copied otherwise.
    pub fn input_ids(&self) -> Cow<'a, [i32]> {
        codec::i32s(self.rows(&self.shard.input_ids, 1, 4))
    }

    /// Refuse a token id outside the target vocabulary or a loss-mask value other than 0 and 1,
    /// as `verify` does, naming the shard, the sample and the position. Cheap (ids and mask are
    /// a few bytes per token); every batch runs it before its ids index an embedding, where an
    /// out-of-range id would abort the process instead.
    pub fn check_ids_and_mask(&self) -> Result<()> {
        let at = || {
            let id = self.sample_id().map_or_else(String::new, |id| format!(" (id {id})"));
            format!("sample {}{id}: ", self.index)
        };
        let path = self.shard_path();
        super::checks::token_ids(super::names::INPUT_IDS, &self.input_ids(), self.layout.vocab)
            .map_err(|m| Error::tensor(path, super::names::INPUT_IDS, format!("{}{m}", at())))?;
        super::checks::loss_mask(self.loss_mask())
            .map_err(|m| Error::tensor(path, super::names::LOSS_MASK, format!("{}{m}", at())))?;
        Ok(())
    }

    /// 1 where the token is trained on (assistant tokens), else 0. Not shifted.
    pub fn loss_mask(&self) -> &'a [u8] {
        self.rows(&self.shard.loss_mask, 1, 1)
    }

    /// The captured residual streams, [len, A*Ht], layers concatenated low → high.
    pub fn aux_hidden(&self) -> HiddenRows<'a> {
        self.hidden(&self.shard.aux_hidden, &self.shard.aux_scales, self.layout.aux_width)
    }

    /// The target's post-final-norm state, [len, Ht], when the teacher includes it.
    pub fn final_hidden(&self) -> Option<HiddenRows<'a>> {
        let range = self.shard.final_hidden.as_ref()?;
        Some(self.hidden(range, &self.shard.final_scales, self.layout.hidden_size))
    }

    /// The target's top-k next-token log-probs, [len, K], when the teacher includes them.
    pub fn topk(&self) -> Option<TopKView<'a>> {
        let (ids, logprobs) = self.shard.topk.as_ref()?;
        let (k, dtype) = (self.layout.k, self.layout.logprobs_dtype?);
        Some(TopKView { ids: self.rows(ids, k, 4), logprobs: self.rows(logprobs, k, dtype.size()), dtype, k })
    }
}

/// Row-major hidden-state rows in their storage encoding (with their scales, when scaled).
#[derive(Clone, Copy)]
pub struct HiddenRows<'a> {
    bytes: &'a [u8],
    /// Raw little-endian f32 scales of these rows, `width / group` per row (empty unless scaled).
    scales: &'a [u8],
    dtype: HiddenDtype,
    width: usize,
    /// Values per scale.
    group: usize,
}

impl<'a> HiddenRows<'a> {
    /// Storage encoding of [`HiddenRows::as_bytes`].
    pub fn dtype(&self) -> HiddenDtype {
        self.dtype
    }

    /// The scales of a scaled encoding, `[rows, width / group]` row-major (borrowed when
    /// aligned); `None` for the plain floats.
    pub fn scales(&self) -> Option<Cow<'a, [f32]>> {
        self.dtype.is_scaled().then(|| codec::f32s(self.scales))
    }

    /// Raw little-endian bytes of [`HiddenRows::scales`] (empty for the plain floats), for
    /// byte-level comparisons.
    pub fn scales_bytes(&self) -> &'a [u8] {
        self.scales
    }

    /// The first scale that is not positive and finite, as (row, group, value): a damaged file.
    pub fn bad_scale(&self) -> Option<(usize, usize, f32)> {
        let per_row = self.width / self.group;
        encoding::bad_scale(&self.scales()?).map(|(i, v)| (i / per_row, i % per_row, v))
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Number of rows (tokens).
    pub fn rows(&self) -> usize {
        self.bytes.len() / self.dtype.row_bytes(self.width)
    }

    /// The raw little-endian bytes, for uploading to a device as-is (bf16 stays bf16). For a
    /// scaled encoding these are the codes only; see [`HiddenRows::scales`].
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The values without a copy, when stored as aligned f32.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        match self.dtype {
            HiddenDtype::F32 => bytemuck::try_cast_slice(self.bytes).ok(),
            _ => None,
        }
    }

    /// The values as f32: borrowed when [`HiddenRows::as_f32`] is, decoded otherwise.
    pub fn to_f32(&self) -> Cow<'a, [f32]> {
        if let Some(values) = self.as_f32() {
            return Cow::Borrowed(values);
        }
        let mut out = vec![0f32; self.rows() * self.width];
        codec::decode_hidden(self.bytes, self.scales, self.dtype, self.group, &mut out);
        Cow::Owned(out)
    }

    /// Decode into a caller buffer of exactly `rows() * width()` values, so a loader can reuse
    /// one staging buffer for every batch (and write straight into a batch). Scales are not
    /// checked here; see [`HiddenRows::bad_scale`].
    pub fn decode_into(&self, out: &mut [f32]) -> Result<()> {
        let expected = self.rows() * self.width;
        if out.len() != expected {
            return Err(Error::BufferLength { what: "hidden rows", expected, found: out.len() });
        }
        codec::decode_hidden(self.bytes, self.scales, self.dtype, self.group, out);
        Ok(())
    }

    /// Rows `range` only (a window of a long sample), or `None` when out of bounds.
    pub fn slice_rows(&self, range: Range<usize>) -> Option<HiddenRows<'a>> {
        if range.start > range.end || range.end > self.rows() {
            return None;
        }
        let row = self.dtype.row_bytes(self.width);
        let srow = self.scales.len() / self.rows().max(1);
        Some(HiddenRows {
            bytes: &self.bytes[range.start * row..range.end * row],
            scales: &self.scales[range.start * srow..range.end * srow],
            ..*self
        })
    }
}

/// Top-k teacher rows: K ids and K log-probs (over the full target vocabulary, descending) per
/// token.
#[derive(Clone, Copy)]
pub struct TopKView<'a> {
    ids: &'a [u8],
    logprobs: &'a [u8],
    dtype: FloatDtype,
    k: usize,
}

impl<'a> TopKView<'a> {
    /// Entries per token.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of rows (tokens).
    pub fn rows(&self) -> usize {
        self.ids.len() / (4 * self.k)
    }

    /// Target token ids, [rows, K] row-major.
    pub fn ids(&self) -> Cow<'a, [i32]> {
        codec::i32s(self.ids)
    }

    /// Storage dtype of the log-probs (F16 or F32).
    pub fn logprobs_dtype(&self) -> FloatDtype {
        self.dtype
    }

    /// Raw little-endian log-prob bytes.
    pub fn logprobs_bytes(&self) -> &'a [u8] {
        self.logprobs
    }

    /// Log-probs as f32, [rows, K]: borrowed when stored as aligned f32.
    pub fn logprobs(&self) -> Cow<'a, [f32]> {
        match self.dtype {
            FloatDtype::F32 => codec::f32s(self.logprobs),
            dtype => {
                let mut out = vec![0f32; self.rows() * self.k];
                codec::decode_floats(self.logprobs, dtype, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Decode the log-probs into a caller buffer of exactly `rows() * k()` values.
    pub fn decode_logprobs_into(&self, out: &mut [f32]) -> Result<()> {
        let expected = self.rows() * self.k;
        if out.len() != expected {
            return Err(Error::BufferLength { what: "top-k log-probs", expected, found: out.len() });
        }
        codec::decode_floats(self.logprobs, self.dtype, out);
        Ok(())
    }
}

// Hand-written so that debug output shows shapes, not megabytes of element bytes.
impl fmt::Debug for SampleView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SampleView")
            .field("index", &self.index)
            .field("shard", &self.shard.path)
            .field("sample_id", &self.sample_id())
            .field("len", &self.len())
            .finish()
    }
}

impl fmt::Debug for HiddenRows<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HiddenRows")
            .field("rows", &self.rows())
            .field("width", &self.width)
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl fmt::Debug for TopKView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopKView")
            .field("rows", &self.rows())
            .field("k", &self.k)
            .field("logprobs_dtype", &self.dtype)
            .finish()
    }
}
