//! Re-encoding a dataset (`aerie shards convert`): captured data is expensive, so a change of
//! encoding (bf16 → fp8-e4m3, or back) or dropping a teacher must not mean a new capture.
//!
//! The output is written with the ordinary [`ShardWriter`] protocol, one output shard per input
//! shard, so at every instant DST is a valid dataset holding a prefix of SRC's shards, and a
//! rerun of the same conversion resumes after the last committed shard (a killed conversion
//! loses at most the shard it was writing). Because the output shard boundaries are SRC's and
//! encoding is deterministic, a resumed conversion is byte-identical to an uninterrupted one.

use std::path::Path;
use std::time::Instant;

use super::encoding::HiddenDtype;
use super::input::{HiddenInput, SampleRef};
use super::metadata::{ShardMetadata, Teacher};
use super::reader::ShardDataset;
use super::writer::{ShardWriter, ShardWriterOptions};
use crate::{Error, Result};

/// What to convert to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Storage of the hidden states in DST.
    pub dtype: HiddenDtype,
    /// The teacher DST keeps: SRC's (`None`), or a part of it: `topk:K` from
    /// `final-hidden+topk:K`, `final-hidden` from it, or `topk:K'` with K' ≤ K (top-k rows are
    /// sorted best first, so their first K' entries are the top-K').
    pub teacher: Option<Teacher>,
    /// Record sha256 digests in DST's manifest.
    pub checksums: bool,
}

/// What a conversion did.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertReport {
    /// Shards of SRC (and of DST, when done).
    pub shards: usize,
    /// Shards already in DST from an interrupted run.
    pub resumed_shards: usize,
    /// Samples converted by this run.
    pub converted_samples: u64,
    /// Tokens converted by this run.
    pub converted_tokens: u64,
    /// Total bytes of SRC's shard files.
    pub src_bytes: u64,
    /// Total bytes of DST's shard files.
    pub dst_bytes: u64,
    /// Tokens in the dataset.
    pub tokens: u64,
    /// Wall time of this run.
    pub seconds: f64,
}

impl ConvertReport {
    /// Stored bytes per token of SRC.
    pub fn src_bytes_per_token(&self) -> f64 {
        self.src_bytes as f64 / self.tokens.max(1) as f64
    }

    /// Stored bytes per token of DST.
    pub fn dst_bytes_per_token(&self) -> f64 {
        self.dst_bytes as f64 / self.tokens.max(1) as f64
    }
}

/// Whether `to` keeps only what `from` stores.
fn teacher_is_part_of(to: Teacher, from: Teacher) -> bool {
    match (to, from) {
        (Teacher::FinalHidden, t) => t.has_final_hidden(),
        (Teacher::TopK { k }, t) => t.topk().is_some_and(|have| k <= have),
        (Teacher::Both { k }, Teacher::Both { k: have }) => k <= have,
        (Teacher::Both { .. }, _) => false,
    }
}

fn dataset_bytes(dataset: &ShardDataset) -> Result<u64> {
    dataset.manifest().shards.iter().try_fold(0u64, |sum, s| {
        let path = dataset.dir().join(&s.file);
        Ok(sum + std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len())
    })
}

/// Convert the dataset in `src` into `dst` (created, or resumed when it holds an interrupted
/// conversion of `src` with the same options). `progress(shards_done, shards)` after each
/// shard.
pub fn convert(
    src: &Path,
    dst: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertReport> {
    let start = Instant::now();
    let source = ShardDataset::open(src)?;
    if let (Ok(a), Ok(b)) = (src.canonicalize(), dst.canonicalize())
        && a == b
    {
        return Err(Error::Options(format!("{}: SRC and --out are the same directory", src.display())));
    }
    let from = source.metadata();
    let teacher = opts.teacher.unwrap_or(from.teacher);
    if !teacher_is_part_of(teacher, from.teacher) {
        return Err(Error::Options(format!(
            "{}: the data's teacher is `{}`, which does not contain `{teacher}`",
            src.display(),
            from.teacher
        )));
    }
    let metadata = ShardMetadata {
        dtype: opts.dtype,
        teacher,
        created_by: format!("{} + aerie shards convert {}", from.created_by, env!("CARGO_PKG_VERSION")),
        ..from.clone()
    };
    // Shards are closed explicitly at SRC's boundaries, never by size.
    let options = ShardWriterOptions { shard_tokens: usize::MAX, checksums: opts.checksums };
    let (mut writer, resumed) = ShardWriter::open_or_create(dst, metadata, options)?;
    let resumed_shards = resumed.as_ref().map_or(0, |r| r.shards);
    check_prefix(&source, &writer, dst)?;

    let (ht, aw) = (from.hidden_size, from.aux_width());
    let k = teacher.topk();
    let (mut aux, mut fin) = (Vec::new(), Vec::new());
    let (mut converted_samples, mut converted_tokens) = (0u64, 0u64);
    let shards = source.num_shards();
    let mut index = source.manifest().shards[..resumed_shards].iter().map(|s| s.samples as usize).sum::<usize>();
    for (s, entry) in source.manifest().shards.iter().enumerate().skip(resumed_shards) {
        source.check_shard_checksum(s)?;
        for _ in 0..entry.samples {
            let view = source.sample(index).expect("the manifest counts the samples");
            index += 1;
            let n = view.len();
            aux.resize(n * aw, 0f32);
            view.aux_hidden().decode_into(&mut aux)?;
            let ids = view.input_ids();
            let mut record = SampleRef::new(&ids, view.loss_mask(), HiddenInput::F32(&aux));
            record.sample_id = view.sample_id();
            if teacher.has_final_hidden() {
                let rows = view.final_hidden().expect("the source teacher has final hidden states");
                fin.resize(n * ht, 0f32);
                rows.decode_into(&mut fin)?;
                record = record.with_final_hidden(HiddenInput::F32(&fin));
            }
            let topk = match (k, view.topk()) {
                (Some(k), Some(t)) => {
                    let (ids, lps) = (t.ids(), t.logprobs());
                    let have = t.k();
                    let ids: Vec<i32> = ids.chunks_exact(have).flat_map(|r| r[..k].iter().copied()).collect();
                    let lps: Vec<f32> = lps.chunks_exact(have).flat_map(|r| r[..k].iter().copied()).collect();
                    Some((ids, lps))
                }
                _ => None,
            };
            if let Some((ids, lps)) = &topk {
                record = record.with_topk(ids, lps);
            }
            writer.push(record).map_err(|e| in_source(e, view.shard_path()))?;
            converted_samples += 1;
            converted_tokens += n as u64;
        }
        writer.flush()?;
        progress(s + 1, shards);
    }
    writer.finish()?;
    let out = ShardDataset::open(dst)?;
    Ok(ConvertReport {
        shards,
        resumed_shards,
        converted_samples,
        converted_tokens,
        src_bytes: dataset_bytes(&source)?,
        dst_bytes: dataset_bytes(&out)?,
        tokens: source.num_tokens(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// A sample SRC holds that DST refuses (a NaN, say) is SRC's problem: name SRC's shard.
fn in_source(e: Error, shard: &Path) -> Error {
    match e {
        Error::Sample { index, sample_id, message } => {
            Error::Sample { index, sample_id, message: format!("{message} (in {}; `verify` SRC)", shard.display()) }
        }
        e => e,
    }
}

/// DST's committed shards must be SRC's first shards, sample for sample: otherwise DST holds
/// another conversion (or a capture) and resuming into it would mix datasets.
fn check_prefix(source: &ShardDataset, writer: &ShardWriter, dst: &Path) -> Result<()> {
    let done = &writer.manifest().shards;
    let theirs = &source.manifest().shards;
    let bad = |what: String| {
        Error::Options(format!(
            "{}: holds {what}, not a conversion of {}; choose another --out",
            dst.display(),
            source.dir().display()
        ))
    };
    if done.len() > theirs.len() {
        return Err(bad(format!("{} shards where the source has {}", done.len(), theirs.len())));
    }
    for (i, (a, b)) in done.iter().zip(theirs).enumerate() {
        if (a.samples, a.tokens, a.masked_tokens) != (b.samples, b.tokens, b.masked_tokens) {
            return Err(bad(format!("a shard {i} unlike the source's ({} vs {} samples)", a.samples, b.samples)));
        }
    }
    if !done.is_empty() {
        let out = ShardDataset::open(dst)?;
        let last = out.len() - 1;
        let (x, y) = (out.sample(last).expect("non-empty"), source.sample(last).expect("same length"));
        if x.input_ids() != y.input_ids() || x.sample_id() != y.sample_id() {
            return Err(bad(format!("other tokens at sample {last}")));
        }
    }
    Ok(())
}
