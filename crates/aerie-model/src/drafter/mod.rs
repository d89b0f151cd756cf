//! The EAGLE-3 drafter (`LlamaForCausalLMEagle3`; EAGLE-3, arXiv 2503.01840), mirroring SGLang's
//! `srt/models/llama_eagle3.py` and SpecForge's `modeling/draft/llama3_eagle.py`: one Llama
//! decoder layer whose attention input is `cat(input_layernorm(emb), hidden_norm(h))`, fed by
//! `fc` over the concatenated target aux features, with its own head over the draft vocabulary.
//!
//! Field paths reproduce the canonical checkpoint keys (`fc.weight`, `midlayer.self_attn.q_proj.weight`, ...).
//!
//! Besides the teacher-forced TTT forward of training ([`crate::ttt`]), the drafter drafts in two
//! modes, which share the draft tree ([`tree`]):
//! - [`decode`]: at decode time, one position at a time over its own KV cache, as a serving
//!   engine runs it between verify passes;
//! - [`offline`]: over every position of a captured sequence at once, for offline acceptance
//!   measurement.

pub mod attention;
pub mod decode;
pub mod offline;
pub mod shape;
pub mod tree;

use burn::module::Module;
use burn::tensor::{DType, Int, Tensor, TensorData, backend::Backend};

pub use self::attention::{Attention, Eagle3Attention, MlaAttention};

use self::attention::GqaWeightsT;
use crate::checkpoint::validate::{self, ElemKind};
use crate::checkpoint::{Dtype, HostTensor, TensorMap, keys};
use crate::kernels;
use crate::layers::{Linear, Mlp, RmsNorm};
use crate::rope::Rotary;
use crate::{DrafterConfig, Error, Result};
use aerie_data::vocab::DraftVocab;

/// Keys and values the unrolled draft steps attend to: the step-0 pass (causal over positions)
/// and, per later step, one "diagonal" key/value at each position (eagle3.md §3).
#[derive(Debug, Clone)]
pub struct TttCache<B: Backend> {
    /// Step-0 keys/values `[B, nKV, L, d]`.
    prefix: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    /// Keys/values of steps 1..k, each `[B, nKV, L, d]`.
    diagonal: Vec<(Tensor<B, 4>, Tensor<B, 4>)>,
    /// The layer's weights transposed once for all steps (see [`Linear::weight_t`]).
    weights: Option<LayerWeightsT<B>>,
}

/// `[in, out]` weights of the decoder layer in the activation dtype.
#[derive(Debug, Clone)]
struct LayerWeightsT<B: Backend> {
    /// Grouped-query projections (none for MLA).
    attn: Option<GqaWeightsT<B>>,
    mlp: [Tensor<B, 2>; 3],
}

impl<B: Backend> Default for TttCache<B> {
    fn default() -> Self {
        Self { prefix: None, diagonal: Vec::new(), weights: None }
    }
}

impl<B: Backend> TttCache<B> {
    /// Number of steps cached.
    pub fn steps(&self) -> usize {
        self.prefix.iter().count() + self.diagonal.len()
    }
}

/// The single decoder layer (`midlayer`).
#[derive(Module, Debug)]
pub struct Eagle3Layer<B: Backend> {
    /// RMSNorm on the token embedding.
    pub input_layernorm: RmsNorm<B>,
    /// RMSNorm on the incoming hidden stream.
    pub hidden_norm: RmsNorm<B>,
    /// Attention over `cat(emb, h)`: grouped-query or multi-latent.
    pub self_attn: Attention<B>,
    /// RMSNorm before the MLP.
    pub post_attention_layernorm: RmsNorm<B>,
    /// SwiGLU.
    pub mlp: Mlp<B>,
    norm_before_residual: bool,
}

impl<B: Backend> Eagle3Layer<B> {
    /// `h' = r + o(attn(cat(ln(emb), hn(h))))`, then the MLP block; returns the pre-norm state.
    pub fn forward_ttt(
        &self,
        emb: Tensor<B, 3>,
        hidden: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        cache: &mut TttCache<B>,
    ) -> Tensor<B, 3> {
        if cache.weights.is_none() {
            let dtype = hidden.dtype();
            let m = &self.mlp;
            cache.weights = Some(LayerWeightsT {
                attn: self.self_attn.weights_t(dtype),
                mlp: [m.gate_proj.weight_t(dtype), m.up_proj.weight_t(dtype), m.down_proj.weight_t(dtype)],
            });
        }
        let normed = self.hidden_norm.forward(hidden.clone());
        let residual = if self.norm_before_residual { normed.clone() } else { hidden };
        let x = Tensor::cat(vec![self.input_layernorm.forward(emb), normed], 2);
        let h = residual + self.attend_ttt(x, cos, sin, cache);
        let mlp_w = &cache.weights.as_ref().expect("set above").mlp;
        h.clone() + Mlp::forward_t(self.post_attention_layernorm.forward(h), mlp_w)
    }

    /// One TTT step of the attention over all positions: new queries at RoPE positions `t + k`
    /// (tables given), attending causally to the step-0 keys and to the diagonal keys of steps
    /// 1..k. Grouped-query heads are never repeated: queries `[B, nH, L, d]` are viewed as
    /// `[B, nKV, g·L, d]` ([`Attention::project`]).
    fn attend_ttt(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        cache: &mut TttCache<B>,
    ) -> Tensor<B, 3> {
        let w = cache.weights.as_ref().and_then(|w| w.attn.clone());
        let [q, k, v] = self.self_attn.project(x, cos, sin, w.as_ref());
        match cache.prefix {
            None => cache.prefix = Some((k, v)),
            Some(_) => cache.diagonal.push((k, v)),
        }
        let (k0, v0) = cache.prefix.clone().expect("prefix set above");
        // Softmax over [causal step-0 scores | one diagonal score per later step]. The causal block
        // comes back as its own softmax output o0 and log-sum-exp (`kernels::attention`, which on
        // the CPU never keeps the `[.., g·L, L]` scores); `kernels::diagonal` merges it with the
        // diagonal keys.
        let (o0, lse0) = kernels::attention::causal(q.clone(), k0, v0);
        let out = if cache.diagonal.is_empty() { o0 } else { kernels::diagonal::merge(q, o0, lse0, &cache.diagonal) };
        self.self_attn.output(out, w.as_ref())
    }
}

/// An EAGLE-3 drafter with its frozen target embedding and vocabulary map.
#[derive(Module, Debug)]
pub struct Drafter<B: Backend> {
    /// The target's input embedding `[V, H]`; a constant (frozen, not saved with the drafter).
    pub embed_tokens: Tensor<B, 2>,
    /// `[H, A·Ht]`.
    pub fc: Linear<B>,
    /// EAGLE-3.1 per-feature norms (empty unless `fc_norm`).
    pub fc_norm: Vec<RmsNorm<B>>,
    /// The decoder layer.
    pub midlayer: Eagle3Layer<B>,
    /// Final norm before the head.
    pub norm: RmsNorm<B>,
    /// `[Vd, H]`.
    pub lm_head: Linear<B>,
    #[module(skip)]
    config: DrafterConfig,
    #[module(skip)]
    vocab: DraftVocab,
    #[module(skip)]
    rotary: Rotary,
}

/// Canonical names of the trainable tensors for `config` (every float tensor of the layout but
/// the embedding; not the vocab map), in forward order.
pub fn trainable_keys(config: &DrafterConfig) -> Vec<String> {
    validate::expected_tensors(config)
        .into_iter()
        .filter(|e| e.kind == ElemKind::Float && e.name != keys::EMBED)
        .map(|e| e.name)
        .collect()
}

/// A host tensor of exactly `shape` as a device tensor of `dtype` (shared with the target loader).
pub(crate) fn host_to_tensor<B: Backend, const D: usize>(
    name: &str,
    t: &HostTensor,
    shape: [usize; D],
    device: &B::Device,
    dtype: DType,
) -> Result<Tensor<B, D>> {
    if t.shape != shape {
        return Err(Error::Shape(format!("`{name}` has shape {:?}, expected {:?}", t.shape, shape)));
    }
    Ok(Tensor::<B, D>::from_data(TensorData::new(t.to_f32(name)?, shape), device).cast(dtype))
}

/// Int tensor values on the host, as the u32 token ids the drafting modes work with.
fn host_ids<B: Backend, const D: usize>(t: Tensor<B, D, Int>) -> Vec<u32> {
    t.into_data().iter::<i64>().map(|i| i as u32).collect()
}

fn tensor_to_host<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: Dtype) -> HostTensor {
    let shape = t.dims().to_vec();
    let values: Vec<f32> = t.cast(DType::F32).into_data().into_vec().expect("f32 tensor data");
    HostTensor::from_f32(shape, &values, dtype)
}

impl<B: Backend> Drafter<B> {
    /// Build from canonical tensors (see [`crate::checkpoint`]); `embed_tokens.weight` must be
    /// present (from the checkpoint or the target). Weights are held as f32 (the master copy;
    /// half-precision compute casts inside the forward).
    pub fn from_tensors(config: &DrafterConfig, tensors: &TensorMap, device: &B::Device) -> Result<Self> {
        Self::from_tensors_as(config, tensors, device, DType::F32)
    }

    /// [`Self::from_tensors`] holding the weights as `dtype` (f64 for finite-difference checks).
    pub fn from_tensors_as(
        config: &DrafterConfig,
        tensors: &TensorMap,
        device: &B::Device,
        dtype: DType,
    ) -> Result<Self> {
        let c = config;
        let problems = c.problems();
        if !problems.is_empty() {
            return Err(Error::Shape(problems.join("; ")));
        }
        let get = |name: &str| tensors.get(name).ok_or_else(|| Error::Shape(format!("missing tensor `{name}`")));
        let (h, ht, i, d) = (c.hidden_size, c.target_hidden_size, c.intermediate_size, c.head_dim);
        let (nh, nkv, a) = (c.num_attention_heads, c.num_key_value_heads, c.num_aux());
        let lin = |name: &str, out: usize, inp: usize| -> Result<Linear<B>> {
            Ok(Linear::new(host_to_tensor(name, get(name)?, [out, inp], device, dtype)?))
        };
        let norm = |name: &str, n: usize| -> Result<RmsNorm<B>> {
            Ok(RmsNorm::new(host_to_tensor(name, get(name)?, [n], device, dtype)?, c.rms_norm_eps))
        };
        let vocab = match tensors.get("d2t") {
            Some(t) => DraftVocab::from_d2t(&t.to_i64("d2t")?, c.vocab_size),
            None if c.draft_vocab_size == c.vocab_size => Ok(DraftVocab::identity(c.vocab_size)),
            None => Err("reduced draft vocab without d2t".to_string()),
        }
        .map_err(|m| Error::Shape(format!("d2t: {m}")))?;
        if vocab.draft_vocab_size() != c.draft_vocab_size {
            return Err(Error::Shape(format!(
                "d2t has {} entries, draft_vocab_size is {}",
                vocab.draft_vocab_size(),
                c.draft_vocab_size
            )));
        }
        let fc_norm = if c.fc_norm {
            (0..a).map(|k| norm(&format!("fc_norm.{k}.weight"), ht)).collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let self_attn = match c.mla {
            None => Attention::Gqa(Eagle3Attention {
                q_proj: lin("midlayer.self_attn.q_proj.weight", nh * d, 2 * h)?,
                k_proj: lin("midlayer.self_attn.k_proj.weight", nkv * d, 2 * h)?,
                v_proj: lin("midlayer.self_attn.v_proj.weight", nkv * d, 2 * h)?,
                o_proj: lin("midlayer.self_attn.o_proj.weight", h, nh * d)?,
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: d,
            }),
            Some(m) => {
                let [qa, qa_norm, qb, kva, kva_norm, kvb, o] = keys::MLA_ATTENTION;
                Attention::Mla(MlaAttention {
                    q_a_proj: lin(qa, m.q_lora_rank, 2 * h)?,
                    q_a_layernorm: norm(qa_norm, m.q_lora_rank)?,
                    q_b_proj: lin(qb, nh * m.qk_head_dim(), m.q_lora_rank)?,
                    kv_a_proj_with_mqa: lin(kva, m.kv_lora_rank + m.qk_rope_head_dim, 2 * h)?,
                    kv_a_layernorm: norm(kva_norm, m.kv_lora_rank)?,
                    kv_b_proj: lin(kvb, nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)?,
                    o_proj: lin(o, h, nh * m.v_head_dim)?,
                    num_heads: nh,
                    shape: m,
                    scale: c.softmax_scale(),
                })
            }
        };
        Ok(Self {
            embed_tokens: host_to_tensor(
                "embed_tokens.weight",
                get("embed_tokens.weight")?,
                [c.vocab_size, h],
                device,
                dtype,
            )?,
            fc: lin("fc.weight", h, a * ht)?,
            fc_norm,
            midlayer: Eagle3Layer {
                input_layernorm: norm("midlayer.input_layernorm.weight", h)?,
                hidden_norm: norm("midlayer.hidden_norm.weight", h)?,
                self_attn,
                post_attention_layernorm: norm("midlayer.post_attention_layernorm.weight", h)?,
                mlp: Mlp {
                    gate_proj: lin("midlayer.mlp.gate_proj.weight", i, h)?,
                    up_proj: lin("midlayer.mlp.up_proj.weight", i, h)?,
                    down_proj: lin("midlayer.mlp.down_proj.weight", h, i)?,
                },
                norm_before_residual: c.norm_before_residual,
            },
            norm: norm("norm.weight", h)?,
            lm_head: lin("lm_head.weight", c.draft_vocab_size, h)?,
            config: c.clone(),
            vocab,
            rotary: Rotary::new(&c.rope, c.rope_dim()),
        })
    }

    /// The trainable tensors plus `d2t`/`t2d`, stored as `dtype` (the embedding is not included:
    /// serving engines take it from the target).
    pub fn to_tensors(&self, dtype: Dtype) -> TensorMap {
        let mut map = TensorMap::new();
        let mut put = |name: &str, t: HostTensor| {
            map.insert(name.to_string(), t);
        };
        put("fc.weight", tensor_to_host(self.fc.weight.val(), dtype));
        for (k, n) in self.fc_norm.iter().enumerate() {
            put(&format!("fc_norm.{k}.weight"), tensor_to_host(n.weight.val(), dtype));
        }
        let m = &self.midlayer;
        put("midlayer.input_layernorm.weight", tensor_to_host(m.input_layernorm.weight.val(), dtype));
        put("midlayer.hidden_norm.weight", tensor_to_host(m.hidden_norm.weight.val(), dtype));
        match &m.self_attn {
            Attention::Gqa(a) => {
                for (name, l) in
                    [("q_proj", &a.q_proj), ("k_proj", &a.k_proj), ("v_proj", &a.v_proj), ("o_proj", &a.o_proj)]
                {
                    put(&format!("midlayer.self_attn.{name}.weight"), tensor_to_host(l.weight.val(), dtype));
                }
            }
            Attention::Mla(a) => {
                let [qa, qa_norm, qb, kva, kva_norm, kvb, o] = keys::MLA_ATTENTION;
                for (name, l) in [
                    (qa, &a.q_a_proj),
                    (qb, &a.q_b_proj),
                    (kva, &a.kv_a_proj_with_mqa),
                    (kvb, &a.kv_b_proj),
                    (o, &a.o_proj),
                ] {
                    put(name, tensor_to_host(l.weight.val(), dtype));
                }
                put(qa_norm, tensor_to_host(a.q_a_layernorm.weight.val(), dtype));
                put(kva_norm, tensor_to_host(a.kv_a_layernorm.weight.val(), dtype));
            }
        }
        put("midlayer.post_attention_layernorm.weight", tensor_to_host(m.post_attention_layernorm.weight.val(), dtype));
        put("midlayer.mlp.gate_proj.weight", tensor_to_host(m.mlp.gate_proj.weight.val(), dtype));
        put("midlayer.mlp.up_proj.weight", tensor_to_host(m.mlp.up_proj.weight.val(), dtype));
        put("midlayer.mlp.down_proj.weight", tensor_to_host(m.mlp.down_proj.weight.val(), dtype));
        put("norm.weight", tensor_to_host(self.norm.weight.val(), dtype));
        put("lm_head.weight", tensor_to_host(self.lm_head.weight.val(), dtype));
        // A full-vocabulary head (Vd = V, one to one) has no map, as the published MLA drafters
        // ship it: an all-zero d2t beside it would be a reduced-vocabulary layout in name only.
        let vd = self.vocab.draft_vocab_size();
        if vd != self.vocab.vocab_size() || self.vocab.d2t().iter().any(|&o| o != 0) {
            put("d2t", HostTensor::from_i64(vec![vd], self.vocab.d2t()));
            put("t2d", HostTensor::from_bool(vec![self.vocab.vocab_size()], self.vocab.t2d()));
        }
        map
    }

    /// The configuration this drafter was built from.
    pub fn config(&self) -> &DrafterConfig {
        &self.config
    }

    /// The draft ↔ target vocabulary map.
    pub fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    /// RoPE tables of this drafter.
    pub fn rotary(&self) -> &Rotary {
        &self.rotary
    }

    /// Embed target token ids `[B, L]` with the frozen target embedding.
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, l] = ids.dims();
        let h = self.embed_tokens.dims()[1];
        self.embed_tokens.clone().select(0, ids.reshape([b * l])).reshape([b, l, h])
    }

    /// Fuse the concatenated aux features `[B, L, A·Ht]` into the initial hidden stream
    /// `[B, L, H]` (with the EAGLE-3.1 per-feature norms when configured).
    pub fn fuse_aux(&self, aux: Tensor<B, 3>) -> Tensor<B, 3> {
        if self.fc_norm.is_empty() {
            return self.fc.forward(aux);
        }
        let ht = self.config.target_hidden_size;
        let parts =
            self.fc_norm.iter().enumerate().map(|(k, n)| n.forward(aux.clone().narrow(2, k * ht, ht))).collect();
        self.fc.forward(Tensor::cat(parts, 2))
    }

    /// Draft-vocabulary logits `lm_head(norm(h))`.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.lm_head.forward(self.norm.forward(hidden))
    }

    /// The state the next draft step consumes: pre-norm `h`, or `norm(h)` with EAGLE-3.1's
    /// `norm_output`.
    pub fn carry(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        if self.config.norm_output { self.norm.forward(hidden) } else { hidden }
    }
}
