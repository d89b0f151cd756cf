//! Batched generation: many sequences decoded at once by one target, each at its own length
//! (continuous batching, as serving engines do it), for self-distillation at a useful rate.
//!
//! A decode step feeds one token per active sequence as ONE forward: the projections, the MLPs
//! and the head run as `[1, R, H]` matmuls over the R rows instead of R matrix-vector products,
//! which is where batching pays (the weights are read once per step, not once per token).
//! Attention is the only per-row part: each row attends to its own keys.
//!
//! The cache ([`BatchCache`]) holds per layer keys and values `[R, nKV, C, d]`: row r's
//! positions sit at columns `0..len_r` (the same columns as in a batch-1 cache, so every row's
//! attention sums run over the same elements in the same places), columns beyond are masked.
//! The new token of row r is written at column `len_r` in place (`kernels::kv_write` on the CPU
//! backend), so a step costs R small writes, not a copy of the cache. C grows in chunks as the longest row grows.
//!
//! A waiting sequence enters when a row is free: its prompt is prefilled alone (an S-token
//! forward from an empty batch-1 cache, exactly as [`TargetModel::generate_with`] does), its
//! keys and values are copied into the free row, and its first token is picked from the
//! prefill's logits. A finished row (an eos id, or its token budget) is handed to the next
//! waiting sequence, or removed when none waits.
//!
//! Greedy outputs are those of batch-1 generation: every row sees exactly its own prefix, at its
//! own RoPE positions; what can differ is the last bit of float sums whose blocking depends on
//! the batch (the matmuls over R rows, attention over C columns), which can flip a near-tie of
//! the argmax. `tests/target.rs` checks token identity with [`TargetModel::generate`] on mixed
//! prompt lengths.

use std::collections::VecDeque;
use std::time::Instant;

use burn::tensor::{Bool, DType, Int, Tensor, TensorData, backend::Backend};

use super::{CaptureRequest, LogitsMode, TargetCache, TargetModel};
use crate::kernels::kv_write::write_rows;
use crate::{Error, Result};

/// Columns added to the cache at a time when the longest row outgrows it.
const GROW: usize = 64;

/// One sequence to generate.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// The caller's handle, returned with the result and given to the picker.
    pub id: u64,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// New tokens at most (at least 1).
    pub max_new_tokens: usize,
}

/// A finished sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The request's id.
    pub id: u64,
    /// The new tokens, the stopping eos included when one stopped it.
    pub tokens: Vec<u32>,
    /// Seconds of this sequence's prompt prefill (its first token included).
    pub prefill_seconds: f64,
}

/// Picks each row's next token from its logits: `pick(ids, logits)` gets the request ids of the
/// rows and their last-position logits `[R, V]` (on the device), and returns R tokens.
/// Greedy decoding is one device argmax; samplers pull the rows to the host.
pub type Picker<'a, B> = dyn FnMut(&[u64], Tensor<B, 2>) -> Result<Vec<u32>> + 'a;

/// Keys and values of R sequences of different lengths.
#[derive(Debug)]
pub struct BatchCache<B: Backend> {
    /// Per layer `(k, v)`, each `[R, nKV, C, d]`; `None` while no row is active.
    layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
    /// Positions cached per row.
    lens: Vec<usize>,
    /// C: columns allocated.
    capacity: usize,
}

impl<B: Backend> BatchCache<B> {
    fn new(num_layers: usize) -> Self {
        Self { layers: vec![None; num_layers], lens: Vec::new(), capacity: 0 }
    }

    /// Active rows.
    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    /// Positions cached per row; row r's next token gets position `lens()[r]`.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Columns allocated (≥ every row's length).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Grow every layer to at least `columns` columns (zeros beyond the old ones).
    fn reserve(&mut self, columns: usize) {
        if columns <= self.capacity {
            return;
        }
        let new_cap = columns.div_ceil(GROW) * GROW;
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = pad_columns(k.clone(), new_cap);
            *v = pad_columns(v.clone(), new_cap);
        }
        self.capacity = new_cap;
    }

    /// Put the batch-1 cache `one` (a prefilled prompt) into row `row` (in place for a free row);
    /// `row == rows()` appends a row.
    fn insert(&mut self, row: usize, one: &TargetCache<B>) -> Result<()> {
        let len = one.len();
        if row > self.rows() || one.batch_size() != 1 {
            return Err(Error::Shape(format!(
                "batch cache insert: row {row} of {}, {} source rows",
                self.rows(),
                one.batch_size()
            )));
        }
        self.reserve(len + 1);
        let cap = self.capacity;
        for (layer, slot) in self.layers.iter_mut().enumerate() {
            let (k1, v1) =
                one.layer(layer).ok_or_else(|| Error::Shape(format!("prefill cache has no layer {layer}")))?;
            *slot = Some(match slot.take() {
                None => (pad_columns(k1.clone(), cap), pad_columns(v1.clone(), cap)),
                Some((k, v)) if row == k.dims()[0] => (
                    Tensor::cat(vec![k, pad_columns(k1.clone(), cap)], 0),
                    Tensor::cat(vec![v, pad_columns(v1.clone(), cap)], 0),
                ),
                // A free row: the new prompt's columns are written in place; the old sequence's
                // columns beyond them stay, masked (`step_mask`) until overwritten.
                Some((k, v)) => (write_rows(k, k1.clone(), &[row], &[0]), write_rows(v, v1.clone(), &[row], &[0])),
            });
        }
        if row == self.lens.len() {
            self.lens.push(len);
        } else {
            self.lens[row] = len;
        }
        Ok(())
    }

    /// Drop the rows not in `keep` (ascending).
    fn retain_rows(&mut self, keep: &[usize]) {
        if keep.len() == self.rows() {
            return;
        }
        if keep.is_empty() {
            self.layers.iter_mut().for_each(|l| *l = None);
            self.lens.clear();
            self.capacity = 0;
            return;
        }
        for (k, v) in self.layers.iter_mut().flatten() {
            let device = k.device();
            let idx: Vec<i64> = keep.iter().map(|&r| r as i64).collect();
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [keep.len()]), &device);
            *k = k.clone().select(0, idx.clone());
            *v = v.clone().select(0, idx);
        }
        self.lens = keep.iter().map(|&r| self.lens[r]).collect();
    }

    /// Write the new keys/values `[R, nKV, 1, d]` of `layer` at each row's next column and return
    /// the whole layer `[R, nKV, C, d]`. [`Self::advance`] must follow once every layer wrote.
    pub(super) fn write(
        &mut self,
        layer: usize,
        k_new: Tensor<B, 4>,
        v_new: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (k, v) = self.layers[layer].take().expect("an active batch has every layer");
        let rows: Vec<usize> = (0..self.lens.len()).collect();
        let k = write_rows(k, k_new, &rows, &self.lens);
        let v = write_rows(v, v_new, &rows, &self.lens);
        self.layers[layer] = Some((k.clone(), v.clone()));
        (k, v)
    }

    /// Record that every row got one more position.
    pub(super) fn advance(&mut self) {
        self.lens.iter_mut().for_each(|l| *l += 1);
    }

    /// Make room for one more position in every row.
    pub(super) fn reserve_next(&mut self) {
        let longest = self.lens.iter().copied().max().unwrap_or(0);
        self.reserve(longest + 1);
    }

    /// `[R, 1, g, C]`: true where column j is beyond row r's next position (`j > len_r`), tiled
    /// for `g` grouped query heads.
    pub(super) fn step_mask(&self, g: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
        let c = self.capacity;
        let mut mask = Vec::with_capacity(self.rows() * g * c);
        for &len in &self.lens {
            for _ in 0..g {
                mask.extend((0..c).map(|j| j > len));
            }
        }
        Tensor::from_data(TensorData::new(mask, [self.rows(), 1, g, c]), device)
    }
}

/// `[R, h, c, d]` zero-padded along the columns to `cap`.
fn pad_columns<B: Backend>(t: Tensor<B, 4>, cap: usize) -> Tensor<B, 4> {
    let [r, h, c, d] = t.dims();
    if c >= cap {
        return t;
    }
    let zeros = Tensor::<B, 4>::zeros([r, h, cap - c, d], &t.device()).cast(t.dtype());
    Tensor::cat(vec![t, zeros], 2)
}

/// An active row.
#[derive(Debug)]
struct Row {
    id: u64,
    budget: usize,
    out: Vec<u32>,
    prefill_seconds: f64,
}

/// Continuous batching over one target: [`Self::push`] sequences, call [`Self::step`] until
/// [`Self::is_idle`]. At most `max_batch` rows decode at once.
pub struct BatchGenerator<'a, B: Backend> {
    target: &'a TargetModel<B>,
    max_batch: usize,
    eos: Vec<u32>,
    waiting: VecDeque<GenerationRequest>,
    /// One slot per cache row; `None` is a finished row waiting for the next sequence.
    slots: Vec<Option<Row>>,
    cache: BatchCache<B>,
    /// Seconds spent in prompt prefills so far.
    prefill_seconds: f64,
}

impl<'a, B: Backend> BatchGenerator<'a, B> {
    /// A generator of up to `max_batch` (≥ 1) rows stopping after any of `eos_ids`.
    pub fn new(target: &'a TargetModel<B>, max_batch: usize, eos_ids: &[u32]) -> Result<Self> {
        if max_batch == 0 {
            return Err(Error::Shape("batched generation needs a batch of at least 1".into()));
        }
        Ok(Self {
            target,
            max_batch,
            eos: eos_ids.to_vec(),
            waiting: VecDeque::new(),
            slots: Vec::new(),
            cache: BatchCache::new(target.num_layers()),
            prefill_seconds: 0.0,
        })
    }

    /// Queue a sequence; it starts when a row frees up.
    pub fn push(&mut self, request: GenerationRequest) -> Result<()> {
        if request.prompt.is_empty() {
            return Err(Error::Shape(format!("generation request {}: empty prompt", request.id)));
        }
        if request.max_new_tokens == 0 {
            return Err(Error::Shape(format!("generation request {}: max_new_tokens is 0", request.id)));
        }
        self.waiting.push_back(request);
        Ok(())
    }

    /// Nothing active and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.active() == 0 && self.waiting.is_empty()
    }

    /// Rows decoding now.
    pub fn active(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Seconds spent in prompt prefills so far (their first tokens included): a step's wall
    /// time less this one's growth is its decode time.
    pub fn prefill_seconds(&self) -> f64 {
        self.prefill_seconds
    }

    /// Sequences waiting for a row.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Fill free rows from the queue (prefilling each), then run one decode step over every
    /// active row. Returns the sequences that finished, in row order.
    pub fn step(&mut self, pick: &mut Picker<'_, B>) -> Result<Vec<Generated>> {
        let mut done = Vec::new();
        self.admit(pick, &mut done)?;
        if self.slots.is_empty() {
            return Ok(done);
        }
        let last: Vec<u32> =
            self.slots.iter().flatten().map(|r| *r.out.last().expect("an active row has a token")).collect();
        let logits = self.target.decode_rows(&last, &mut self.cache)?;
        let ids: Vec<u64> = self.slots.iter().flatten().map(|r| r.id).collect();
        let tokens = pick(&ids, logits)?;
        self.check_picks(&tokens, ids.len())?;
        for (slot, &t) in self.slots.iter_mut().zip(&tokens) {
            let row = slot.as_mut().expect("admit leaves no free row");
            row.out.push(t);
            if self.eos.contains(&t) || row.out.len() >= row.budget {
                let row = slot.take().expect("checked");
                done.push(Generated { id: row.id, tokens: row.out, prefill_seconds: row.prefill_seconds });
            }
        }
        Ok(done)
    }

    /// Run until every pushed sequence finished; results in the order they finished.
    pub fn run_to_end(&mut self, pick: &mut Picker<'_, B>) -> Result<Vec<Generated>> {
        let mut all = Vec::new();
        while !self.is_idle() {
            all.extend(self.step(pick)?);
        }
        Ok(all)
    }

    /// Prefill waiting sequences into free rows (in place), then into new rows up to the batch
    /// size; rows still free after that (nothing waits) are dropped from the cache.
    fn admit(&mut self, pick: &mut Picker<'_, B>, done: &mut Vec<Generated>) -> Result<()> {
        let mut row = 0;
        while row < self.max_batch {
            if row < self.slots.len() && self.slots[row].is_some() {
                row += 1;
                continue;
            }
            let Some(req) = self.waiting.pop_front() else { break };
            if let Some(r) = self.prefill(req, row, pick, done)? {
                if row == self.slots.len() {
                    self.slots.push(Some(r));
                } else {
                    self.slots[row] = Some(r);
                }
                row += 1;
            }
        }
        if self.slots.iter().any(Option::is_none) {
            let keep: Vec<usize> = (0..self.slots.len()).filter(|&r| self.slots[r].is_some()).collect();
            self.cache.retain_rows(&keep);
            self.slots.retain(Option::is_some);
        }
        Ok(())
    }

    /// Prefill `req` alone and put its cache into `row`; a sequence that ends at its first token
    /// goes to `done` instead (`None`).
    fn prefill(
        &mut self,
        req: GenerationRequest,
        row: usize,
        pick: &mut Picker<'_, B>,
        done: &mut Vec<Generated>,
    ) -> Result<Option<Row>> {
        let want = CaptureRequest::logits(LogitsMode::Last);
        let vocab = self.target.spec().vocab_size;
        let device = self.target.device();
        let start = Instant::now();
        let mut one = self.target.new_cache();
        let n = req.prompt.len();
        let ids: Vec<i64> = req.prompt.iter().map(|&t| t as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), &device);
        let logits = self.target.forward(ids, &mut one, &want)?.logits.expect("logits were asked for");
        let token = pick(&[req.id], logits.reshape([1, vocab]))?;
        self.check_picks(&token, 1)?;
        let t = token[0];
        let prefill_seconds = start.elapsed().as_secs_f64();
        self.prefill_seconds += prefill_seconds;
        if self.eos.contains(&t) || req.max_new_tokens == 1 {
            done.push(Generated { id: req.id, tokens: vec![t], prefill_seconds });
            return Ok(None);
        }
        self.cache.insert(row, &one)?;
        Ok(Some(Row { id: req.id, budget: req.max_new_tokens, out: vec![t], prefill_seconds }))
    }

    fn check_picks(&self, tokens: &[u32], rows: usize) -> Result<()> {
        let vocab = self.target.spec().vocab_size;
        if tokens.len() != rows {
            return Err(Error::Shape(format!("the picker returned {} tokens for {rows} rows", tokens.len())));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Shape(format!("picked token {t} outside the vocabulary 0..{vocab}")));
        }
        Ok(())
    }
}

/// The greedy picker: one device argmax over the rows.
pub fn greedy<B: Backend>(_: &[u64], logits: Tensor<B, 2>) -> Result<Vec<u32>> {
    Ok(logits.argmax(1).into_data().iter::<i64>().map(|t| t as u32).collect())
}

/// The rows of `logits` `[R, V]` as f32 on the host, for samplers.
pub fn host_rows<B: Backend>(logits: Tensor<B, 2>) -> Result<Vec<Vec<f32>>> {
    let [_, v] = logits.dims();
    let flat = logits
        .cast(DType::F32)
        .into_data()
        .into_vec::<f32>()
        .map_err(|e| Error::Shape(format!("logits read-back: {e:?}")))?;
    Ok(flat.chunks(v).map(<[f32]>::to_vec).collect())
}
