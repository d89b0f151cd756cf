//! The target's key/value cache (HF `DynamicCache` in `cache_utils.py`, reduced to what greedy
//! decoding and speculative verification need): per layer, keys (after RoPE) and values
//! `[B, nKV, T, d]` of every position fed so far. An owned value with `reset`, `truncate` (chain
//! rollback after rejected drafts) and `retain` (keep the accepted path of a verified tree).

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use crate::kernels::kv_write::keep_columns;
use crate::{Error, Result};

/// Keys and values of the positions a [`super::TargetModel`] has consumed.
#[derive(Debug, Clone)]
pub struct TargetCache<B: Backend> {
    /// Per layer `(k, v)`, each `[B, nKV, T, d]`; `None` while empty.
    layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
    /// T: positions cached.
    len: usize,
    /// B of the cached rows (0 while empty).
    batch: usize,
}

impl<B: Backend> TargetCache<B> {
    /// An empty cache for a model with `num_layers` decoder layers.
    pub fn new(num_layers: usize) -> Self {
        Self { layers: vec![None; num_layers], len: 0, batch: 0 }
    }

    /// Number of cached positions T; the next token fed gets position T.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Batch size of the cached rows (0 while empty).
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Number of layers this cache was made for.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Drop everything (a new prompt).
    pub fn reset(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
        self.len = 0;
        self.batch = 0;
    }

    /// Keep the first `n` positions (speculative rollback: drop the rejected drafts). A no-op
    /// when `n >= len()`, like `Vec::truncate`.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        if n == 0 {
            self.reset();
            return;
        }
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = keep_columns(k.clone(), n);
            *v = keep_columns(v.clone(), n);
        }
        self.len = n;
    }

    /// Keep the cached positions `keep` (ascending indices below `len()`), in that order: after
    /// verifying a draft tree, keep the prefix plus the accepted path. The kept entries keep the
    /// RoPE positions they were computed at, so the caller must keep a path whose positions are
    /// consecutive (which the accepted path of a tree is).
    pub fn retain(&mut self, keep: &[usize]) -> Result<()> {
        if let Some(bad) = keep.iter().find(|&&i| i >= self.len) {
            return Err(Error::Shape(format!("cache retain: index {bad} is beyond the {} cached positions", self.len)));
        }
        if keep.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::Shape("cache retain: indices must be strictly ascending".into()));
        }
        if keep.is_empty() {
            self.reset();
            return Ok(());
        }
        if keep.len() == self.len {
            return Ok(()); // strictly ascending and all below len: the identity
        }
        let idx: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
        for (k, v) in self.layers.iter_mut().flatten() {
            let device = k.device();
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx.clone(), [keep.len()]), &device);
            *k = k.clone().select(2, idx.clone());
            *v = v.clone().select(2, idx);
        }
        self.len = keep.len();
        Ok(())
    }

    /// Layer `layer`'s keys and values `[B, nKV, T, d]` (`None` while empty).
    pub(crate) fn layer(&self, layer: usize) -> Option<&(Tensor<B, 4>, Tensor<B, 4>)> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// Check that a forward of `batch` rows may extend this cache.
    pub(crate) fn check_batch(&self, batch: usize) -> Result<()> {
        if self.len > 0 && self.batch != batch {
            return Err(Error::Shape(format!(
                "the cache holds {} row(s) but the input has {batch}; reset() it first",
                self.batch
            )));
        }
        Ok(())
    }

    /// Append the new keys/values `[B, nKV, S, d]` of `layer`; returns everything cached for it
    /// including them. [`Self::advance`] must follow once every layer has appended.
    pub(crate) fn append(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let slot = &mut self.layers[layer];
        let (k, v) = match slot.take() {
            Some((k0, v0)) if self.len > 0 => (Tensor::cat(vec![k0, k], 2), Tensor::cat(vec![v0, v], 2)),
            _ => (k, v),
        };
        *slot = Some((k.clone(), v.clone()));
        (k, v)
    }

    /// Record that `s` positions of `batch` rows were appended to every layer.
    pub(crate) fn advance(&mut self, s: usize, batch: usize) {
        self.len += s;
        self.batch = batch;
    }
}
