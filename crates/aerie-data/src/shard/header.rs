//! Validation of one shard file against the dataset: its safetensors header, its metadata, and
//! the dtype and shape of every tensor the format defines, with `sample_offsets` read and checked
//! (0 first, T last, no empty sample). The result records where each tensor lies in the map.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::Dtype;

use super::codec;
use super::encoding::FloatDtype;
use super::encoding::HiddenDtype;
use super::manifest::ShardEntry;
use super::metadata::{self, ShardMetadata};
use super::names;
use crate::{Error, MetadataError, Result};

/// One mapped shard and the byte ranges of its tensors inside the map.
pub(crate) struct Shard {
    pub(crate) path: PathBuf,
    pub(crate) mmap: Mmap,
    /// `sample_offsets`, N + 1 values, validated.
    pub(crate) offsets: Vec<usize>,
    pub(crate) sample_ids: Option<Vec<i64>>,
    pub(crate) input_ids: Range<usize>,
    pub(crate) loss_mask: Range<usize>,
    pub(crate) aux_hidden: Range<usize>,
    /// `aux_hidden_scales`, for a scaled encoding; an empty range otherwise.
    pub(crate) aux_scales: Range<usize>,
    pub(crate) final_hidden: Option<Range<usize>>,
    /// `final_hidden_scales`, for a scaled encoding with a final-hidden teacher; else empty.
    pub(crate) final_scales: Range<usize>,
    /// (`teacher_topk_ids`, `teacher_topk_logprobs`).
    pub(crate) topk: Option<(Range<usize>, Range<usize>)>,
    pub(crate) logprobs_dtype: Option<FloatDtype>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("path", &self.path)
            .field("samples", &(self.offsets.len() - 1))
            .field("tokens", &self.offsets[self.offsets.len() - 1])
            .finish_non_exhaustive()
    }
}

/// A tensor's header entry, its data located inside the whole file.
struct Found {
    dtype: Dtype,
    shape: Vec<usize>,
    range: Range<usize>,
}

struct Header<'a> {
    path: &'a Path,
    info: safetensors::tensor::Metadata,
    data_start: usize,
}

impl Header<'_> {
    fn get(&self, name: &str, dtypes: &[Dtype]) -> Result<Option<Found>> {
        let Some(info) = self.info.info(name) else {
            return Ok(None);
        };
        if !dtypes.contains(&info.dtype) {
            let allowed: Vec<String> = dtypes.iter().map(|d| format!("{d:?}")).collect();
            return Err(Error::tensor(
                self.path,
                name,
                format!("has dtype {:?}, expected {}", info.dtype, allowed.join(" or ")),
            ));
        }
        let (start, end) = info.data_offsets;
        Ok(Some(Found {
            dtype: info.dtype,
            shape: info.shape.clone(),
            range: self.data_start + start..self.data_start + end,
        }))
    }

    fn require(&self, name: &str, dtypes: &[Dtype]) -> Result<Found> {
        self.get(name, dtypes)?.ok_or_else(|| Error::tensor(self.path, name, "missing"))
    }

    /// Check a [rows] (width `None`) or [rows, width] tensor against `t` tokens.
    fn check_rows(&self, name: &str, found: &Found, t: usize, width: Option<(usize, &str)>) -> Result<()> {
        let rank = if width.is_some() { 2 } else { 1 };
        if found.shape.len() != rank {
            let expected = match width {
                Some((w, _)) => format!("[{t}, {w}]"),
                None => format!("[{t}]"),
            };
            return Err(Error::tensor(self.path, name, format!("has shape {:?}, expected {expected}", found.shape)));
        }
        if found.shape[0] != t {
            let what = if rank == 1 { "entries" } else { "rows" };
            return Err(Error::tensor(
                self.path,
                name,
                format!("has {} {what} but sample_offsets ends at {t}", found.shape[0]),
            ));
        }
        if let Some((w, why)) = width
            && found.shape[1] != w
        {
            return Err(Error::tensor(
                self.path,
                name,
                format!("rows are {} wide, expected {w} ({why})", found.shape[1]),
            ));
        }
        Ok(())
    }
}

fn float_dtype(found: &Found) -> FloatDtype {
    FloatDtype::from_safetensors(found.dtype).unwrap_or(FloatDtype::F32)
}

/// Map and validate one shard.
pub(crate) fn open_shard(path: &Path, entry: &ShardEntry, metadata: &ShardMetadata, reference: &Path) -> Result<Shard> {
    let file = super::fsutil::open_regular(path)?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len < 8 {
        return Err(Error::Safetensors {
            path: path.into(),
            message: format!("{len} bytes is too short for a header"),
        });
    }
    // SAFETY: the map is read-only and shard files are immutable once renamed into place: the
    // writer never reopens a listed shard, and resume deletes only unlisted files. Truncating a
    // listed shard behind the reader's back is outside the contract (it would fault, as with any
    // mapped file).
    #[allow(unsafe_code)]
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let (n, info) = safetensors::SafeTensors::read_metadata(&mmap)
        .map_err(|e| Error::Safetensors { path: path.into(), message: e.to_string() })?;
    check_shard_metadata(path, info.metadata(), metadata, reference)?;
    let header = Header { path, info, data_start: 8 + n };

    let input_ids = header.require(names::INPUT_IDS, &[Dtype::I32])?;
    let t = match input_ids.shape.as_slice() {
        [t] => *t,
        shape => {
            return Err(Error::tensor(path, names::INPUT_IDS, format!("has shape {shape:?}, expected [T]")));
        }
    };
    if t as u64 != entry.tokens {
        return Err(Error::tensor(
            path,
            names::INPUT_IDS,
            format!("has {t} tokens but manifest.json lists {}", entry.tokens),
        ));
    }
    let offsets = read_offsets(&header, &mmap, entry, t)?;
    let n_samples = offsets.len() - 1;

    let loss_mask = header.require(names::LOSS_MASK, &[Dtype::U8])?;
    header.check_rows(names::LOSS_MASK, &loss_mask, t, None)?;

    let dtype = metadata.dtype;
    let hidden = [dtype.to_safetensors()];
    let aux = header.require(names::AUX_HIDDEN, &hidden)?;
    let packed = if dtype == HiddenDtype::Int4 { ", two int4 values per byte" } else { "" };
    let aux_why = format!("{} layers × hidden_size {}{packed}", metadata.aux_layer_ids.len(), metadata.hidden_size);
    header.check_rows(names::AUX_HIDDEN, &aux, t, Some((dtype.stored_width(metadata.aux_width()), &aux_why)))?;
    let aux_scales = scales(&header, names::AUX_HIDDEN_SCALES, metadata, metadata.aux_width(), t, true)?;

    let teacher = metadata.teacher.to_string();
    let undeclared = |name: &str| Error::tensor(path, name, format!("present but the metadata teacher is `{teacher}`"));
    let final_hidden = match (header.get(names::FINAL_HIDDEN, &hidden)?, metadata.teacher.has_final_hidden()) {
        (Some(found), true) => {
            let why = format!("hidden_size{packed}");
            header.check_rows(
                names::FINAL_HIDDEN,
                &found,
                t,
                Some((dtype.stored_width(metadata.hidden_size), &why)),
            )?;
            Some(found.range)
        }
        (None, true) => {
            return Err(Error::tensor(
                path,
                names::FINAL_HIDDEN,
                format!("missing but the metadata teacher is `{teacher}`"),
            ));
        }
        (Some(_), false) => return Err(undeclared(names::FINAL_HIDDEN)),
        (None, false) => None,
    };
    let has_final = final_hidden.is_some();
    let final_scales = scales(&header, names::FINAL_HIDDEN_SCALES, metadata, metadata.hidden_size, t, has_final)?;

    let ids = header.get(names::TOPK_IDS, &[Dtype::I32])?;
    let logprobs = header.get(names::TOPK_LOGPROBS, &[Dtype::F16, Dtype::F32])?;
    let (topk, logprobs_dtype) = match (metadata.teacher.topk(), ids, logprobs) {
        (Some(k), Some(ids), Some(logprobs)) => {
            let why = format!("teacher `{teacher}`");
            header.check_rows(names::TOPK_IDS, &ids, t, Some((k, &why)))?;
            header.check_rows(names::TOPK_LOGPROBS, &logprobs, t, Some((k, &why)))?;
            (Some((ids.range, logprobs.range.clone())), Some(float_dtype(&logprobs)))
        }
        (Some(_), None, _) => {
            return Err(Error::tensor(
                path,
                names::TOPK_IDS,
                format!("missing but the metadata teacher is `{teacher}`"),
            ));
        }
        (Some(_), _, None) => {
            return Err(Error::tensor(
                path,
                names::TOPK_LOGPROBS,
                format!("missing but the metadata teacher is `{teacher}`"),
            ));
        }
        (None, Some(_), _) => return Err(undeclared(names::TOPK_IDS)),
        (None, _, Some(_)) => return Err(undeclared(names::TOPK_LOGPROBS)),
        (None, None, None) => (None, None),
    };

    let sample_ids = match header.get(names::SAMPLE_IDS, &[Dtype::I64])? {
        Some(found) => {
            if found.shape != [n_samples] {
                return Err(Error::tensor(
                    path,
                    names::SAMPLE_IDS,
                    format!("has shape {:?}, expected [{n_samples}] (one id per sample)", found.shape),
                ));
            }
            Some(codec::i64s(&mmap[found.range]))
        }
        None => None,
    };

    Ok(Shard {
        path: path.into(),
        offsets,
        sample_ids,
        input_ids: input_ids.range,
        loss_mask: loss_mask.range,
        aux_hidden: aux.range,
        aux_scales,
        final_hidden,
        final_scales,
        topk,
        logprobs_dtype,
        mmap,
    })
}

/// The scales tensor `name` of rows `width` wide: F32 [T, width / group] when the encoding is
/// scaled and its data tensor is `expected` present, absent otherwise. Only its shape is
/// checked here; the values (positive and finite) are checked by `verify` and by every decode.
fn scales(
    header: &Header<'_>,
    name: &str,
    metadata: &ShardMetadata,
    width: usize,
    t: usize,
    expected: bool,
) -> Result<Range<usize>> {
    let dtype = metadata.dtype;
    let found = header.get(name, &[Dtype::F32])?;
    match (found, dtype.group(metadata.hidden_size), expected) {
        (Some(found), Some(group), true) => {
            let why = if dtype == HiddenDtype::Fp8E4m3 {
                "one scale per token and captured layer".to_string()
            } else {
                format!("one scale per {group} values")
            };
            header.check_rows(name, &found, t, Some((width / group, &why)))?;
            Ok(found.range)
        }
        (None, Some(_), true) => {
            Err(Error::tensor(header.path, name, format!("missing, but dtype `{dtype}` stores its values scaled")))
        }
        (Some(_), _, _) => {
            Err(Error::tensor(header.path, name, format!("present, but dtype `{dtype}` has no scales for it")))
        }
        (None, _, _) => Ok(0..0),
    }
}

/// The shard's `__metadata__` must exist, be of a readable format, and agree with the dataset's.
fn check_shard_metadata(
    path: &Path,
    map: &Option<std::collections::HashMap<String, String>>,
    dataset: &ShardMetadata,
    reference: &Path,
) -> Result<()> {
    let Some(map) = map else {
        return Err(Error::Metadata {
            path: path.into(),
            source: MetadataError::new("format", "missing: the file has no __metadata__"),
        });
    };
    if let Some(format) = map.get("format") {
        metadata::check_format(format, path)?;
    }
    let map: BTreeMap<String, String> = map.clone().into_iter().collect();
    let shard = ShardMetadata::from_map(&map).map_err(|source| Error::Metadata { path: path.into(), source })?;
    let differences = shard.differences(dataset);
    if differences.is_empty() {
        Ok(())
    } else {
        Err(Error::MetadataMismatch { path: path.into(), reference: reference.into(), differences })
    }
}

/// `sample_offsets`: N + 1 values from 0 to T, strictly increasing (no empty samples).
fn read_offsets(header: &Header<'_>, mmap: &[u8], entry: &ShardEntry, t: usize) -> Result<Vec<usize>> {
    let name = names::SAMPLE_OFFSETS;
    let err = |message: String| Error::tensor(header.path, name, message);
    let found = header.require(name, &[Dtype::I64])?;
    let n = entry.samples;
    if found.shape.len() != 1 || (found.shape[0] as u64).checked_sub(1) != Some(n) {
        return Err(err(format!(
            "has shape {:?} but manifest.json lists {n} samples ([{}] expected)",
            found.shape,
            n.saturating_add(1)
        )));
    }
    let raw = codec::i64s(&mmap[found.range]);
    if raw[0] != 0 {
        return Err(err(format!("starts at {}, not 0", raw[0])));
    }
    for (i, w) in raw.windows(2).enumerate() {
        if w[1] <= w[0] {
            let problem = if w[1] == w[0] { "is empty" } else { "has a negative length" };
            return Err(err(format!("sample {i} {problem} (offsets {} then {})", w[0], w[1])));
        }
    }
    let last = raw[raw.len() - 1];
    if last != t as i64 {
        return Err(err(format!("ends at {last} but input_ids has {t} tokens")));
    }
    // Values are now in 0..=t, so they fit in usize.
    Ok(raw.into_iter().map(|o| o as usize).collect())
}
