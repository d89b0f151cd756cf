//! The drafter at decode time: incremental EAGLE-3 drafting with a KV cache, as SGLang's
//! `speculative/eagle_worker.py` runs it between verify passes.
//!
//! - [`Drafter::extend`] feeds accepted positions: position t pairs the target's aux features f_t
//!   (from the prefill or verify pass) with the embedding of the token the target emitted after
//!   it, x_{t+1} (the one shift of training). Their keys/values enter the [`DraftKv`] cache for
//!   good; the output at the last position gives the first draft.
//! - [`Drafter::draft_step`] runs one draft step for R branches at once (R = 1 for a chain, the
//!   top-k frontier of a tree): each branch attends to the shared cache plus its own path of
//!   earlier draft steps ([`BranchKv`]), at RoPE position t + depth. Draft-step keys never enter
//!   the shared cache, so nothing has to be rolled back after verification.
//!
//! This is the teacher-forced TTT of [`crate::ttt`] run one position at a time: step k of base
//! position t sees the step-0 keys of positions <= t and its own path, exactly the "diagonal"
//! cache of training (checked against [`super::offline::draft_chain`] in tests/draft.rs).

use burn::tensor::{Bool, Int, Tensor, TensorData, activation::softmax, backend::Backend};

use super::Drafter;
use crate::precision::upcast;
use crate::{Error, Result};

/// Keys and values of every accepted position, `[1, nKV, P, d]` each.
#[derive(Debug, Clone)]
pub struct DraftKv<B: Backend> {
    kv: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    len: usize,
}

impl<B: Backend> Default for DraftKv<B> {
    fn default() -> Self {
        Self { kv: None, len: 0 }
    }
}

impl<B: Backend> DraftKv<B> {
    /// Number of cached positions P (the next extend starts at RoPE position P).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first extend.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The draft-step keys/values along each branch's path, one `[R, nKV, 1, d]` pair per step taken.
#[derive(Debug, Clone)]
pub struct BranchKv<B: Backend> {
    levels: Vec<(Tensor<B, 4>, Tensor<B, 4>)>,
}

impl<B: Backend> Default for BranchKv<B> {
    fn default() -> Self {
        Self { levels: Vec::new() }
    }
}

impl<B: Backend> BranchKv<B> {
    /// Draft steps already on the path.
    pub fn depth(&self) -> usize {
        self.levels.len()
    }

    /// The paths of `rows` (a child inherits its parent's path): row r of the result is row
    /// `rows[r]` of `self`.
    pub fn select(&self, rows: &[usize]) -> Self {
        let Some((k0, _)) = self.levels.first() else { return self.clone() };
        let idx = row_index::<B>(rows, &k0.device());
        Self {
            levels: self
                .levels
                .iter()
                .map(|(k, v)| (k.clone().select(0, idx.clone()), v.clone().select(0, idx.clone())))
                .collect(),
        }
    }
}

/// `rows` as an index tensor.
pub fn row_index<B: Backend>(rows: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let v: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    Tensor::from_data(TensorData::new(v, [rows.len()]), device)
}

/// One drafter forward's result: f32 draft-vocabulary logits and the state the next step takes.
#[derive(Debug, Clone)]
pub struct StepOutput<B: Backend> {
    /// `[R, S, Vd]`, f32.
    pub logits: Tensor<B, 3>,
    /// `[R, S, H]`: [`Drafter::carry`] of the layer output.
    pub hidden: Tensor<B, 3>,
}

/// `[1, 1, g·s, p + s]`, true where key j lies after query i (`j > p + i`); rows in the grouped
/// query layout (group-major, as `[B, nKV, g·S, d]` views them).
fn causal_mask<B: Backend>(g: usize, s: usize, p: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let t = p + s;
    let mut mask = Vec::with_capacity(g * s * t);
    for _ in 0..g {
        for i in 0..s {
            mask.extend((0..t).map(|j| j > p + i));
        }
    }
    Tensor::from_data(TensorData::new(mask, [1, 1, g * s, t]), device)
}

impl<B: Backend> Drafter<B> {
    /// This drafter with every linear weight in the layout of speculative decoding
    /// ([`crate::layers::Linear::into_row_major`]). The drafter's steps are products of one or
    /// two rows, bound by reading the weights: in the checkpoint's `[out, in]` layout SmolLM2's
    /// drafter shapes streamed 10–16 GB/s against 16–27 GB/s stored by rows (cold weights, two
    /// threads), and `eval decode`'s extend took 2.7–3.1 ms against 2.5–2.9 ms. The drafts are
    /// the same up to the order of the sums. Training keeps the checkpoint layout (its products
    /// are many rows, through `gemm`).
    pub fn into_decoding_layout(mut self) -> Self {
        self.fc = self.fc.into_row_major();
        self.lm_head = self.lm_head.into_row_major();
        self.midlayer.self_attn = self.midlayer.self_attn.into_row_major();
        let mlp = &mut self.midlayer.mlp;
        for linear in [&mut mlp.gate_proj, &mut mlp.up_proj, &mut mlp.down_proj] {
            *linear = linear.clone().into_row_major();
        }
        self
    }

    /// Feed `next_ids.len()` accepted positions starting at RoPE position `cache.len()`:
    /// `aux [1, S, A·Ht]` are the target's features of those positions and `next_ids` the tokens
    /// the target emitted after each (x_{t+1}). Appends their keys/values to `cache`; returns the
    /// output of the LAST position (`[1, 1, ·]`), whose logits propose the first draft.
    pub fn extend(&self, next_ids: &[u32], aux: Tensor<B, 3>, cache: &mut DraftKv<B>) -> Result<StepOutput<B>> {
        let cfg = self.config();
        let s = next_ids.len();
        let want = [1, s, cfg.num_aux() * cfg.target_hidden_size];
        if s == 0 || aux.dims() != want {
            return Err(Error::Shape(format!("extend: aux features are {:?}, expected {want:?}", aux.dims())));
        }
        let device = aux.device();
        let hidden = self.fuse_aux(aux);
        let ids = ids_tensor::<B>(next_ids, [1, s], &device);
        let p = cache.len;
        let (k, v, out) = self.attend(ids, hidden, p, |k, v| {
            let (k, v) = match cache.kv.take() {
                None => (k, v),
                Some((k0, v0)) => (Tensor::cat(vec![k0, k], 2), Tensor::cat(vec![v0, v], 2)),
            };
            (k, v, None)
        });
        cache.kv = Some((k, v));
        cache.len += s;
        let last = out.narrow(1, s - 1, 1);
        Ok(StepOutput { logits: upcast(self.logits(last.clone())), hidden: self.carry(last) })
    }

    /// One draft step for R branches: `ids [R]` are each branch's newest draft token (target
    /// ids), `hidden [R, 1, H]` the state its previous step (or the extend) carried. A branch
    /// holding j drafts runs at RoPE position `cache.len() + j - 1` (its base position plus j),
    /// attending to the shared `cache` and its own `path`, which gains this step's keys/values.
    pub fn draft_step(
        &self,
        ids: &[u32],
        hidden: Tensor<B, 3>,
        cache: &DraftKv<B>,
        path: &mut BranchKv<B>,
    ) -> Result<StepOutput<B>> {
        let r = ids.len();
        let h = self.config().hidden_size;
        if r == 0 || hidden.dims() != [r, 1, h] {
            return Err(Error::Shape(format!("draft step: hidden is {:?}, expected [{r}, 1, {h}]", hidden.dims())));
        }
        let Some((k0, v0)) = cache.kv.clone() else {
            return Err(Error::Shape("draft step before any extend: the draft cache is empty".into()));
        };
        if path.levels.first().is_some_and(|(k, _)| k.dims()[0] != r) {
            return Err(Error::Shape(format!(
                "draft step: {r} branches but the path holds {}",
                path.levels[0].0.dims()[0]
            )));
        }
        let device = hidden.device();
        let ids = ids_tensor::<B>(ids, [r, 1], &device);
        let position = cache.len + path.depth();
        let (_, _, out) = self.attend(ids, hidden, position, |k, v| {
            path.levels.push((k, v));
            let [_, nkv, p, d] = k0.dims();
            let mut keys = vec![k0.clone().expand([r, nkv, p, d])];
            let mut values = vec![v0.clone().expand([r, nkv, p, d])];
            for (k, v) in &path.levels {
                keys.push(k.clone());
                values.push(v.clone());
            }
            (Tensor::cat(keys, 2), Tensor::cat(values, 2), Some(()))
        });
        Ok(StepOutput { logits: upcast(self.logits(out.clone())), hidden: self.carry(out) })
    }

    /// The decoder layer on `S` new tokens per row at RoPE positions `start..start + S`.
    /// `keys(k_new, v_new)` returns all keys/values the new queries see, in position order with
    /// the new ones last, and whether the rows are single draft steps (no mask needed); they are
    /// returned with the layer output.
    fn attend(
        &self,
        ids: Tensor<B, 2, Int>,
        hidden: Tensor<B, 3>,
        start: usize,
        keys: impl FnOnce(Tensor<B, 4>, Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>, Option<()>),
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 3>) {
        let cfg = self.config();
        let layer = &self.midlayer;
        let attn = &layer.self_attn;
        let [_, s] = ids.dims();
        let g = attn.groups();
        let device = hidden.device();
        let (cos, sin) = self.rotary().tables::<B>(start, s, &device);

        let normed = layer.hidden_norm.forward(hidden.clone());
        let residual = if cfg.norm_before_residual { normed.clone() } else { hidden };
        let x = Tensor::cat(vec![layer.input_layernorm.forward(self.embed(ids)), normed], 2);
        let [q, k, v] = attn.project(x, &cos, &sin, None);
        let (k_all, v_all, single) = keys(k, v);
        let t = k_all.dims()[2];
        let dtype = q.dtype();
        let mut scores = q.matmul(k_all.clone().swap_dims(2, 3));
        if single.is_none() && s > 1 {
            scores = scores.mask_fill(causal_mask::<B>(g, s, t - s, &device), f32::NEG_INFINITY);
        }
        let weights = softmax(upcast(scores), 3).cast(dtype);
        let out = attn.output(weights.matmul(v_all.clone()), None);
        let h = residual + out;
        let out = h.clone() + layer.mlp.forward(layer.post_attention_layernorm.forward(h));
        (k_all, v_all, out)
    }
}

fn ids_tensor<B: Backend>(ids: &[u32], shape: [usize; 2], device: &B::Device) -> Tensor<B, 2, Int> {
    let v: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}
