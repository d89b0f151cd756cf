//! `aerie data prepare`, library part: read chat data, normalise it, render it with the chat
//! template, tokenise it with its loss mask, and write a prepared dataset:
//!
//! ```text
//! PREPARED/
//!   train.parquet   input_ids list<int32>, loss_mask list<uint8>, source_id string, sample_id int64
//!   eval.parquet    same columns (when an eval fraction is set)
//!   report.json     format "aerie-prepared/1", options, counts per drop/trim reason, tokens,
//!                   masked tokens, length histogram, the target vocab size
//! ```
//!
//! Everything streams: records are read and normalised in chunks of a few hundred, each chunk is
//! rendered and tokenised on a thread pool, and the samples are appended in input order (the
//! output does not depend on the thread count); each split's parquet file is written in record
//! batches with bounded row groups, so memory stays flat on inputs of any size. Files appear under their final names only once complete (temp file,
//! fsync, rename). The split of a sample is a pure function of its source id (sha256), so
//! re-running on grown data keeps every earlier conversation in the split it was in, and
//! duplicates of one id never straddle train and eval. `sample_id` is the record's position in
//! the input.

mod dataset;
pub mod show;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use rayon::prelude::*;

use crate::conversation::{DropReason, NormalizeOptions, NormalizeReport, Normalized, normalize};
use crate::lock::OutputLock;
use crate::readers::{ConversationReader, ProgressUnit, ReadOptions, ReadReport};
use crate::template::{ChatEncoder, ChatTemplate, EncodeOptions, TemplateChoice};
use crate::tokenizer::TokenizerFiles;
use crate::{Error, Result};

pub use dataset::{PreparedDataset, PreparedSample, PreparedSamples};
pub use writer::{columns, schema};

/// The `format` of `report.json`.
pub const PREPARED_FORMAT: &str = "aerie-prepared/1";
/// The report's file name.
pub const REPORT_FILE: &str = "report.json";
/// The training split.
pub const TRAIN: &str = "train";
/// The held-out split.
pub const EVAL: &str = "eval";
/// Conversations encoded in parallel per step.
const CHUNK: usize = 256;
/// Rejection messages kept verbatim in the report.
const MAX_EXAMPLES: usize = 10;

/// Options of [`prepare`].
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// Chat data: ShareGPT JSON, JSONL, or parquet (file or directory).
    pub data: PathBuf,
    /// Tokenizer directory (or its `tokenizer.json` / `tiktoken.model`).
    pub tokenizer: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// The chat template.
    pub template: TemplateChoice,
    /// Input layout and strictness.
    pub read: ReadOptions,
    /// Normalisation rules.
    pub normalize: NormalizeOptions,
    /// Truncation, system prompt, template variables.
    pub encode: EncodeOptions,
    /// Stop after this many kept samples.
    pub max_samples: Option<u64>,
    /// Share of samples (by source-id hash) that go to `eval.parquet`; 0 writes no eval split.
    pub eval_fraction: f64,
    /// Replace an existing prepared dataset in `out`.
    pub overwrite: bool,
    /// Worker threads for rendering and tokenising; 0 uses every core. The output is the same
    /// for any number.
    pub threads: usize,
    /// Target vocabulary size to record; default: the tokenizer directory's
    /// ([`TokenizerFiles::vocab_size`]).
    pub vocab_size: Option<usize>,
}

impl PrepareOptions {
    /// Options with the defaults: auto template, max length 2048, no eval split.
    pub fn new(data: impl Into<PathBuf>, tokenizer: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        Self {
            data: data.into(),
            tokenizer: tokenizer.into(),
            out: out.into(),
            template: TemplateChoice::Auto,
            read: ReadOptions::default(),
            normalize: NormalizeOptions::default(),
            encode: EncodeOptions { max_length: Some(2048), ..EncodeOptions::default() },
            max_samples: None,
            eval_fraction: 0.0,
            overwrite: false,
            threads: 0,
            vocab_size: None,
        }
    }
}

/// Totals of one split.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitStats {
    /// File name inside the dataset directory.
    pub file: String,
    /// Samples.
    pub samples: u64,
    /// Tokens.
    pub tokens: u64,
    /// Tokens under the loss mask.
    pub masked_tokens: u64,
}

/// Samples whose length is in `(previous bucket's max_tokens, max_tokens]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LengthBucket {
    /// Upper bound (inclusive) of the bucket.
    pub max_tokens: u64,
    /// Samples in it.
    pub samples: u64,
}

/// What [`prepare`] did; saved as `report.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrepareReport {
    /// [`PREPARED_FORMAT`].
    pub format: String,
    /// The input.
    pub data: PathBuf,
    /// The tokenizer directory.
    pub tokenizer: PathBuf,
    /// The tokenizer digest ([`crate::tokenizer::TokenizerFiles::digest`]).
    pub tokenizer_digest: String,
    /// Target vocabulary size V.
    pub vocab_size: usize,
    /// The template's name.
    pub template: String,
    /// sha256 of the template source.
    pub template_digest: String,
    /// Truncation length.
    pub max_length: Option<usize>,
    /// Share of source ids sent to eval.
    pub eval_fraction: f64,
    /// System prompt injected, if any.
    pub system_prompt: Option<String>,
    /// What the reader met (truncation, malformed records).
    pub read: ReadReport,
    /// Conversations kept, dropped and trimmed per reason (malformed records included).
    pub conversations: NormalizeReport,
    /// The first few rejection messages (template errors and the like).
    pub rejection_examples: Vec<String>,
    /// Per split.
    pub splits: BTreeMap<String, SplitStats>,
    /// Samples written.
    pub samples: u64,
    /// Samples per mask mode: `conversation` (one per conversation, the prefix-render method)
    /// or `turn_chain` (one per assistant turn chain, for reasoning templates).
    #[serde(default)]
    pub samples_per_mode: BTreeMap<String, u64>,
    /// Samples whose conversation has a `tools` list, per how the template declared it:
    /// `typescript` (Kimi-K2.5's `tools_ts_str`), `json_fallback` (K2.5's JSON fallback, where
    /// its encoder raises), `template` (any other template's own declaration).
    #[serde(default)]
    pub samples_with_tools: BTreeMap<String, u64>,
    /// Samples whose closing answer is the engine's own token ids (regenerated data that keeps
    /// `token_ids`: `docs/regenerate.md`).
    #[serde(default)]
    pub samples_with_engine_ids: u64,
    /// Samples whose closing answer had engine ids that could not be used (ids outside the
    /// vocabulary, or not decoding to the turn's content): tokenised from the text instead.
    #[serde(default)]
    pub engine_ids_not_used: u64,
    /// The template variables given (`--template-kwarg`).
    #[serde(default)]
    pub template_kwargs: BTreeMap<String, serde_json::Value>,
    /// Tokens written.
    pub tokens: u64,
    /// Tokens under the loss mask.
    pub masked_tokens: u64,
    /// Sample lengths in power-of-two buckets from 64 up.
    pub length_histogram: Vec<LengthBucket>,
}

/// Progress of a running [`prepare`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareProgress {
    /// Input consumed, in `unit`.
    pub done: u64,
    /// Input size, in `unit`.
    pub total: u64,
    /// Bytes (JSON) or rows (parquet).
    pub unit: ProgressUnit,
    /// Records read.
    pub records: u64,
    /// Samples written.
    pub samples: u64,
}

/// Which split a source id belongs to: eval when the first 8 bytes of sha256(id), as a
/// fraction of 2^64, are below `eval_fraction`.
pub fn split_of(source_id: &str, eval_fraction: f64) -> &'static str {
    if eval_fraction <= 0.0 {
        return TRAIN;
    }
    let h = Sha256::digest(source_id.as_bytes());
    let x = u64::from_be_bytes(h[..8].try_into().expect("8 bytes"));
    if (x as f64) < eval_fraction * 2f64.powi(64) { EVAL } else { TRAIN }
}

fn bucket_of(len: u64) -> u64 {
    len.max(64).next_power_of_two()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Check the options and take `out`'s lock for the whole run (two runs would write the same
/// temp files), then refuse an existing dataset unless it may be overwritten.
fn check_options(opts: &PrepareOptions) -> Result<OutputLock> {
    if !(0.0..1.0).contains(&opts.eval_fraction) {
        return Err(Error::InvalidOption(format!("eval fraction {} is not in [0, 1)", opts.eval_fraction)));
    }
    if opts.max_samples == Some(0) {
        return Err(Error::InvalidOption("max_samples must be at least 1".into()));
    }
    crate::paths::create_output_dir(&opts.out, &opts.out).map_err(|(path, e)| Error::io(path, e))?;
    let lock = OutputLock::beside(&opts.out)?;
    let existing: Vec<_> = [REPORT_FILE, "train.parquet", "eval.parquet"]
        .iter()
        .map(|f| opts.out.join(f))
        .filter(|p| p.exists())
        .collect();
    if !existing.is_empty() && !opts.overwrite {
        return Err(Error::InvalidOption(format!(
            "{} already holds a prepared dataset ({}); choose another --out, or pass --overwrite to replace it",
            opts.out.display(),
            existing.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    // `--overwrite` replaces a prepared dataset, recognised by its report, and never the input.
    let report = opts.out.join(REPORT_FILE);
    if !existing.is_empty() && !report.exists() {
        return Err(Error::NotOurs {
            path: opts.out.clone(),
            message: format!(
                "holds {} but no {REPORT_FILE}, so it is not a prepared dataset that aerie wrote; refusing to \
                 overwrite it: move those files away or choose another --out",
                existing
                    .iter()
                    .filter_map(|p| p.file_name())
                    .map(|n| n.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    crate::owned::check_json_is_ours(&report, "a prepared dataset's report", "in --out", |v| {
        crate::owned::has_format(v, PREPARED_FORMAT)
    })?;
    for f in [REPORT_FILE, "train.parquet", "eval.parquet"] {
        crate::owned::check_not_input(&opts.out.join(f), "--out", &[("--data", &opts.data)])?;
    }
    Ok(lock)
}

/// Prepare `opts.data` into `opts.out`; `progress` is called every few records.
pub fn prepare(opts: &PrepareOptions, progress: &mut dyn FnMut(&PrepareProgress)) -> Result<PrepareReport> {
    let _lock = check_options(opts)?;
    let tok = TokenizerFiles::load(&opts.tokenizer)?;
    let template = ChatTemplate::resolve(&opts.template, &tok)?;
    let encoder = ChatEncoder::new(&template, &tok.tokenizer, opts.encode.clone())?;
    let vocab_size = opts.vocab_size.unwrap_or_else(|| tok.vocab_size());
    let mut reader = ConversationReader::open(&opts.data, &opts.read)?;
    let metadata = vec![
        ("aerie.format".to_owned(), PREPARED_FORMAT.to_owned()),
        ("aerie.tokenizer_digest".to_owned(), tok.digest.clone()),
        ("aerie.template".to_owned(), template.name().to_owned()),
        ("aerie.vocab_size".to_owned(), vocab_size.to_string()),
    ];
    let mut split_names = vec![TRAIN];
    if opts.eval_fraction > 0.0 {
        split_names.push(EVAL);
    }
    let mut writers = BTreeMap::new();
    for name in &split_names {
        let path = opts.out.join(format!("{name}.parquet"));
        writers.insert(*name, writer::SplitWriter::create(&path, &metadata)?);
    }
    let mut conversations = NormalizeReport::default();
    let mut examples = Vec::new();
    let mut histogram: BTreeMap<u64, u64> = BTreeMap::new();
    let mut samples_per_mode: BTreeMap<String, u64> = BTreeMap::new();
    let mut samples_with_tools: BTreeMap<String, u64> = BTreeMap::new();
    let (mut samples_with_engine_ids, mut engine_ids_not_used) = (0u64, 0u64);
    let mut samples = 0u64;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| Error::InvalidOption(format!("cannot start {} worker threads: {e}", opts.threads)))?;
    let mut chunk: Vec<(u64, Normalized)> = Vec::with_capacity(CHUNK);
    let mut exhausted = false;
    while !exhausted && opts.max_samples.is_none_or(|m| samples < m) {
        // Read and normalise a chunk (sequential), encode it (parallel), write it (sequential,
        // in input order: the output does not depend on the number of threads).
        // With a sample cap, read no more records than could still be kept, so that every
        // record read is also counted (kept or dropped) in the report.
        let want = opts.max_samples.map_or(CHUNK, |m| CHUNK.min((m - samples) as usize));
        while chunk.len() < want {
            let Some(raw) = reader.next() else {
                exhausted = true;
                break;
            };
            let raw = raw?;
            conversations.count_roles(&raw);
            let index = raw.index;
            match normalize(raw, &opts.normalize) {
                Ok(n) => chunk.push((index, n)),
                Err(reason) => conversations.drop(reason),
            }
        }
        let encoded: Vec<_> =
            pool.install(|| chunk.par_iter().map(|(_, n)| encoder.encode_all(&n.conversation)).collect());
        for ((index, normalized), result) in chunk.drain(..).zip(encoded) {
            if opts.max_samples.is_some_and(|m| samples >= m) {
                break;
            }
            let conv = normalized.conversation;
            let chain_samples = match result? {
                Ok(s) => s,
                Err(rejected) => {
                    conversations.drop(rejected.reason);
                    if examples.len() < MAX_EXAMPLES {
                        examples.push(format!("{} ({}): {}", conv.id, rejected.reason.as_str(), rejected.message));
                    }
                    continue;
                }
            };
            let mut trims = normalized.trims;
            for s in &chain_samples {
                for t in &s.trims {
                    if !trims.contains(t) {
                        trims.push(*t);
                    }
                }
            }
            conversations.keep(&trims);
            // All chains of a conversation go to the split of its source id.
            let split = split_of(&conv.id, opts.eval_fraction);
            let tools = template.tool_declaration(conv.tools.as_ref(), &opts.encode.template_kwargs);
            for sample in chain_samples {
                if opts.max_samples.is_some_and(|m| samples >= m) {
                    break;
                }
                let w = writers.get_mut(split).expect("split writer exists");
                // One sample per conversation: the record's position. Per turn chain: the
                // position × 65,536 + the chain's index, so the id says which chain it is.
                let (sample_id, mode) = match sample.chain {
                    None => (index as i64, MODE_CONVERSATION),
                    Some(k) => (((index as i64) << 16) | i64::from(k.min(0xffff)), MODE_TURN_CHAIN),
                };
                w.push(&sample.input_ids, &sample.loss_mask, &conv.id, sample_id)?;
                *histogram.entry(bucket_of(sample.input_ids.len() as u64)).or_default() += 1;
                *samples_per_mode.entry(mode.to_owned()).or_default() += 1;
                if let Some(how) = tools {
                    *samples_with_tools.entry(how.to_owned()).or_default() += 1;
                }
                match sample.engine_ids {
                    Some(true) => samples_with_engine_ids += 1,
                    Some(false) => engine_ids_not_used += 1,
                    None => {}
                }
                samples += 1;
            }
        }
        let (done, total, unit) = reader.progress();
        progress(&PrepareProgress { done, total, unit, records: reader.report().records, samples });
    }
    let (done, total, unit) = reader.progress();
    let read = reader.into_report();
    progress(&PrepareProgress { done, total, unit, records: read.records, samples });
    for _ in 0..read.malformed {
        conversations.drop(DropReason::Malformed);
    }
    if samples == 0 && read.records == 0 && read.malformed == 0 && read.warnings.is_empty() {
        // An empty file said "0 records: no sample kept; dropped per reason: {}".
        return Err(Error::Input {
            path: opts.data.clone(),
            at: "0 records".to_owned(),
            message: "holds no record (an empty file?): give chat records, one conversation per JSONL line or parquet row (docs/prepared-data.md)".into(),
        });
    }
    if samples == 0 {
        return Err(Error::Input {
            path: opts.data.clone(),
            at: format!("{} records", read.records),
            message: format!(
                "no sample kept; dropped per reason: {}{}{}",
                serde_json::to_string(&conversations.dropped).unwrap_or_default(),
                read.warnings.first().map(|w| format!("; first: {w}")).unwrap_or_default(),
                examples.first().map(|e| format!("; first rejection: {e}")).unwrap_or_default()
            ),
        });
    }
    let mut splits = BTreeMap::new();
    for (name, w) in writers {
        splits.insert(name.to_owned(), w.finish()?);
    }
    if opts.eval_fraction <= 0.0 {
        let stale = opts.out.join("eval.parquet");
        if stale.exists() {
            std::fs::remove_file(&stale).map_err(|e| Error::io(&stale, e))?;
        }
    }
    let max_bucket = histogram.keys().max().copied().unwrap_or(64);
    let mut length_histogram = Vec::new();
    let mut b = 64;
    while b <= max_bucket {
        length_histogram.push(LengthBucket { max_tokens: b, samples: histogram.get(&b).copied().unwrap_or(0) });
        b *= 2;
    }
    let report = PrepareReport {
        format: PREPARED_FORMAT.into(),
        data: opts.data.clone(),
        tokenizer: tok.dir.clone(),
        tokenizer_digest: tok.digest.clone(),
        vocab_size,
        template: template.name().to_owned(),
        template_digest: hex(&Sha256::digest(template.source().as_bytes())),
        max_length: opts.encode.max_length,
        eval_fraction: opts.eval_fraction,
        system_prompt: opts.encode.system_prompt.clone(),
        read,
        conversations,
        rejection_examples: examples,
        samples,
        samples_per_mode,
        samples_with_tools,
        samples_with_engine_ids,
        engine_ids_not_used,
        template_kwargs: opts.encode.template_kwargs.clone(),
        tokens: splits.values().map(|s| s.tokens).sum(),
        masked_tokens: splits.values().map(|s| s.masked_tokens).sum(),
        splits,
        length_histogram,
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| Error::InvalidOption(e.to_string()))?;
    crate::atomic::write_bytes(&opts.out.join(REPORT_FILE), &json)?;
    Ok(report)
}

/// [`PrepareReport::samples_per_mode`] key of one sample per conversation.
pub const MODE_CONVERSATION: &str = "conversation";
/// [`PrepareReport::samples_per_mode`] key of one sample per assistant turn chain.
pub const MODE_TURN_CHAIN: &str = "turn_chain";

/// Whether `dir` holds a prepared dataset (a `report.json`).
pub fn is_prepared_dir(dir: &Path) -> bool {
    dir.join(REPORT_FILE).is_file()
}
