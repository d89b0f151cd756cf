//! Opening a dataset: read the manifest, memory-map every listed shard, and check each header
//! against the manifest and the metadata before handing out a single sample. All structural
//! checks (dtypes, shapes, offsets, teacher tensors, metadata agreement) happen on open, per shard
//! in `header`, across shards here, at a cost of one header parse plus the offsets per shard;
//! content checks that need a full scan live in [`ShardDataset::verify`].

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::encoding::FloatDtype;
use super::fsutil::MANIFEST_FILE;
use super::header::{Shard, open_shard};
use super::manifest::Manifest;
use super::metadata::ShardMetadata;
use super::names;
use super::view::{Layout, SampleView};
use crate::{Error, Result};

/// A validated, memory-mapped shard dataset. Samples are numbered across shards in manifest
/// order; views borrow from the maps, so the dataset must outlive them.
pub struct ShardDataset {
    pub(crate) dir: PathBuf,
    pub(crate) manifest: Manifest,
    pub(crate) metadata: ShardMetadata,
    pub(crate) layout: Layout,
    pub(crate) shards: Vec<Shard>,
    /// `first_sample[s]` is the dataset index of shard `s`'s first sample; one extra entry holds
    /// the total.
    first_sample: Vec<usize>,
}

impl std::fmt::Debug for ShardDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardDataset")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("samples", &self.len())
            .field("tokens", &self.manifest.tokens)
            .finish_non_exhaustive()
    }
}

impl ShardDataset {
    /// Open the dataset in `dir` and validate every shard header against the manifest and the
    /// metadata. Shard files not listed in the manifest (left by an interrupted writer) are not
    /// read.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let (manifest, metadata) = Manifest::read(&dir)?;
        let reference = dir.join(MANIFEST_FILE);
        let mut layout = Layout {
            aux_width: metadata.aux_width(),
            hidden_size: metadata.hidden_size,
            dtype: metadata.dtype,
            k: metadata.teacher.topk().unwrap_or(0),
            logprobs_dtype: None,
            vocab: metadata.target_vocab_size,
        };
        let mut shards: Vec<Shard> = Vec::with_capacity(manifest.shards.len());
        let mut first_sample = vec![0];
        let mut seen_ids: HashMap<i64, usize> = HashMap::new();
        for entry in &manifest.shards {
            let shard = open_shard(&dir.join(&entry.file), entry, &metadata, &reference)?;
            if let Some(first) = shards.first() {
                agree_with_first(&shard, first)?;
            }
            layout.logprobs_dtype = shard.logprobs_dtype;
            for &id in shard.sample_ids.iter().flatten() {
                if let Some(prev) = seen_ids.insert(id, shards.len()) {
                    let first = shards.get(prev).map_or(&shard.path, |s| &s.path).clone();
                    return Err(Error::DuplicateSampleId { path: shard.path.clone(), first, id });
                }
            }
            first_sample.push(first_sample[shards.len()] + shard.offsets.len() - 1);
            shards.push(shard);
        }
        Ok(Self { dir, manifest, metadata, layout, shards, first_sample })
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata every shard agrees on.
    pub fn metadata(&self) -> &ShardMetadata {
        &self.metadata
    }

    /// The manifest as read.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.first_sample[self.shards.len()]
    }

    /// Whether the dataset has no samples (a capture that has not closed a shard yet).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of tokens over all samples.
    pub fn num_tokens(&self) -> u64 {
        self.manifest.tokens
    }

    /// Number of shard files.
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// Whether samples carry source ids (all do, or none).
    pub fn has_sample_ids(&self) -> bool {
        self.shards.first().is_some_and(|s| s.sample_ids.is_some())
    }

    /// Storage dtype of `teacher_topk_logprobs`, when there are any.
    pub fn logprobs_dtype(&self) -> Option<FloatDtype> {
        self.layout.logprobs_dtype
    }

    /// Sample `index`, or `None` past the end.
    pub fn sample(&self, index: usize) -> Option<SampleView<'_>> {
        if index >= self.len() {
            return None;
        }
        // The last shard whose first sample is <= index.
        let s = self.first_sample.partition_point(|&first| first <= index) - 1;
        Some(SampleView { shard: &self.shards[s], layout: &self.layout, local: index - self.first_sample[s], index })
    }

    /// Every sample in dataset order.
    pub fn iter(&self) -> Samples<'_> {
        Samples { dataset: self, range: 0..self.len() }
    }
}

impl<'a> IntoIterator for &'a ShardDataset {
    type Item = SampleView<'a>;
    type IntoIter = Samples<'a>;

    fn into_iter(self) -> Samples<'a> {
        self.iter()
    }
}

/// Iterator over the samples of a [`ShardDataset`].
#[derive(Debug, Clone)]
pub struct Samples<'a> {
    dataset: &'a ShardDataset,
    range: Range<usize>,
}

impl<'a> Iterator for Samples<'a> {
    type Item = SampleView<'a>;

    fn next(&mut self) -> Option<SampleView<'a>> {
        let i = self.range.next()?;
        self.dataset.sample(i)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.range.size_hint()
    }
}

impl DoubleEndedIterator for Samples<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let i = self.range.next_back()?;
        self.dataset.sample(i)
    }
}

impl ExactSizeIterator for Samples<'_> {}

/// Things every shard of a dataset must share beyond the metadata.
fn agree_with_first(shard: &Shard, first: &Shard) -> Result<()> {
    let name = |p: &Path| p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into());
    if shard.sample_ids.is_some() != first.sample_ids.is_some() {
        let (here, there) = if shard.sample_ids.is_some() { ("present", "absent") } else { ("absent", "present") };
        return Err(Error::tensor(
            &shard.path,
            names::SAMPLE_IDS,
            format!("{here} here but {there} in {}", name(&first.path)),
        ));
    }
    if shard.logprobs_dtype != first.logprobs_dtype {
        let show = |d: Option<FloatDtype>| d.map_or("absent".into(), |d| d.to_string());
        return Err(Error::tensor(
            &shard.path,
            names::TOPK_LOGPROBS,
            format!(
                "stored as {} here but {} in {}",
                show(shard.logprobs_dtype),
                show(first.logprobs_dtype),
                name(&first.path)
            ),
        ));
    }
    Ok(())
}
