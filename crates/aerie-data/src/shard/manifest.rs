//! `manifest.json`: the list of complete shards in a dataset directory. A shard file exists for
//! every entry; a file without an entry is not part of the dataset (a crash left it, or it is
//! being written). The writer rewrites the manifest atomically after each shard it closes, so
//! the manifest is also the resume point of an interrupted capture.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::fsutil::{self, MANIFEST_FILE};
use super::metadata::{self, ShardMetadata};
use crate::{Error, Result};

/// One complete shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// File name inside the dataset directory (no path components).
    pub file: String,
    /// Samples in the shard (N).
    pub samples: u64,
    /// Tokens in the shard (T).
    pub tokens: u64,
    /// Tokens whose `loss_mask` is 1: what a trainer actually learns from.
    pub masked_tokens: u64,
    /// sha256 of the whole file, lowercase hex, when the writer computed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// The contents of `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `aerie-shard/1`, or `aerie-shard/2` for a scaled encoding.
    pub format: String,
    /// Complete shards, in sample order.
    pub shards: Vec<ShardEntry>,
    /// Total samples (sum over shards).
    pub samples: u64,
    /// Total tokens (sum over shards).
    pub tokens: u64,
    /// The dataset's metadata, in the same string→string form as each shard's `__metadata__`.
    pub metadata: BTreeMap<String, String>,
}

impl Manifest {
    /// An empty manifest for a new dataset.
    pub fn new(metadata: &ShardMetadata) -> Self {
        Self {
            format: metadata.dtype.format().into(),
            shards: Vec::new(),
            samples: 0,
            tokens: 0,
            metadata: metadata.to_map(),
        }
    }

    /// Masked tokens over all shards.
    pub fn masked_tokens(&self) -> u64 {
        self.shards.iter().map(|s| s.masked_tokens).sum()
    }

    /// Read `dir/manifest.json` and check it against itself: the format, the metadata, file
    /// names, and that the totals are the sums of the entries. Shard files are not opened.
    pub fn read(dir: impl AsRef<Path>) -> Result<(Self, ShardMetadata)> {
        let dir = dir.as_ref();
        if dir.is_file() {
            // One shard file given for its dataset: it said "shard-00000.safetensors/manifest.json:
            // Not a directory".
            let parent = dir.parent().filter(|p| p.join(MANIFEST_FILE).is_file());
            return Err(Error::manifest(
                dir,
                match parent {
                    Some(p) => format!("is a file: give the capture shard directory that holds it, {}", p.display()),
                    None => {
                        "is a file, not a capture shard directory (`aerie capture --out DIR` writes one)".to_owned()
                    }
                },
            ));
        }
        let path = dir.join(MANIFEST_FILE);
        let bytes = super::fsutil::open_regular(&path)
            .map_err(|e| match e {
                Error::Io { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            })
            .and_then(|mut f| {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut bytes).map(|_| bytes)
            })
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::manifest(
                    &path,
                    format!(
                        "not found: {} is not a capture shard directory (`aerie capture --out DIR` writes one)",
                        dir.display()
                    ),
                ),
                _ => Error::io(&path, e),
            })?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| Error::manifest(&path, format!("not valid JSON: {e}")))?;
        // The format first, so a future major version says so instead of failing on a field.
        match value.get("format").and_then(|f| f.as_str()) {
            Some(format) => metadata::check_format(format, &path)?,
            None => return Err(Error::manifest(&path, "no `format` string")),
        }
        let manifest: Manifest =
            serde_json::from_value(value).map_err(|e| Error::manifest(&path, format!("unexpected structure: {e}")))?;
        if let Some(format) = manifest.metadata.get("format") {
            metadata::check_format(format, &path)?;
        }
        let metadata = ShardMetadata::from_map(&manifest.metadata)
            .map_err(|source| Error::Metadata { path: path.clone(), source })?;
        if metadata.dtype.is_scaled() && metadata::format_major(&manifest.format) == Some(1) {
            return Err(Error::manifest(
                &path,
                format!(
                    "`format` is {} but the dtype `{}` needs {}",
                    manifest.format,
                    metadata.dtype,
                    metadata.dtype.format()
                ),
            ));
        }
        manifest.check(&path)?;
        Ok((manifest, metadata))
    }

    fn check(&self, path: &Path) -> Result<()> {
        let mut seen = HashSet::new();
        for (i, entry) in self.shards.iter().enumerate() {
            let bad = |message: String| Error::manifest(path, format!("shards[{i}]: {message}"));
            if !fsutil::is_plain_file_name(&entry.file) {
                return Err(bad(format!("`{}` is not a plain file name", entry.file)));
            }
            if !seen.insert(entry.file.as_str()) {
                return Err(bad(format!("`{}` is listed twice", entry.file)));
            }
            if entry.samples == 0 {
                return Err(bad(format!("`{}` has no samples", entry.file)));
            }
            if entry.tokens < entry.samples {
                return Err(bad(format!(
                    "`{}` has {} tokens for {} samples (empty samples are not allowed)",
                    entry.file, entry.tokens, entry.samples
                )));
            }
            if entry.masked_tokens > entry.tokens {
                return Err(bad(format!(
                    "`{}` has {} masked tokens out of {}",
                    entry.file, entry.masked_tokens, entry.tokens
                )));
            }
        }
        // Checked: the numbers come from a file, and must not panic on overflow.
        let total = |field: fn(&ShardEntry) -> u64| {
            self.shards
                .iter()
                .try_fold(0u64, |sum, s| sum.checked_add(field(s)))
                .ok_or_else(|| Error::manifest(path, "totals overflow"))
        };
        let samples = total(|s| s.samples)?;
        let tokens = total(|s| s.tokens)?;
        if samples != self.samples || tokens != self.tokens {
            return Err(Error::manifest(
                path,
                format!(
                    "totals say {} samples / {} tokens but the shards add up to {samples} / {tokens}",
                    self.samples, self.tokens
                ),
            ));
        }
        Ok(())
    }

    /// Write `dir/manifest.json` atomically.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        let mut json =
            serde_json::to_vec_pretty(self).map_err(|e| Error::manifest(&path, format!("cannot serialise: {e}")))?;
        json.push(b'\n');
        fsutil::write_bytes_atomic(&path, &json)
    }
}
