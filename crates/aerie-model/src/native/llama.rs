//! The target decoder, mirroring transformers' `models/llama/modeling_llama.py`
//! (`LlamaForCausalLM`: `LlamaModel` of `LlamaDecoderLayer`s, then `norm` and `lm_head`), with the
//! two deltas of `modeling_qwen2.py` (q/k/v biases) and `modeling_qwen3.py` (per-head RMSNorm on q
//! and k before RoPE). Module field paths reproduce the HF checkpoint keys (`model.layers.N.*`,
//! `model.embed_tokens.weight`, `model.norm.weight`, `lm_head.weight`).
//!
//! Attention is batched over all new positions: queries `[B, nH, S, d]` are viewed as
//! `[B, nKV, g·S, d]` (HF's `repeat_kv` maps query head j to KV head j / g), so grouped-query
//! attention runs as one call of burn's fused `attention` over the cached keys without
//! materialising repeated keys or values.

use burn::module::{Module, Param};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, ElementConversion, Int, Tensor, TensorData, backend::Backend};

use super::batch::BatchCache;
use super::cache::TargetCache;
use super::config::TargetSpec;
use super::{CaptureRequest, LogitsMode, TargetOutput};
use crate::layers::{Linear, Mlp, RmsNorm};
use crate::rope::{self, Rotary};
use crate::{Error, Result};

/// `y = x Wᵀ + b`: an HF `nn.Linear` whose bias is optional (Qwen2 q/k/v, Llama `attention_bias`).
#[derive(Module, Debug)]
pub struct Projection<B: Backend> {
    /// `[out, in]`, as HF stores it.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Projection<B> {
    /// Apply to `[B, S, in]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let y = Linear { weight: self.weight.clone() }.forward(x);
        match &self.bias {
            Some(b) => y.clone() + b.val().cast(y.dtype()).unsqueeze::<3>(),
            None => y,
        }
    }
}

/// The token embedding `model.embed_tokens` (`[V, H]`).
#[derive(Module, Debug)]
pub struct Embedding<B: Backend> {
    /// `[V, H]`.
    pub weight: Param<Tensor<B, 2>>,
}

/// `LlamaAttention` (with the Qwen deltas).
#[derive(Module, Debug)]
pub struct TargetAttention<B: Backend> {
    /// `[nH·d, H]`.
    pub q_proj: Projection<B>,
    /// `[nKV·d, H]`.
    pub k_proj: Projection<B>,
    /// `[nKV·d, H]`.
    pub v_proj: Projection<B>,
    /// `[H, nH·d]`.
    pub o_proj: Projection<B>,
    /// Qwen3: RMSNorm over each query head (`[d]`).
    pub q_norm: Option<RmsNorm<B>>,
    /// Qwen3: RMSNorm over each key head (`[d]`).
    pub k_norm: Option<RmsNorm<B>>,
    /// nH.
    pub num_heads: usize,
    /// nKV.
    pub num_kv_heads: usize,
    /// d.
    pub head_dim: usize,
}

impl<B: Backend> TargetAttention<B> {
    /// `[B, S, n·d]` → `[B, n, S, d]`, with the optional per-head norm.
    fn heads(&self, x: Tensor<B, 3>, n: usize, norm: Option<&RmsNorm<B>>) -> Tensor<B, 4> {
        let [b, s, _] = x.dims();
        let x = x.reshape([b, s, n, self.head_dim]);
        let x = match norm {
            Some(norm) => norm.forward(x),
            None => x,
        };
        x.swap_dims(1, 2)
    }

    /// Queries and keys (per-head norm, then RoPE at `rope_tables`' positions) and values of
    /// `x: [B, S, H]`, as `[B, n, S, d]`.
    fn qkv(&self, x: Tensor<B, 3>, rope_tables: &RopeTables<B>) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let (nh, nkv) = (self.num_heads, self.num_kv_heads);
        let (cos, sin) = (&rope_tables.cos, &rope_tables.sin);
        let q = rope::apply(self.heads(self.q_proj.forward(x.clone()), nh, self.q_norm.as_ref()), cos, sin);
        let k = rope::apply(self.heads(self.k_proj.forward(x.clone()), nkv, self.k_norm.as_ref()), cos, sin);
        let v = self.heads(self.v_proj.forward(x), nkv, None);
        (q, k, v)
    }

    /// Attend from the new positions to everything cached for `layer` plus themselves.
    /// `mask` is `[1 or B, 1, g·S, T]` (true = masked) or `None` when all keys are visible.
    fn forward(
        &self,
        x: Tensor<B, 3>,
        rope_tables: &RopeTables<B>,
        mask: Option<Tensor<B, 4, Bool>>,
        layer: usize,
        cache: &mut TargetCache<B>,
    ) -> Tensor<B, 3> {
        let [b, s, _] = x.dims();
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let (q, k, v) = self.qkv(x, rope_tables);
        let (k, v) = cache.append(layer, k, v);
        let q = q.reshape([b, nkv, (nh / nkv) * s, d]);
        let out = Self::attend(q, k, v, mask);
        let out = out.reshape([b, nh, s, d]).swap_dims(1, 2).reshape([b, s, nh * d]);
        self.o_proj.forward(out)
    }

    /// Grouped queries `[B, nKV, g·S, d]` over keys and values `[B, nKV, T, d]` (cast to the
    /// queries' dtype), `mask` true = masked.
    fn attend(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: Option<Tensor<B, 4, Bool>>) -> Tensor<B, 4> {
        let (k, v) = (k.cast(q.dtype()), v.cast(q.dtype()));
        let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: false };
        attention(q, k, v, mask, None, options)
    }
}

impl<B: Backend> TargetAttention<B> {
    /// One decode step of R independent rows: `x` is `[1, R, H]` (row r's new token at position
    /// `rope_tables` row r), each row attends to its own cached keys in `cache` plus itself.
    /// Rows ride the sequence axis through the projections and RoPE (one matmul for all rows),
    /// then become the batch axis for attention.
    fn forward_rows(
        &self,
        x: Tensor<B, 3>,
        rope_tables: &RopeTables<B>,
        mask: Tensor<B, 4, Bool>,
        layer: usize,
        cache: &mut BatchCache<B>,
    ) -> Tensor<B, 3> {
        let [_, r, _] = x.dims();
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let (q, k, v) = self.qkv(x, rope_tables);
        // [1, n, R, d] → [R, n, 1, d]
        let (q, k, v) = (q.swap_dims(0, 2), k.swap_dims(0, 2), v.swap_dims(0, 2));
        let (k, v) = cache.write(layer, k, v);
        let q = q.reshape([r, nkv, nh / nkv, d]);
        let out = Self::attend(q, k, v, Some(mask));
        self.o_proj.forward(out.reshape([1, r, nh * d]))
    }
}

/// `LlamaDecoderLayer`: pre-norm attention and SwiGLU MLP, each with a residual.
#[derive(Module, Debug)]
pub struct TargetLayer<B: Backend> {
    /// RMSNorm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Attention.
    pub self_attn: TargetAttention<B>,
    /// RMSNorm before the MLP.
    pub post_attention_layernorm: RmsNorm<B>,
    /// SwiGLU.
    pub mlp: Mlp<B>,
}

impl<B: Backend> TargetLayer<B> {
    /// The layer around an attention of either cache: `h + attn(norm(h))`, then the MLP's residual.
    fn block(&self, h: Tensor<B, 3>, attn: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 3>) -> Tensor<B, 3> {
        let h = h.clone() + attn(self.input_layernorm.forward(h));
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }

    fn forward(
        &self,
        h: Tensor<B, 3>,
        tables: &RopeTables<B>,
        mask: Option<Tensor<B, 4, Bool>>,
        layer: usize,
        cache: &mut TargetCache<B>,
    ) -> Tensor<B, 3> {
        self.block(h, |x| self.self_attn.forward(x, tables, mask, layer, cache))
    }

    fn forward_rows(
        &self,
        h: Tensor<B, 3>,
        tables: &RopeTables<B>,
        mask: Tensor<B, 4, Bool>,
        layer: usize,
        cache: &mut BatchCache<B>,
    ) -> Tensor<B, 3> {
        self.block(h, |x| self.self_attn.forward_rows(x, tables, mask, layer, cache))
    }
}

/// `LlamaModel`: embedding, decoder layers, final norm.
#[derive(Module, Debug)]
pub struct TargetBody<B: Backend> {
    /// `model.embed_tokens`.
    pub embed_tokens: Embedding<B>,
    /// `model.layers.N`.
    pub layers: Vec<TargetLayer<B>>,
    /// `model.norm`.
    pub norm: RmsNorm<B>,
}

/// A causal-LM target (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`): the teacher
/// and feature source of EAGLE-3 training, and the verifier of speculative decoding.
///
/// Load with [`TargetModel::load`]; run with [`TargetModel::forward`] and a [`TargetCache`].
#[derive(Module, Debug)]
pub struct TargetModel<B: Backend> {
    /// `model.*`.
    pub model: TargetBody<B>,
    /// `lm_head` (`[V, H]`); with tied embeddings the loader fills it with a copy of the
    /// embedding laid out for the matmul. `None` (the embedding is used) only when built by hand.
    pub lm_head: Option<Linear<B>>,
    #[module(skip)]
    pub(super) spec: TargetSpec,
}

/// cos/sin tables `[S, d]` for the positions of one forward.
pub(super) struct RopeTables<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
}

impl<B: Backend> RopeTables<B> {
    /// Tables at arbitrary `positions` (tree verification puts siblings at one position).
    fn at(spec: &TargetSpec, positions: &[usize], device: &B::Device) -> Self {
        let (cos, sin) = Rotary::new(&spec.rope, spec.head_dim).tables_at(positions, device);
        Self { cos, sin }
    }
}

/// The causal mask of `s` new tokens after `cached` ones, tiled for `g` grouped query heads:
/// `[1, 1, g·s, cached + s]`, true where key j lies after query i (`j > cached + i`). `None` for
/// a single new token, which sees everything.
fn causal_mask<B: Backend>(g: usize, s: usize, cached: usize, device: &B::Device) -> Option<Tensor<B, 4, Bool>> {
    if s == 1 {
        return None;
    }
    let t = cached + s;
    let mut mask = Vec::with_capacity(g * s * t);
    for _ in 0..g {
        for i in 0..s {
            mask.extend((0..t).map(|j| j > cached + i));
        }
    }
    Some(Tensor::from_data(TensorData::new(mask, [1, 1, g * s, t]), device))
}

impl<B: Backend> TargetModel<B> {
    /// The resolved configuration.
    pub fn spec(&self) -> &TargetSpec {
        &self.spec
    }

    /// N decoder layers.
    pub fn num_layers(&self) -> usize {
        self.model.layers.len()
    }

    /// The device the weights live on.
    pub fn device(&self) -> B::Device {
        self.model.embed_tokens.weight.val().device()
    }

    /// An empty cache sized for this model.
    pub fn new_cache(&self) -> TargetCache<B> {
        TargetCache::new(self.num_layers())
    }

    /// Run `ids: [B, S]` after whatever `cache` holds: positions continue from `cache.len()`,
    /// attention is causal among the new tokens and sees the whole cached prefix. The new keys
    /// and values are appended to `cache`.
    ///
    /// Padding: a right-padded batch run from an EMPTY cache is exact at every real position
    /// (causality keeps a real token from seeing the padding after it), so capture may batch
    /// right-padded sequences in one call. Continuing such a batch token by token is not
    /// supported (all rows share one position list): decode with batch 1 or equal lengths.
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        cache: &mut TargetCache<B>,
        want: &CaptureRequest,
    ) -> Result<TargetOutput<B>> {
        let [_, s] = ids.dims();
        let start = cache.len();
        self.run(ids, (start..start + s).collect(), cache, None, want)
    }

    /// The verify-friendly forward: the new tokens sit at explicit RoPE `positions` (one per
    /// token; siblings of a draft tree share one) and attend as `mask` says:
    /// `[1 or B, 1, S, cache.len() + S]`, true = masked. `None` means causal among the new tokens
    /// and the whole prefix visible, as in [`Self::forward`]. The new tokens' keys/values are
    /// appended to `cache` in input order; keep the accepted ones with
    /// [`TargetCache::truncate`] or [`TargetCache::retain`]. Every query row of `mask` must
    /// leave at least one key visible (its own position, normally): a fully masked row has no
    /// defined softmax.
    pub fn forward_with_mask(
        &self,
        ids: Tensor<B, 2, Int>,
        positions: Vec<usize>,
        cache: &mut TargetCache<B>,
        mask: Option<Tensor<B, 4, Bool>>,
        want: &CaptureRequest,
    ) -> Result<TargetOutput<B>> {
        self.run(ids, positions, cache, mask, want)
    }

    fn run(
        &self,
        ids: Tensor<B, 2, Int>,
        positions: Vec<usize>,
        cache: &mut TargetCache<B>,
        mask: Option<Tensor<B, 4, Bool>>,
        want: &CaptureRequest,
    ) -> Result<TargetOutput<B>> {
        let spec = &self.spec;
        let [b, s] = ids.dims();
        let device = self.device();
        if b == 0 || s == 0 {
            return Err(Error::Shape(format!("target forward on an empty input [{b}, {s}]")));
        }
        if positions.len() != s {
            return Err(Error::Shape(format!("{} positions for {s} new tokens", positions.len())));
        }
        cache.check_batch(b)?;
        if cache.num_layers() != self.num_layers() {
            return Err(Error::Shape(format!(
                "the cache was made for {} layers, the target has {}",
                cache.num_layers(),
                self.num_layers()
            )));
        }
        let max_id: i64 = ids.clone().max().into_scalar().elem();
        let min_id: i64 = ids.clone().min().into_scalar().elem();
        if min_id < 0 || max_id >= spec.vocab_size as i64 {
            return Err(Error::Shape(format!(
                "token id {} is outside the vocabulary 0..{}",
                if min_id < 0 { min_id } else { max_id },
                spec.vocab_size
            )));
        }
        // Captured hidden states, by HF `output_hidden_states` index k (0 = embeddings, k = after
        // layer k-1): the input-of-layer id, which is exact in both conventions.
        let hs_ids: Vec<usize> = want.aux.as_ref().map(|a| a.input_of_layer()).unwrap_or_default();
        if let Some(&k) = hs_ids.iter().find(|&&k| k > self.num_layers()) {
            return Err(Error::Shape(format!(
                "aux layer (hidden state {k}) is beyond the target's {} layers",
                self.num_layers()
            )));
        }
        let g = spec.kv_groups();
        let t = cache.len() + s;
        let mask = match mask {
            None => causal_mask::<B>(g, s, cache.len(), &device),
            Some(m) => {
                let dims = m.dims();
                if dims[1] != 1 || dims[2] != s || dims[3] != t || (dims[0] != 1 && dims[0] != b) {
                    return Err(Error::Shape(format!("attention mask is {dims:?}, expected [1 or {b}, 1, {s}, {t}]")));
                }
                Some(if g == 1 { m } else { Tensor::cat(vec![m; g], 2) })
            }
        };
        let tables = RopeTables::at(spec, &positions, &device);

        let h_dim = spec.hidden_size;
        let mut h = self.model.embed_tokens.weight.val().select(0, ids.reshape([b * s])).reshape([b, s, h_dim]);
        let mut captured: Vec<Option<Tensor<B, 3>>> = vec![None; hs_ids.len()];
        let mut capture = |k: usize, h: &Tensor<B, 3>| {
            for (slot, &id) in captured.iter_mut().zip(&hs_ids) {
                if id == k {
                    *slot = Some(h.clone());
                }
            }
        };
        capture(0, &h);
        for (i, layer) in self.model.layers.iter().enumerate() {
            h = layer.forward(h, &tables, mask.clone(), i, cache);
            capture(i + 1, &h);
        }
        cache.advance(s, b);
        let final_hidden = self.model.norm.forward(h);
        let logits = match want.logits {
            LogitsMode::None => None,
            LogitsMode::All => Some(self.head(final_hidden.clone())),
            LogitsMode::Last => Some(self.head(final_hidden.clone().narrow(1, s - 1, 1))),
        };
        Ok(TargetOutput {
            logits,
            aux: captured.into_iter().map(|c| c.expect("every requested id is <= N and captured")).collect(),
            final_hidden,
        })
    }

    /// One decode step of a batch of sequences of different lengths: row r of `cache` gets
    /// `tokens[r]` at position `cache.lens()[r]`. Returns the logits `[R, V]` of the new tokens.
    /// The rows are independent: each sees exactly its own cached prefix.
    pub(super) fn decode_rows(&self, tokens: &[u32], cache: &mut BatchCache<B>) -> Result<Tensor<B, 2>> {
        let r = tokens.len();
        if r == 0 || r != cache.rows() {
            return Err(Error::Shape(format!("decode step of {r} tokens over {} cached rows", cache.rows())));
        }
        let vocab = self.spec.vocab_size;
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Shape(format!("token id {t} is outside the vocabulary 0..{vocab}")));
        }
        let device = self.device();
        cache.reserve_next();
        let mask = cache.step_mask(self.spec.kv_groups(), &device);
        let tables = RopeTables::at(&self.spec, cache.lens(), &device);
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [r]), &device);
        let mut h = self.model.embed_tokens.weight.val().select(0, ids).reshape([1, r, self.spec.hidden_size]);
        for (i, layer) in self.model.layers.iter().enumerate() {
            h = layer.forward_rows(h, &tables, mask.clone(), i, cache);
        }
        cache.advance();
        Ok(self.head(self.model.norm.forward(h)).reshape([r, vocab]))
    }

    /// `lm_head(x)` (or the tied embedding) on post-norm states `[B, S, H]` → `[B, S, V]`.
    pub fn head(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.lm_head {
            Some(head) => head.forward(x),
            None => Linear { weight: self.model.embed_tokens.weight.clone() }.forward(x),
        }
    }

    /// Greedy decoding with the KV cache (batch 1): feed `prompt_ids`, then append the argmax
    /// token up to `max_new_tokens` times, stopping after emitting any of `eos_ids`. Returns the
    /// new tokens only (the stopping eos included).
    pub fn generate(&self, prompt_ids: &[u32], max_new_tokens: usize, eos_ids: &[u32]) -> Result<Vec<u32>> {
        if prompt_ids.is_empty() {
            return Err(Error::Shape("generate: empty prompt".into()));
        }
        let device = self.device();
        let mut cache = self.new_cache();
        let want = CaptureRequest::logits(LogitsMode::Last);
        let mut out = Vec::new();
        let mut next: Vec<i64> = prompt_ids.iter().map(|&t| t as i64).collect();
        while out.len() < max_new_tokens {
            let n = next.len();
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(std::mem::take(&mut next), [1, n]), &device);
            let logits = self.forward(ids, &mut cache, &want)?.logits.expect("logits were asked for");
            let token = logits.argmax(2).into_data().iter::<i64>().next().expect("one position") as u32;
            out.push(token);
            if eos_ids.contains(&token) {
                break;
            }
            next.push(token as i64);
        }
        Ok(out)
    }

    /// Decoding with the KV cache (batch 1) where `pick` chooses every new token from the logits
    /// of the last position (`[V]`, still on the device): [`Self::generate`] is this with an
    /// argmax; samplers pull the row to the host. Feeds `prompt_ids`, then appends the picked
    /// token up to `max_new_tokens` times, stopping after emitting any of `eos_ids`. Returns the
    /// new tokens only (the stopping eos included).
    pub fn generate_with(
        &self,
        prompt_ids: &[u32],
        max_new_tokens: usize,
        eos_ids: &[u32],
        pick: &mut dyn FnMut(Tensor<B, 1>) -> u32,
    ) -> Result<Vec<u32>> {
        if prompt_ids.is_empty() {
            return Err(Error::Shape("generate: empty prompt".into()));
        }
        let device = self.device();
        let mut cache = self.new_cache();
        let want = CaptureRequest::logits(LogitsMode::Last);
        let vocab = self.spec.vocab_size;
        let mut out = Vec::new();
        let mut next: Vec<i64> = prompt_ids.iter().map(|&t| t as i64).collect();
        while out.len() < max_new_tokens {
            let n = next.len();
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(std::mem::take(&mut next), [1, n]), &device);
            let logits = self.forward(ids, &mut cache, &want)?.logits.expect("logits were asked for");
            let token = pick(logits.reshape([vocab]));
            if token as usize >= vocab {
                return Err(Error::Shape(format!("generate: picked token {token} outside the vocabulary 0..{vocab}")));
            }
            out.push(token);
            if eos_ids.contains(&token) {
                break;
            }
            next.push(token as i64);
        }
        Ok(out)
    }
}
