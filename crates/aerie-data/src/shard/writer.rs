//! Writing a dataset: samples are checked and buffered until a shard is full, then the shard is
//! written atomically and the manifest rewritten to list it. At any moment the directory holds
//! only complete shards and a manifest naming exactly those, so a capture that dies can resume
//! from the manifest, losing at most the shard it was filling.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, View};

use super::checks;
use super::codec;
use super::fsutil::{self, LOCK_FILE, MANIFEST_FILE, TMP_PREFIX};
use super::input::SampleRef;
use super::manifest::{Manifest, ShardEntry};
use super::metadata::ShardMetadata;
use super::names;
use super::reader::ShardDataset;
use crate::lock::OutputLock;
use crate::{Error, Result};

/// How a [`ShardWriter`] cuts and records shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardWriterOptions {
    /// Tokens per shard: a sample that would take the open shard past this starts a new one
    /// (a single longer sample gets a shard of its own). The writer holds one shard in memory,
    /// [`ShardMetadata::bytes_per_token`] × this many bytes.
    pub shard_tokens: usize,
    /// Record each shard's sha256 in the manifest (one extra read of the file, from the page
    /// cache), so `verify` can detect corruption in storage or transfer.
    pub checksums: bool,
}

impl Default for ShardWriterOptions {
    /// 65 536 tokens (1.5 GiB per shard for Ht = 4096, three bf16 layers), with checksums.
    fn default() -> Self {
        Self { shard_tokens: 65_536, checksums: true }
    }
}

impl ShardWriterOptions {
    fn validate(&self) -> Result<()> {
        if self.shard_tokens == 0 {
            return Err(Error::Options("shard_tokens must be positive".into()));
        }
        Ok(())
    }
}

/// What [`ShardWriter::resume`] found and cleaned up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeInfo {
    /// Complete shards already in the dataset.
    pub shards: usize,
    /// Samples in them: a capture that walks its inputs in a fixed order skips this many.
    pub samples: u64,
    /// Tokens in them.
    pub tokens: u64,
    /// Leftovers of the interrupted run that were deleted: temp files and shard files the
    /// manifest does not list (their samples were never committed, so they are captured again).
    pub removed: Vec<PathBuf>,
}

/// The shard being filled.
struct Pending {
    input_ids: Vec<u8>,
    loss_mask: Vec<u8>,
    offsets: Vec<i64>,
    aux_hidden: Vec<u8>,
    aux_scales: Vec<f32>,
    final_hidden: Vec<u8>,
    final_scales: Vec<f32>,
    topk_ids: Vec<u8>,
    topk_logprobs: Vec<u8>,
    sample_ids: Vec<i64>,
    masked: u64,
}

impl Pending {
    fn new() -> Self {
        Self {
            input_ids: Vec::new(),
            loss_mask: Vec::new(),
            offsets: vec![0],
            aux_hidden: Vec::new(),
            aux_scales: Vec::new(),
            final_hidden: Vec::new(),
            final_scales: Vec::new(),
            topk_ids: Vec::new(),
            topk_logprobs: Vec::new(),
            sample_ids: Vec::new(),
            masked: 0,
        }
    }

    fn tokens(&self) -> usize {
        self.offsets[self.offsets.len() - 1] as usize
    }

    fn samples(&self) -> usize {
        self.offsets.len() - 1
    }
}

/// Appends samples to a shard dataset directory. One writer per directory at a time (it holds a
/// lock file). Call [`ShardWriter::finish`] at the end: dropping the writer discards the shard
/// being filled, exactly as a crash would.
pub struct ShardWriter {
    dir: PathBuf,
    metadata: ShardMetadata,
    options: ShardWriterOptions,
    /// The manifest on disk: committed shards only.
    manifest: Manifest,
    pending: Pending,
    /// Ids of committed and pending samples.
    ids: HashSet<i64>,
    /// Whether samples carry ids; set by the first sample of the dataset.
    with_ids: Option<bool>,
    next_shard: usize,
    _lock: OutputLock,
}

impl ShardWriter {
    /// Start a new dataset in `dir` (created if missing). Refuses a directory that already holds
    /// a manifest or shard files. An empty manifest is written at once, so the dataset can be
    /// resumed even before its first shard closes.
    pub fn create(dir: impl AsRef<Path>, metadata: ShardMetadata, options: ShardWriterOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        options.validate()?;
        metadata.validate().map_err(|source| Error::Metadata { path: dir.clone(), source })?;
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let lock = OutputLock::inside(&dir, LOCK_FILE)?;
        let occupied =
            dir.join(MANIFEST_FILE).exists() || list_dir(&dir)?.iter().any(|name| fsutil::is_shard_file_name(name));
        if occupied {
            return Err(Error::AlreadyExists { path: dir });
        }
        let manifest = Manifest::new(&metadata);
        manifest.write(&dir)?;
        Ok(Self {
            dir,
            metadata,
            options,
            manifest,
            pending: Pending::new(),
            ids: HashSet::new(),
            with_ids: None,
            next_shard: 0,
            _lock: lock,
        })
    }

    /// Reopen an existing dataset to append to it. Temp files and shard files the manifest does
    /// not list are deleted (they are what a crash leaves behind); the listed shards are fully
    /// validated, as [`ShardDataset::open`] does. New shards use the dataset's metadata.
    pub fn resume(dir: impl AsRef<Path>, options: ShardWriterOptions) -> Result<(Self, ResumeInfo)> {
        let dir = dir.as_ref().to_path_buf();
        options.validate()?;
        let manifest_path = dir.join(MANIFEST_FILE);
        if !manifest_path.exists() {
            let e = std::io::Error::new(std::io::ErrorKind::NotFound, "no shard dataset here");
            return Err(Error::io(manifest_path, e));
        }
        let lock = OutputLock::inside(&dir, LOCK_FILE)?;
        let (manifest, _) = Manifest::read(&dir)?;
        let listed: HashSet<&str> = manifest.shards.iter().map(|s| s.file.as_str()).collect();
        let mut removed = Vec::new();
        for name in list_dir(&dir)? {
            let stale =
                name.starts_with(TMP_PREFIX) || (fsutil::is_shard_file_name(&name) && !listed.contains(name.as_str()));
            if stale {
                let path = dir.join(&name);
                fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                removed.push(path);
            }
        }
        if !removed.is_empty() {
            fsutil::sync_dir(&dir)?;
        }

        let dataset = ShardDataset::open(&dir)?;
        let ids: HashSet<i64> = dataset.iter().filter_map(|s| s.sample_id()).collect();
        let with_ids = (!dataset.is_empty()).then(|| dataset.has_sample_ids());
        let mut next_shard = manifest.shards.len();
        while listed.contains(fsutil::shard_file_name(next_shard).as_str()) {
            next_shard += 1;
        }
        let info = ResumeInfo {
            shards: dataset.num_shards(),
            samples: dataset.manifest().samples,
            tokens: dataset.manifest().tokens,
            removed,
        };
        let writer = Self {
            metadata: dataset.metadata().clone(),
            manifest: dataset.manifest().clone(),
            dir,
            options,
            pending: Pending::new(),
            ids,
            with_ids,
            next_shard,
            _lock: lock,
        };
        Ok((writer, info))
    }

    /// Resume `dir` when it holds a dataset, create it otherwise: the entry point of a capture
    /// that may have been interrupted. Resuming requires the dataset's metadata to equal
    /// `metadata`, except `created_by` (a newer capture build may finish an older run's work).
    pub fn open_or_create(
        dir: impl AsRef<Path>,
        metadata: ShardMetadata,
        options: ShardWriterOptions,
    ) -> Result<(Self, Option<ResumeInfo>)> {
        let dir = dir.as_ref();
        if !dir.join(MANIFEST_FILE).exists() {
            return Ok((Self::create(dir, metadata, options)?, None));
        }
        let (writer, info) = Self::resume(dir, options)?;
        let requested = ShardMetadata { created_by: writer.metadata.created_by.clone(), ..metadata };
        let differences = requested.differences(&writer.metadata);
        if !differences.is_empty() {
            return Err(Error::MetadataMismatch { path: dir.into(), reference: dir.join(MANIFEST_FILE), differences });
        }
        Ok((writer, Some(info)))
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata every shard gets.
    pub fn metadata(&self) -> &ShardMetadata {
        &self.metadata
    }

    /// The manifest as on disk: committed shards only.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Samples pushed so far, committed or pending (this is the index the next sample gets).
    pub fn samples_written(&self) -> u64 {
        self.manifest.samples + self.pending.samples() as u64
    }

    /// Tokens buffered in the shard being filled: lost if the process dies now.
    pub fn pending_tokens(&self) -> usize {
        self.pending.tokens()
    }

    /// Whether a sample with this id has been pushed (in this run or a resumed one): capture
    /// skips such inputs after a resume.
    pub fn contains_sample_id(&self, id: i64) -> bool {
        self.ids.contains(&id)
    }

    /// Append one sample. It is checked entirely (lengths, teacher tensors, ids in the
    /// vocabulary, a 0/1 mask, finite hidden values after conversion, descending log-probs); a
    /// refused sample leaves no trace in the dataset. (Closing the previous, full shard may
    /// already have happened: that only commits earlier samples.)
    pub fn push(&mut self, sample: SampleRef<'_>) -> Result<()> {
        let index = self.samples_written();
        let fail = |message: String| Error::Sample { index, sample_id: sample.sample_id, message };
        let masked = self.check(&sample).map_err(fail)?;
        let t = sample.input_ids.len();
        if self.pending.tokens() > 0 && self.pending.tokens() + t > self.options.shard_tokens {
            self.flush()?;
        }
        self.append(&sample, masked).map_err(fail)?;
        if self.pending.tokens() >= self.options.shard_tokens {
            self.flush()?;
        }
        Ok(())
    }

    /// Everything but finiteness, which is checked during conversion. Returns the masked count.
    fn check(&self, s: &SampleRef<'_>) -> std::result::Result<u64, String> {
        let m = &self.metadata;
        let t = s.input_ids.len();
        if t == 0 {
            return Err("has no tokens".into());
        }
        if s.loss_mask.len() != t {
            return Err(format!("loss_mask has {} entries but input_ids has {t}", s.loss_mask.len()));
        }
        let masked = checks::loss_mask(s.loss_mask)?;
        checks::token_ids(names::INPUT_IDS, s.input_ids, m.target_vocab_size)?;
        let expect_len = |name: &str, len: usize, width: usize, why: &str| {
            if t.checked_mul(width) == Some(len) {
                Ok(())
            } else {
                Err(format!("{name} has {len} values, expected {t} tokens × {width} ({why})"))
            }
        };
        let aux_why = format!("{} layers × hidden_size {}", m.aux_layer_ids.len(), m.hidden_size);
        expect_len(names::AUX_HIDDEN, s.aux_hidden.len(), m.aux_width(), &aux_why)?;
        let teacher = m.teacher;
        match (&s.final_hidden, teacher.has_final_hidden()) {
            (Some(rows), true) => expect_len(names::FINAL_HIDDEN, rows.len(), m.hidden_size, "hidden_size")?,
            (None, true) => return Err(format!("final_hidden missing (teacher `{teacher}`)")),
            (Some(_), false) => {
                return Err(format!("final_hidden given but the teacher is `{teacher}`"));
            }
            (None, false) => {}
        }
        match (&s.topk, teacher.topk()) {
            (Some(topk), Some(k)) => {
                let why = format!("teacher `{teacher}`");
                expect_len(names::TOPK_IDS, topk.ids.len(), k, &why)?;
                expect_len(names::TOPK_LOGPROBS, topk.logprobs.len(), k, &why)?;
                checks::topk(topk.ids, topk.logprobs, k, m.target_vocab_size).map_err(|(_, message)| message)?;
            }
            (None, Some(_)) => return Err(format!("top-k teacher missing (teacher `{teacher}`)")),
            (Some(_), None) => {
                return Err(format!("top-k teacher given but the teacher is `{teacher}`"));
            }
            (None, None) => {}
        }
        match (self.with_ids, s.sample_id) {
            (Some(true), None) => return Err("has no sample_id but earlier samples do".into()),
            (Some(false), Some(_)) => {
                return Err("has a sample_id but earlier samples do not".into());
            }
            (_, Some(id)) if self.ids.contains(&id) => {
                return Err(format!("sample id {id} was already written to this dataset"));
            }
            _ => {}
        }
        Ok(masked)
    }

    /// Append a checked sample; on a non-finite value, roll the buffers back.
    fn append(&mut self, s: &SampleRef<'_>, masked: u64) -> std::result::Result<(), String> {
        let dtype = self.metadata.dtype;
        let ht = self.metadata.hidden_size;
        let group = dtype.group(ht).unwrap_or(ht);
        let p = &mut self.pending;
        let marks = (p.aux_hidden.len(), p.aux_scales.len(), p.final_hidden.len(), p.final_scales.len());
        let not_finite = |name: &str, i: usize, width: usize| {
            format!("{name}[{}, {}] is not finite as {dtype}", i / width, i % width)
        };
        let aux_width = self.metadata.aux_width();
        let mut result = codec::encode_hidden(s.aux_hidden, dtype, group, &mut p.aux_hidden, &mut p.aux_scales)
            .map_err(|i| not_finite(names::AUX_HIDDEN, i, aux_width));
        if let (Ok(()), Some(rows)) = (&result, s.final_hidden) {
            result = codec::encode_hidden(rows, dtype, group, &mut p.final_hidden, &mut p.final_scales)
                .map_err(|i| not_finite(names::FINAL_HIDDEN, i, ht));
        }
        if result.is_err() {
            p.aux_hidden.truncate(marks.0);
            p.aux_scales.truncate(marks.1);
            p.final_hidden.truncate(marks.2);
            p.final_scales.truncate(marks.3);
            return result;
        }
        p.input_ids.extend_from_slice(codec::i32_bytes(s.input_ids));
        p.loss_mask.extend_from_slice(s.loss_mask);
        if let Some(topk) = s.topk {
            p.topk_ids.extend_from_slice(codec::i32_bytes(topk.ids));
            p.topk_logprobs.extend(topk.logprobs.iter().flat_map(|v| v.to_le_bytes()));
        }
        let end = p.tokens() + s.input_ids.len();
        p.offsets.push(end as i64);
        p.masked += masked;
        if let Some(id) = s.sample_id {
            p.sample_ids.push(id);
            self.ids.insert(id);
        }
        self.with_ids = Some(s.sample_id.is_some());
        Ok(())
    }

    /// Close the shard being filled now (if it holds anything): write it, then list it in the
    /// manifest. A capture may call this at checkpoints to bound what a crash loses.
    pub fn flush(&mut self) -> Result<()> {
        if self.pending.samples() == 0 {
            return Ok(());
        }
        let file = fsutil::shard_file_name(self.next_shard);
        let path = self.dir.join(&file);
        let p = &self.pending;
        let (t, n) = (p.tokens(), p.samples());
        let m = &self.metadata;
        let mut tensors = vec![
            (names::INPUT_IDS, Raw::new(Dtype::I32, vec![t], &p.input_ids)),
            (names::LOSS_MASK, Raw::new(Dtype::U8, vec![t], &p.loss_mask)),
            (names::SAMPLE_OFFSETS, Raw::new(Dtype::I64, vec![n + 1], bytemuck::cast_slice(&p.offsets))),
            (
                names::AUX_HIDDEN,
                Raw::new(m.dtype.to_safetensors(), vec![t, m.dtype.stored_width(m.aux_width())], &p.aux_hidden),
            ),
        ];
        let per_row = |scales: &[f32]| scales.len() / t;
        if m.dtype.is_scaled() {
            let raw = Raw::new(Dtype::F32, vec![t, per_row(&p.aux_scales)], bytemuck::cast_slice(&p.aux_scales));
            tensors.push((names::AUX_HIDDEN_SCALES, raw));
        }
        if m.teacher.has_final_hidden() {
            let raw = Raw::new(m.dtype.to_safetensors(), vec![t, m.dtype.stored_width(m.hidden_size)], &p.final_hidden);
            tensors.push((names::FINAL_HIDDEN, raw));
            if m.dtype.is_scaled() {
                let raw =
                    Raw::new(Dtype::F32, vec![t, per_row(&p.final_scales)], bytemuck::cast_slice(&p.final_scales));
                tensors.push((names::FINAL_HIDDEN_SCALES, raw));
            }
        }
        if let Some(k) = m.teacher.topk() {
            tensors.push((names::TOPK_IDS, Raw::new(Dtype::I32, vec![t, k], &p.topk_ids)));
            tensors.push((names::TOPK_LOGPROBS, Raw::new(Dtype::F32, vec![t, k], &p.topk_logprobs)));
        }
        if !p.sample_ids.is_empty() {
            tensors.push((names::SAMPLE_IDS, Raw::new(Dtype::I64, vec![n], bytemuck::cast_slice(&p.sample_ids))));
        }
        let info: HashMap<String, String> = m.to_map().into_iter().collect();
        fsutil::write_atomic(&path, |tmp| {
            safetensors::serialize_to_file(tensors, Some(info), tmp)
                .map_err(|e| Error::Safetensors { path: tmp.into(), message: e.to_string() })?;
            crate::st_header::sort_metadata_in_file(tmp)
        })?;
        let sha256 = if self.options.checksums { Some(fsutil::sha256_file(&path)?) } else { None };

        let mut manifest = self.manifest.clone();
        manifest.shards.push(ShardEntry { file, samples: n as u64, tokens: t as u64, masked_tokens: p.masked, sha256 });
        manifest.samples += n as u64;
        manifest.tokens += t as u64;
        // Until this rename lands the new shard is unlisted: a crash here loses its samples
        // (resume deletes the file), never the dataset's consistency. On an error the buffers
        // stay, so a retry writes the same shard again.
        manifest.write(&self.dir)?;
        self.manifest = manifest;
        self.pending = Pending::new();
        self.next_shard += 1;
        Ok(())
    }

    /// Close the last shard, write the final manifest and release the lock.
    pub fn finish(mut self) -> Result<Manifest> {
        self.flush()?;
        self.manifest.write(&self.dir)?;
        Ok(self.manifest.clone())
    }
}

impl std::fmt::Debug for ShardWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardWriter")
            .field("dir", &self.dir)
            .field("committed_shards", &self.manifest.shards.len())
            .field("committed_samples", &self.manifest.samples)
            .field("pending_samples", &self.pending.samples())
            .field("pending_tokens", &self.pending.tokens())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Names in `dir` (lossy UTF-8; non-UTF-8 names cannot be ours anyway).
fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    entries
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()).map_err(|e| Error::io(dir, e)))
        .collect()
}

/// A borrowed tensor for `safetensors::serialize_to_file`.
struct Raw<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl<'a> Raw<'a> {
    fn new(dtype: Dtype, shape: Vec<usize>, data: &'a [u8]) -> Self {
        Self { dtype, shape, data }
    }
}

impl View for Raw<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}
