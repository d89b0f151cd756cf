//! The full scan a dataset check runs (meant for a CLI `verify` step): checksums and every value, the checks
//! [`ShardDataset::open`] skips because they read the whole dataset. The content rules are the
//! writer's own (see `checks`), so anything this crate wrote passes.

use std::path::Path;

use super::checks;
use super::codec;
use super::encoding::{self, HiddenDtype};
use super::reader::ShardDataset;
use super::{fsutil, names};
use crate::{Error, Result};

/// What [`ShardDataset::verify`] looked at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Shards scanned.
    pub shards: usize,
    /// Shards whose manifest entry had a sha256, now confirmed.
    pub checksums: usize,
    /// Samples scanned.
    pub samples: u64,
    /// Tokens scanned.
    pub tokens: u64,
    /// Tokens under the loss mask.
    pub masked_tokens: u64,
}

/// Rows decoded at a time when checking hidden states for non-finite values.
const ROWS_PER_CHUNK: usize = 256;

impl ShardDataset {
    /// Read everything: check recorded sha256 digests, that loss masks are 0/1 and match the
    /// manifest's `masked_tokens`, that token and top-k ids lie in the target vocabulary, that
    /// log-probs are descending and not above 0, and that hidden states are finite. Stops at the
    /// first problem, naming the shard and tensor.
    pub fn verify(&self) -> Result<VerifyReport> {
        let vocab = self.metadata.target_vocab_size;
        let mut report = VerifyReport::default();
        for (shard, entry) in self.shards.iter().zip(&self.manifest.shards) {
            let path = &shard.path;
            if check_checksum(path, entry.sha256.as_deref())? {
                report.checksums += 1;
            }
            let map = &shard.mmap[..];
            let masked = checks::loss_mask(&map[shard.loss_mask.clone()])
                .map_err(|m| Error::tensor(path, names::LOSS_MASK, m))?;
            if masked != entry.masked_tokens {
                return Err(Error::tensor(
                    path,
                    names::LOSS_MASK,
                    format!("has {masked} ones but manifest.json lists {} masked tokens", entry.masked_tokens),
                ));
            }
            let ids = codec::i32s(&map[shard.input_ids.clone()]);
            checks::token_ids(names::INPUT_IDS, &ids, vocab).map_err(|m| Error::tensor(path, names::INPUT_IDS, m))?;
            if let (Some((ids, logprobs)), Some(dtype)) = (&shard.topk, self.layout.logprobs_dtype) {
                let ids = codec::i32s(&map[ids.clone()]);
                let mut values = vec![0f32; ids.len()];
                codec::decode_floats(&map[logprobs.clone()], dtype, &mut values);
                checks::topk(&ids, &values, self.layout.k, vocab)
                    .map_err(|(tensor, m)| Error::tensor(path, tensor, m))?;
            }
            let hidden = |name, scales_name, codes: &std::ops::Range<usize>, scales: &std::ops::Range<usize>, width| {
                let rows = Stored { codes: &map[codes.clone()], scales: &map[scales.clone()], width };
                finite(path, name, scales_name, rows, self.layout.dtype, self.layout.hidden_size)
            };
            hidden(
                names::AUX_HIDDEN,
                names::AUX_HIDDEN_SCALES,
                &shard.aux_hidden,
                &shard.aux_scales,
                self.layout.aux_width,
            )?;
            if let Some(range) = &shard.final_hidden {
                let ht = self.layout.hidden_size;
                hidden(names::FINAL_HIDDEN, names::FINAL_HIDDEN_SCALES, range, &shard.final_scales, ht)?;
            }
            report.shards += 1;
            report.samples += entry.samples;
            report.tokens += entry.tokens;
            report.masked_tokens += masked;
        }
        Ok(report)
    }
}

impl ShardDataset {
    /// Check shard `index` against the sha256 its manifest entry records (a no-op without one):
    /// what a reader that copies the data elsewhere (`shards convert`) runs before it reads the
    /// shard, so a corrupted source is refused instead of laundered into a valid-looking copy.
    pub fn check_shard_checksum(&self, index: usize) -> Result<()> {
        check_checksum(&self.shards[index].path, self.manifest.shards[index].sha256.as_deref()).map(|_| ())
    }
}

/// Whether `path` had a recorded digest to check (and it matched).
fn check_checksum(path: &Path, expected: Option<&str>) -> Result<bool> {
    let Some(expected) = expected else { return Ok(false) };
    let found = fsutil::sha256_file(path)?;
    if !found.eq_ignore_ascii_case(expected) {
        return Err(Error::Checksum { path: path.to_path_buf(), expected: expected.to_owned(), found });
    }
    Ok(true)
}

/// One stored [T, width] hidden tensor and its scales (empty unless scaled).
struct Stored<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    width: usize,
}

/// Every scale of a [T, width] hidden tensor is positive and finite, and every decoded value
/// is finite.
fn finite(
    path: &Path,
    tensor: &str,
    scales_tensor: &str,
    rows: Stored<'_>,
    dtype: HiddenDtype,
    ht: usize,
) -> Result<()> {
    let group = dtype.group(ht).unwrap_or(rows.width);
    let per_row = dtype.scales_per_row(rows.width, ht);
    if dtype.is_scaled() {
        let scales = codec::f32s(rows.scales);
        if let Some((i, v)) = encoding::bad_scale(&scales) {
            let (row, g) = (i / per_row, i % per_row);
            return Err(Error::tensor(
                path,
                scales_tensor,
                format!("[{row}, {g}] = {v} is not a positive finite scale"),
            ));
        }
    }
    let (row_bytes, scale_bytes) = (dtype.row_bytes(rows.width), 4 * per_row);
    let mut buf = Vec::new();
    for (c, chunk) in rows.codes.chunks(ROWS_PER_CHUNK * row_bytes).enumerate() {
        let n = chunk.len() / row_bytes;
        let scales = if dtype.is_scaled() {
            &rows.scales[c * ROWS_PER_CHUNK * scale_bytes..(c * ROWS_PER_CHUNK + n) * scale_bytes]
        } else {
            &[]
        };
        buf.resize(n * rows.width, 0f32);
        codec::decode_hidden(chunk, scales, dtype, group, &mut buf);
        if let Some(i) = buf.iter().position(|v| !v.is_finite()) {
            let row = c * ROWS_PER_CHUNK + i / rows.width;
            let w = rows.width;
            return Err(Error::tensor(path, tensor, format!("[{row}, {}] = {} is not finite", i % w, buf[i])));
        }
    }
    Ok(())
}
