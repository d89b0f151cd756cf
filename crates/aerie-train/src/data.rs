//! The training data: which samples train and which are held out, and in what order they are
//! seen. Everything here is a pure function of the datasets, the config and the seed, so a run
//! resumed from `(epoch, micro-batch cursor)` sees exactly the batches an uninterrupted run sees.
//!
//! Per epoch: shuffle the training samples with a PRNG seeded by `(seed, epoch)`; cut the order
//! into windows of `bucket_window` samples and sort each window by length (length bucketing);
//! pack each window greedily into micro-batches whose padded size B·Lmax stays within
//! `batch_tokens`; shuffle the micro-batches so lengths do not trend within the epoch.

use std::path::{Path, PathBuf};

use aerie_data::shard::{SampleView, ShardDataset};

use crate::config::DataConfig;
use aerie_model::rng::SplitMix;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The PRNG state that orders epoch `epoch` of a run seeded `seed`.
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    let mut m = SplitMix(seed ^ 0x6165_7269_655f_7472); // "aerie_tr"
    let base = m.next_u64();
    SplitMix(base ^ epoch.wrapping_mul(0xD6E8_FEB8_6659_FD93)).next_u64()
}

/// One sample of the [`Catalog`]: which dataset, which index in it, and its length in tokens
/// (not the shard writer's `aerie_data::shard::SampleRef`, which holds a sample's data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogRef {
    /// Position of the dataset in `data.train` (or `data.eval`).
    pub dataset: usize,
    /// Sample index inside that dataset.
    pub index: usize,
    /// Tokens.
    pub len: usize,
}

/// Whether sample `index` of the dataset at position `dataset` is held out at `fraction`: a hash
/// of the two, independent of the seed, so every run on the same data holds out the same samples.
pub fn held_out(dataset: usize, index: usize, fraction: f64) -> bool {
    if fraction <= 0.0 {
        return false;
    }
    let h = SplitMix(((dataset as u64) << 40) ^ (index as u64) ^ 0x005E_ED0F_E7A1).next_u64();
    (h >> 11) as f64 / (1u64 << 53) as f64 <= fraction
}

/// One dataset as a run trained on it, recorded in every checkpoint's state: a resume over
/// shards replaced at the same path (24 samples became 8, or other captures) would otherwise
/// continue at a cursor into other data, silently. `digest` is the sha256 of the manifest's
/// shard list (each shard's file, counts and recorded sha256) and metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataIdentity {
    /// `data.train[i]` or `data.eval[i]`.
    pub key: String,
    /// The directory as configured.
    pub dir: PathBuf,
    /// Samples.
    pub samples: u64,
    /// Tokens.
    pub tokens: u64,
    /// sha256 (hex) of the manifest's shards and metadata.
    pub digest: String,
}

impl DataIdentity {
    fn of(key: String, set: &ShardDataset) -> Self {
        let m = set.manifest();
        let shards: Vec<_> = m.shards.iter().map(|s| (&s.file, s.samples, s.tokens, &s.sha256)).collect();
        let text = serde_json::to_string(&(shards, &m.metadata)).expect("plain values serialise");
        let digest = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        Self { key, dir: set.dir().to_path_buf(), samples: m.samples, tokens: m.tokens, digest }
    }
}

/// One line per dataset that is not what a run recorded (`then`): added, removed, or with other
/// counts or another digest. Empty when the data is the same.
pub fn identity_differences(then: &[DataIdentity], now: &[DataIdentity]) -> Vec<String> {
    let mut out = Vec::new();
    for t in then {
        match now.iter().find(|n| n.key == t.key) {
            None => out.push(format!("{} ({}) is no longer in the config", t.key, t.dir.display())),
            Some(n) if n.samples != t.samples || n.tokens != t.tokens => out.push(format!(
                "{} ({}): {} samples and {} tokens then, {} samples and {} tokens now",
                t.key,
                n.dir.display(),
                t.samples,
                t.tokens,
                n.samples,
                n.tokens
            )),
            Some(n) if n.digest != t.digest => out.push(format!(
                "{} ({}): the same counts but other shards (manifest digest {} then, {} now)",
                t.key,
                n.dir.display(),
                &t.digest[..12.min(t.digest.len())],
                &n.digest[..12.min(n.digest.len())]
            )),
            Some(_) => {}
        }
    }
    for n in now.iter().filter(|n| !then.iter().any(|t| t.key == n.key)) {
        out.push(format!("{} ({}) was not in the run", n.key, n.dir.display()));
    }
    out
}

/// The opened datasets and the split.
pub struct Catalog {
    /// `data.train`, opened, in order.
    pub train_sets: Vec<ShardDataset>,
    /// `data.eval`, opened, in order.
    pub eval_sets: Vec<ShardDataset>,
    /// Samples to train on.
    pub train: Vec<CatalogRef>,
    /// Samples held out of `train_sets` by `eval_fraction`.
    pub held_out: Vec<CatalogRef>,
    /// Samples skipped for being longer than `max_length` (or shorter than 2 tokens: nothing to
    /// predict).
    pub skipped: usize,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("train_sets", &self.train_sets.len())
            .field("eval_sets", &self.eval_sets.len())
            .field("train", &self.train.len())
            .field("held_out", &self.held_out.len())
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// Every dataset of a run (`data.train`, `data.eval`) was captured with the first training
/// set's tokenizer and target features: mixed ids or features train and score a drafter on
/// noise, silently (configs/README.md).
fn check_same_source(cfg: &DataConfig, train: &[ShardDataset], eval: &[ShardDataset]) -> Result<()> {
    let (Some(first), Some(first_dir)) = (train.first(), cfg.train.first()) else { return Ok(()) };
    let named = |key: &str, dirs: &[std::path::PathBuf]| {
        dirs.iter()
            .enumerate()
            .map(|(i, d)| (format!("data.{key}[{i}] ({})", d.display()), d.clone()))
            .collect::<Vec<_>>()
    };
    let others =
        named("train", &cfg.train).into_iter().zip(train).skip(1).chain(named("eval", &cfg.eval).into_iter().zip(eval));
    for ((name, dir), set) in others {
        let differences = set.metadata().mixing_differences(first.metadata());
        if !differences.is_empty() {
            return Err(Error::config(
                &dir,
                format!(
                    "{name} and data.train[0] ({}) were captured differently and cannot be used in one run:\n  - {}",
                    first_dir.display(),
                    differences.join("\n  - ")
                ),
            ));
        }
    }
    Ok(())
}

impl Catalog {
    /// What each dataset is, for the checkpoint state and a resume's check.
    pub fn identity(&self) -> Vec<DataIdentity> {
        let named = |kind: &str, sets: &[ShardDataset]| {
            sets.iter().enumerate().map(|(i, s)| DataIdentity::of(format!("data.{kind}[{i}]"), s)).collect::<Vec<_>>()
        };
        let mut all = named("train", &self.train_sets);
        all.extend(named("eval", &self.eval_sets));
        all
    }

    /// Open every dataset of `cfg` and split the training samples.
    pub fn open(cfg: &DataConfig) -> Result<Self> {
        let open = |dirs: &[std::path::PathBuf]| -> Result<Vec<ShardDataset>> {
            dirs.iter().map(|d| ShardDataset::open(d).map_err(Error::from)).collect()
        };
        let train_sets = open(&cfg.train)?;
        let eval_sets = open(&cfg.eval)?;
        check_same_source(cfg, &train_sets, &eval_sets)?;
        let (mut train, mut held, mut skipped) = (Vec::new(), Vec::new(), 0);
        for (d, set) in train_sets.iter().enumerate() {
            for (index, s) in set.iter().enumerate() {
                let len = s.len();
                if len < 2 || cfg.max_length.is_some_and(|m| len > m) {
                    skipped += 1;
                    continue;
                }
                let r = CatalogRef { dataset: d, index, len };
                if held_out(d, index, cfg.eval_fraction) { held.push(r) } else { train.push(r) }
            }
        }
        if train.is_empty() {
            let dir = cfg.train.first().map_or(Path::new(""), |p| p.as_path());
            return Err(Error::config(
                dir,
                format!("no training samples left ({skipped} skipped by length, {} held out)", held.len()),
            ));
        }
        Ok(Self { train_sets, eval_sets, train, held_out: held, skipped })
    }

    /// The view of a training-side sample.
    pub fn view(&self, r: CatalogRef) -> SampleView<'_> {
        self.train_sets[r.dataset].sample(r.index).expect("catalog indices come from the dataset")
    }

    /// `DIR#INDEX` (plus `(id N)` when the shards carry sample ids), for error messages.
    pub fn describe(&self, r: CatalogRef) -> String {
        let set = &self.train_sets[r.dataset];
        let id = set.sample(r.index).and_then(|s| s.sample_id());
        match id {
            Some(id) => format!("{}#{} (id {id})", set.dir().display(), r.index),
            None => format!("{}#{}", set.dir().display(), r.index),
        }
    }
}

/// A micro-batch: positions into [`Catalog::train`].
pub type MicroBatch = Vec<usize>;

/// The micro-batches of epoch `epoch`, in the order they are consumed.
pub fn plan_epoch(
    samples: &[CatalogRef],
    seed: u64,
    epoch: u64,
    batch_tokens: usize,
    window: usize,
) -> Vec<MicroBatch> {
    let mut rng = SplitMix(epoch_seed(seed, epoch));
    let mut order: Vec<usize> = (0..samples.len()).collect();
    rng.shuffle(&mut order);
    let mut batches = Vec::new();
    for chunk in order.chunks_mut(window.max(1)) {
        chunk.sort_by_key(|&i| (samples[i].len, i));
        let mut cur: Vec<usize> = Vec::new();
        let mut cur_max = 0;
        for &i in chunk.iter() {
            let max = cur_max.max(samples[i].len);
            if !cur.is_empty() && (cur.len() + 1) * max > batch_tokens {
                batches.push(std::mem::take(&mut cur));
                cur_max = 0;
            }
            cur_max = cur_max.max(samples[i].len);
            cur.push(i);
        }
        if !cur.is_empty() {
            batches.push(cur);
        }
    }
    rng.shuffle(&mut batches);
    batches
}

/// Padded tokens (B · Lmax) and real tokens of a micro-batch.
pub fn batch_tokens(samples: &[CatalogRef], batch: &[usize]) -> (usize, usize) {
    let max = batch.iter().map(|&i| samples[i].len).max().unwrap_or(0);
    (batch.len() * max, batch.iter().map(|&i| samples[i].len).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(lens: &[usize]) -> Vec<CatalogRef> {
        lens.iter().enumerate().map(|(index, &len)| CatalogRef { dataset: 0, index, len }).collect()
    }

    #[test]
    fn plans_are_deterministic_complete_and_within_budget() {
        let lens: Vec<usize> = (0..200).map(|i| 5 + (i * 37) % 60).collect();
        let s = refs(&lens);
        let a = plan_epoch(&s, 7, 0, 256, 32);
        assert_eq!(a, plan_epoch(&s, 7, 0, 256, 32));
        assert_ne!(a, plan_epoch(&s, 7, 1, 256, 32));
        assert_ne!(a, plan_epoch(&s, 8, 0, 256, 32));
        let mut all: Vec<usize> = a.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..200).collect::<Vec<_>>());
        for b in &a {
            let (padded, real) = batch_tokens(&s, b);
            assert!(padded <= 256 && real <= padded, "{b:?}");
        }
        // A sample over the budget gets a batch of its own.
        let s = refs(&[10, 500, 10]);
        let p = plan_epoch(&s, 1, 0, 100, 8);
        assert!(p.iter().any(|b| b == &vec![1]));
    }

    #[test]
    fn hold_out_is_stable_and_near_the_fraction() {
        let n = (0..10_000).filter(|&i| held_out(0, i, 0.1)).count();
        assert!((800..1200).contains(&n), "{n}");
        assert!(!held_out(0, 3, 0.0));
        assert_eq!(held_out(1, 42, 0.3), held_out(1, 42, 0.3));
    }
}
