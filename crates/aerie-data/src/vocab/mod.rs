//! The draft vocabulary (eagle3.md §4): which Vd of the target's V token ids the drafter's
//! `lm_head` predicts, stored as `d2t` (`int64 [Vd]`, offsets: `target = draft + d2t[draft]`) and
//! `t2d` (`bool [V]`, membership).
//!
//! [`DraftVocab::build`] counts the token ids under the loss mask of a prepared dataset, takes
//! the Vd most frequent (ties broken by the lower id), pads with the lowest unused ids `0, 1, ..`
//! when fewer distinct ids occur, and sorts ascending. Every vocabulary this module builds,
//! reads or writes satisfies the invariants: `t2d.sum() == Vd`, `0 <= i + d2t[i] < V`, and
//! `nonzero(t2d) == d2t + arange(Vd)` (target ids strictly ascending).
//!
//! Fine-tuning an existing drafter must keep its mapping (its `lm_head` rows are tied to it):
//! [`build_vocab`] with `keep_from` reads the drafter's `d2t` instead of building one, and reports
//! its coverage on the new data next to the coverage a rebuilt vocabulary would have. It never
//! silently replaces it.
//!
//! [`DraftVocab`] itself (the invariants, `d2t`/`t2d`) is in `vocab/draft.rs`; this module
//! counts, builds, reads and writes it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, tensor::TensorView};
use serde::{Deserialize, Serialize};

use crate::lock::OutputLock;
use crate::prepare::{PreparedDataset, TRAIN};
use crate::{Error, Result};

mod draft;

pub use draft::DraftVocab;

/// The `format` metadata of a vocabulary file.
pub const VOCAB_FORMAT: &str = "aerie-vocab/1";

fn verr(path: &Path, message: impl Into<String>) -> Error {
    Error::Vocab { path: path.to_owned(), message: message.into() }
}

/// How often each target id occurs under the loss mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCounts {
    /// Count per target id, length V.
    pub counts: Vec<u64>,
    /// Masked tokens counted.
    pub masked_tokens: u64,
    /// Samples counted.
    pub samples: u64,
}

impl TokenCounts {
    /// Zero counts over a vocabulary of `vocab_size`.
    pub fn new(vocab_size: usize) -> Self {
        Self { counts: vec![0; vocab_size], masked_tokens: 0, samples: 0 }
    }

    /// Count the masked ids of one sample; `Err(id)` for an id outside the vocabulary.
    pub fn add(&mut self, ids: &[u32], mask: &[u8]) -> std::result::Result<(), u32> {
        for (&id, &m) in ids.iter().zip(mask) {
            if m != 0 {
                *self.counts.get_mut(id as usize).ok_or(id)? += 1;
                self.masked_tokens += 1;
            }
        }
        self.samples += 1;
        Ok(())
    }

    /// Ids that occur at least once.
    pub fn distinct(&self) -> usize {
        self.counts.iter().filter(|&&c| c > 0).count()
    }
}

impl DraftVocab {
    /// Write `d2t` (`I64 [Vd]`) and `t2d` (`BOOL [V]`) to a safetensors file, atomically, with
    /// `metadata` plus `format`, `draft_vocab_size` and `vocab_size`.
    pub fn write(&self, path: &Path, metadata: &HashMap<String, String>) -> Result<()> {
        let d2t: Vec<u8> = self.d2t().iter().flat_map(|v| v.to_le_bytes()).collect();
        let t2d: Vec<u8> = self.t2d().iter().map(|&b| u8::from(b)).collect();
        let tensors = vec![
            ("d2t", tensor_view(path, Dtype::I64, self.draft_vocab_size(), &d2t)?),
            ("t2d", tensor_view(path, Dtype::BOOL, self.vocab_size(), &t2d)?),
        ];
        let mut meta = metadata.clone();
        meta.insert("format".into(), VOCAB_FORMAT.into());
        meta.insert("draft_vocab_size".into(), self.draft_vocab_size().to_string());
        meta.insert("vocab_size".into(), self.vocab_size().to_string());
        let mut bytes = safetensors::serialize(tensors, Some(meta)).map_err(|e| verr(path, e.to_string()))?;
        crate::st_header::sort_metadata(&mut bytes).map_err(|m| verr(path, m))?;
        crate::atomic::write_bytes(path, &bytes)
    }

    /// Read the `d2t` of a safetensors file (a vocabulary file, or a drafter's
    /// `model.safetensors`; a directory means its `model.safetensors`), reading only that tensor
    /// and `t2d` when present. `vocab_size` defaults to `t2d`'s length; both must agree when
    /// both are known, and `t2d` must match `d2t`.
    pub fn read(path: &Path, vocab_size: Option<usize>) -> Result<Self> {
        let file_path = if path.is_dir() { path.join("model.safetensors") } else { path.to_owned() };
        let mut st = SafetensorsFile::open(&file_path)?;
        let (dtype, shape, bytes) = st.tensor("d2t")?.ok_or_else(|| {
            let near: Vec<_> = st.names().filter(|n| n.contains("d2t")).collect();
            verr(
                &file_path,
                format!(
                    "no `d2t` tensor{}",
                    if near.is_empty() { String::new() } else { format!(" (found {})", near.join(", ")) }
                ),
            )
        })?;
        let d2t: Vec<i64> = match (dtype.as_str(), shape.as_slice()) {
            ("I64", [_]) => bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
            ("I32", [_]) => {
                bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().expect("4 bytes")))).collect()
            }
            _ => return Err(verr(&file_path, format!("`d2t` is {dtype} {shape:?}, expected I64 [Vd]"))),
        };
        let t2d = st.tensor("t2d")?;
        let t2d_len = t2d.as_ref().map(|(_, shape, _)| shape.iter().product::<usize>());
        let v = match (vocab_size, t2d_len) {
            (Some(v), Some(t)) if v != t => {
                return Err(verr(&file_path, format!("`t2d` has {t} entries but the target vocabulary has {v}")));
            }
            (Some(v), _) | (None, Some(v)) => v,
            (None, None) => {
                return Err(verr(&file_path, "no `t2d` to take the target vocabulary size from; give it explicitly"));
            }
        };
        let vocab =
            Self::from_d2t(&d2t, v).map_err(|m| verr(&file_path, format!("`d2t` breaks the invariants: {m}")))?;
        if let Some((dtype, _, bytes)) = t2d {
            if dtype != "BOOL" && dtype != "U8" {
                return Err(verr(&file_path, format!("`t2d` is {dtype}, expected BOOL")));
            }
            let set: Vec<usize> = bytes.iter().enumerate().filter(|(_, b)| **b != 0).map(|(i, _)| i).collect();
            if set != vocab.target_ids() {
                return Err(verr(
                    &file_path,
                    format!(
                        "`t2d` marks {} ids that are not exactly d2t + arange({})",
                        set.len(),
                        vocab.draft_vocab_size()
                    ),
                ));
            }
        }
        Ok(vocab)
    }
}

fn tensor_view<'a>(path: &Path, dtype: Dtype, len: usize, data: &'a [u8]) -> Result<TensorView<'a>> {
    TensorView::new(dtype, vec![len], data).map_err(|e| verr(path, e.to_string()))
}

/// A tensor's dtype name, shape and little-endian bytes.
type RawTensor = (String, Vec<usize>, Vec<u8>);

/// Header-only access to a safetensors file: tensors are read by seeking to their bytes, so a
/// multi-gigabyte drafter checkpoint costs one small read.
struct SafetensorsFile {
    path: PathBuf,
    file: File,
    data_start: u64,
    header: serde_json::Map<String, serde_json::Value>,
}

impl SafetensorsFile {
    fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n).map_err(|e| Error::io(path, e))?;
        let n = u64::from_le_bytes(n);
        if n > len.saturating_sub(8) || n > 100 << 20 {
            return Err(Error::Safetensors {
                path: path.to_owned(),
                message: format!("header length {n} does not fit a file of {len} bytes"),
            });
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
        let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header).map_err(|e| {
            Error::Safetensors { path: path.to_owned(), message: format!("header is not a JSON object: {e}") }
        })?;
        Ok(Self { path: path.to_owned(), file, data_start: 8 + n, header })
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.header.keys().map(String::as_str).filter(|k| *k != "__metadata__")
    }

    /// (dtype, shape, bytes) of `name`, `None` when absent.
    fn tensor(&mut self, name: &str) -> Result<Option<RawTensor>> {
        let Some(info) = self.header.get(name) else {
            return Ok(None);
        };
        let bad = |m: &str| Error::Safetensors { path: self.path.clone(), message: format!("tensor `{name}`: {m}") };
        let dtype = info.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad("no dtype"))?.to_owned();
        let shape: Vec<usize> = info
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("malformed shape"))?;
        let offs = info.get("data_offsets").and_then(|o| o.as_array()).ok_or_else(|| bad("no data_offsets"))?;
        let (begin, end) = match offs.as_slice() {
            [b, e] => (b.as_u64().ok_or_else(|| bad("bad offset"))?, e.as_u64().ok_or_else(|| bad("bad offset"))?),
            _ => return Err(bad("data_offsets must be [begin, end]")),
        };
        let width = match dtype.as_str() {
            "I64" | "F64" | "U64" => 8,
            "I32" | "F32" | "U32" => 4,
            "I16" | "F16" | "BF16" | "U16" => 2,
            _ => 1,
        };
        if end < begin || (end - begin) as usize != shape.iter().product::<usize>() * width {
            return Err(bad(&format!("{} bytes do not hold {dtype} {shape:?}", end.saturating_sub(begin))));
        }
        let mut bytes = vec![0u8; (end - begin) as usize];
        self.file
            .seek(SeekFrom::Start(self.data_start + begin))
            .and_then(|_| self.file.read_exact(&mut bytes))
            .map_err(|e| Error::io(&self.path, e))?;
        Ok(Some((dtype, shape, bytes)))
    }
}

/// Options of [`build_vocab`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VocabOptions {
    /// Vd. Required unless `keep_from` is given (then it must match the drafter's, if set).
    pub draft_vocab_size: Option<usize>,
    /// V; default: the prepared dataset's.
    pub vocab_size: Option<usize>,
    /// Splits to count; default `train`.
    pub splits: Vec<String>,
    /// Keep the `d2t` of this drafter (directory with `model.safetensors`, or a safetensors
    /// file) instead of building one.
    pub keep_from: Option<PathBuf>,
    /// Further prepared datasets (same tokenizer) counted with the first, each weighted as much
    /// as the first whatever its size: a vocabulary for two domains, as a drafter fine-tuned
    /// for new traffic needs when the new domain's ids are outside its old map (with
    /// `init.allow_vocab_override`). Building only, not with `keep_from`.
    pub mix: Vec<PathBuf>,
}

/// One dataset of a mixed vocabulary ([`VocabOptions::mix`]): its size and how much of it the
/// vocabulary covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetCoverage {
    /// The prepared dataset.
    pub prepared: PathBuf,
    /// Masked tokens counted in it.
    pub masked_tokens: u64,
    /// Share of them whose id is in the draft vocabulary.
    pub coverage: f64,
}

/// What [`build_vocab`] did; also written as JSON beside the vocabulary file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VocabReport {
    /// [`VOCAB_FORMAT`].
    pub format: String,
    /// The prepared dataset.
    pub prepared: PathBuf,
    /// The vocabulary file written.
    pub out: PathBuf,
    /// `built`, or `kept` (from `keep_from`).
    pub source: String,
    /// The drafter whose mapping was kept.
    pub keep_from: Option<PathBuf>,
    /// Splits counted.
    pub splits: Vec<String>,
    /// V.
    pub vocab_size: usize,
    /// Vd.
    pub draft_vocab_size: usize,
    /// Samples counted.
    pub samples: u64,
    /// Masked tokens counted.
    pub masked_tokens: u64,
    /// Distinct ids among them.
    pub distinct_tokens: usize,
    /// Masked tokens whose id is in the draft vocabulary.
    pub covered_tokens: u64,
    /// `covered_tokens / masked_tokens`.
    pub coverage: f64,
    /// Draft ids filled with unseen ids (padding) because fewer than Vd ids occur.
    pub padded_ids: usize,
    /// With `keep_from`: the coverage a vocabulary rebuilt from this data would have.
    pub rebuilt_coverage: Option<f64>,
    /// With `mix`: every dataset counted (the first included), each one's coverage. The counts
    /// and `coverage` above are then of the domain-balanced sum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DatasetCoverage>,
}

/// The sum of `parts`, each scaled to the largest one's masked-token count (rounded), so that
/// every dataset weighs the same in a vocabulary built from the sum.
fn balanced_sum(parts: &[TokenCounts]) -> TokenCounts {
    let v = parts.first().map_or(0, |p| p.counts.len());
    let top = parts.iter().map(|p| p.masked_tokens).max().unwrap_or(0);
    let mut sum = TokenCounts::new(v);
    for p in parts.iter().filter(|p| p.masked_tokens > 0) {
        let scale = top as f64 / p.masked_tokens as f64;
        for (s, &c) in sum.counts.iter_mut().zip(&p.counts) {
            *s += (c as f64 * scale).round() as u64;
        }
        sum.samples += p.samples;
    }
    sum.masked_tokens = sum.counts.iter().sum();
    sum
}

/// Count the masked token ids of `splits` of a prepared dataset; `progress(samples_done, total)`.
pub fn count_masked_tokens(
    ds: &PreparedDataset,
    splits: &[String],
    vocab_size: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TokenCounts> {
    let total: u64 = splits.iter().map(|s| ds.len(s)).sum();
    let mut counts = TokenCounts::new(vocab_size);
    for split in splits {
        let path = ds.split_path(split)?;
        for sample in ds.samples(split)? {
            let s = sample?;
            counts.add(&s.input_ids, &s.loss_mask).map_err(|id| {
                verr(
                    &path,
                    format!(
                        "sample {} ({}): token id {id} is outside the target vocabulary of {vocab_size}",
                        s.sample_id, s.source_id
                    ),
                )
            })?;
            if counts.samples.is_multiple_of(1024) {
                progress(counts.samples, total);
            }
        }
    }
    progress(counts.samples, total);
    Ok(counts)
}

/// `aerie vocab build`: count, build (or keep) the draft vocabulary, write it to `out` and the
/// report to `out` with extension `.json`.
pub fn build_vocab(
    prepared: &Path,
    out: &Path,
    opts: &VocabOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VocabReport> {
    if out.extension().is_some_and(|e| e == "json") {
        return Err(Error::InvalidOption(format!(
            "{}: the vocabulary is a safetensors file (its report goes beside it as .json)",
            out.display()
        )));
    }
    if out.is_dir() {
        // It said "--out holds an input of this run" or "exists and is not a draft vocabulary".
        return Err(Error::InvalidOption(format!(
            "{}: --out is a directory; it names the safetensors file to write, e.g. {}",
            out.display(),
            out.join("vocab.safetensors").display()
        )));
    }
    if let Some(n) = opts.vocab_size {
        crate::limits::vocab("--vocab-size", n)?;
    }
    if let Some(n) = opts.draft_vocab_size {
        crate::limits::vocab("--draft-vocab", n)?;
    }
    let _lock = OutputLock::beside(out)?;
    let report_file = out.with_extension("json");
    let mut inputs = Vec::new();
    for p in std::iter::once(prepared).chain(opts.mix.iter().map(PathBuf::as_path)) {
        inputs.extend([p.join(crate::prepare::REPORT_FILE), p.join("train.parquet"), p.join("eval.parquet")]);
    }
    if let Some(keep) = &opts.keep_from {
        inputs.extend([keep.join("model.safetensors"), keep.clone()]);
    }
    let inputs: Vec<(&str, &Path)> = inputs.iter().map(|p| ("an input", p.as_path())).collect();
    crate::owned::check_not_input(out, "--out", &inputs)?;
    crate::owned::check_not_input(&report_file, "the report beside --out", &inputs)?;
    crate::owned::check_safetensors_is_ours(out, VOCAB_FORMAT, "a draft vocabulary", "--out")?;
    crate::owned::check_json_is_ours(&report_file, "a vocabulary report", "the report beside --out", |v| {
        crate::owned::has_format(v, VOCAB_FORMAT)
    })?;
    let ds = PreparedDataset::open(prepared)?;
    let v = opts.vocab_size.unwrap_or_else(|| ds.vocab_size());
    crate::limits::vocab(format!("{}: the vocabulary size", prepared.display()), v)?;
    if v == 0 {
        return Err(Error::InvalidOption("the target vocabulary size is 0".into()));
    }
    let splits = if opts.splits.is_empty() { vec![TRAIN.to_owned()] } else { opts.splits.clone() };
    let mut counts = count_masked_tokens(&ds, &splits, v, progress)?;
    if !opts.mix.is_empty() && opts.keep_from.is_some() {
        return Err(Error::InvalidOption(
            "a mixed vocabulary is built, a kept one is not: give --mix or --keep-from, not both".into(),
        ));
    }
    let mut parts = Vec::new();
    for other in &opts.mix {
        let o = PreparedDataset::open(other)?;
        if o.report().tokenizer_digest != ds.report().tokenizer_digest {
            return Err(verr(
                other,
                format!(
                    "prepared with another tokenizer than {} (digest {} vs {}): a vocabulary maps one target's ids",
                    prepared.display(),
                    o.report().tokenizer_digest,
                    ds.report().tokenizer_digest
                ),
            ));
        }
        parts.push((other.clone(), count_masked_tokens(&o, &splits, v, progress)?));
    }
    let mut per_dataset = Vec::new();
    if !parts.is_empty() {
        parts.insert(0, (prepared.to_owned(), counts));
        let all: Vec<TokenCounts> = parts.iter().map(|(_, c)| c.clone()).collect();
        counts = balanced_sum(&all);
        per_dataset = parts;
    }
    let (vocab, rebuilt_coverage) = match &opts.keep_from {
        Some(drafter) => {
            let kept = DraftVocab::read(drafter, Some(v))?;
            if let Some(n) = opts.draft_vocab_size.filter(|&n| n != kept.draft_vocab_size()) {
                return Err(verr(
                    drafter,
                    format!(
                        "the drafter's draft vocabulary has {} ids but {n} were asked for; a fine-tuned drafter \
                         must keep its mapping (drop --draft-vocab, or build without --keep-from)",
                        kept.draft_vocab_size()
                    ),
                ));
            }
            let rebuilt = DraftVocab::build(&counts, kept.draft_vocab_size()).map_err(|m| verr(prepared, m))?;
            let c = rebuilt.coverage(&counts);
            (kept, Some(c))
        }
        None => {
            let n = opts
                .draft_vocab_size
                .ok_or_else(|| Error::InvalidOption("a draft vocab size is needed: pass --draft-vocab N (e.g. 32000), or --keep-from DRAFTER to keep a drafter's mapping".into()))?;
            (DraftVocab::build(&counts, n).map_err(|m| verr(prepared, m))?, None)
        }
    };
    let covered = vocab.covered(&counts);
    let padded_ids = vocab.target_ids().iter().filter(|&&t| counts.counts[t] == 0).count();
    let report = VocabReport {
        format: VOCAB_FORMAT.into(),
        prepared: prepared.to_owned(),
        out: out.to_owned(),
        source: if opts.keep_from.is_some() { "kept" } else { "built" }.into(),
        keep_from: opts.keep_from.clone(),
        splits,
        vocab_size: v,
        draft_vocab_size: vocab.draft_vocab_size(),
        samples: counts.samples,
        masked_tokens: counts.masked_tokens,
        distinct_tokens: counts.distinct(),
        covered_tokens: covered,
        coverage: vocab.coverage(&counts),
        padded_ids,
        rebuilt_coverage,
        datasets: per_dataset
            .iter()
            .map(|(p, c)| DatasetCoverage {
                prepared: p.clone(),
                masked_tokens: c.masked_tokens,
                coverage: vocab.coverage(c),
            })
            .collect(),
    };
    let mut meta = HashMap::new();
    meta.insert("source".into(), report.source.clone());
    meta.insert("coverage".into(), format!("{:.6}", report.coverage));
    meta.insert("masked_tokens".into(), report.masked_tokens.to_string());
    meta.insert("covered_tokens".into(), report.covered_tokens.to_string());
    meta.insert("distinct_tokens".into(), report.distinct_tokens.to_string());
    meta.insert("samples".into(), report.samples.to_string());
    meta.insert("tokenizer_digest".into(), ds.report().tokenizer_digest.clone());
    if let Some(k) = &report.keep_from {
        meta.insert("keep_from".into(), k.display().to_string());
    }
    vocab.write(out, &meta)?;
    let json = serde_json::to_vec_pretty(&report).map_err(|e| Error::InvalidOption(e.to_string()))?;
    crate::atomic::write_bytes(&report_file, &json)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dataset ten times larger does not outvote a small one: each is scaled to the largest
    /// one's token count before the sum, so a vocabulary of two ids takes each one's top id.
    #[test]
    fn a_balanced_sum_weighs_every_dataset_alike() {
        let mut big = TokenCounts::new(6);
        big.add(&[0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2], &[1; 20]).unwrap();
        let mut small = TokenCounts::new(6);
        small.add(&[5, 5], &[1, 1]).unwrap();
        let sum = balanced_sum(&[big.clone(), small]);
        assert_eq!(sum.counts, [6, 4, 10, 0, 0, 20]);
        assert_eq!((sum.masked_tokens, sum.samples), (40, 2));
        assert_eq!(DraftVocab::build(&sum, 2).unwrap().target_ids(), [2, 5]);
        assert_eq!(DraftVocab::build(&big, 2).unwrap().target_ids(), [0, 2], "unmixed, the big one's top two");
    }
}
