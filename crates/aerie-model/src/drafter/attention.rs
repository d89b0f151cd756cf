//! The drafter layer's two attentions, over the layer's `2H` input `cat(input_layernorm(emb),
//! hidden_norm(h))`:
//! - [`Eagle3Attention`]: Llama grouped-query attention (`LlamaForCausalLMEagle3`);
//! - [`MlaAttention`]: DeepSeek-V2 multi-latent attention (`Eagle3DeepseekV2ForCausalLM`, the
//!   layout of lightseek's `kimi-k2.5-eagle3-mla`; SGLang `models/kimi_k25_eagle3.py`, vLLM
//!   `models/deepseek_eagle3.py`).
//!
//! Both reduce to one shape that the TTT forward, offline drafting and decode-time drafting share
//! ([`Attention::project`], [`Attention::output`]): scaled queries `[B, nKV, g·L, D]` in the
//! grouped-query row layout, keys and values `[B, nKV, L, D]`, so the causal and diagonal kernels
//! of `kernels/` serve both. For MLA nKV = nH (g = 1) and D = max(qk_nope + qk_rope, v): values
//! are zero-padded to the query width (or queries and keys to the value width), which changes no
//! score and no output column that is kept, at the price of the padded columns' memory.

use burn::module::Module;
use burn::tensor::{DType, Tensor, backend::Backend};

use crate::MlaConfig;
use crate::layers::{Linear, RmsNorm};
use crate::rope;

/// Grouped-query self-attention of the drafter layer, input width 2H.
#[derive(Module, Debug)]
pub struct Eagle3Attention<B: Backend> {
    /// `[nH*d, 2H]`.
    pub q_proj: Linear<B>,
    /// `[nKV*d, 2H]`.
    pub k_proj: Linear<B>,
    /// `[nKV*d, 2H]`.
    pub v_proj: Linear<B>,
    /// `[H, nH*d]`.
    pub o_proj: Linear<B>,
    pub(super) num_heads: usize,
    pub(super) num_kv_heads: usize,
    pub(super) head_dim: usize,
}

/// Multi-latent attention of the drafter layer, input width 2H. Field names are the checkpoint's
/// (`midlayer.self_attn.q_a_proj.weight`, ...).
#[derive(Module, Debug)]
pub struct MlaAttention<B: Backend> {
    /// `[q_lora_rank, 2H]`.
    pub q_a_proj: Linear<B>,
    /// `[q_lora_rank]`.
    pub q_a_layernorm: RmsNorm<B>,
    /// `[nH*(qk_nope+qk_rope), q_lora_rank]`.
    pub q_b_proj: Linear<B>,
    /// `[kv_lora_rank+qk_rope, 2H]`: the key/value latent, then the one RoPE key all heads share.
    pub kv_a_proj_with_mqa: Linear<B>,
    /// `[kv_lora_rank]`.
    pub kv_a_layernorm: RmsNorm<B>,
    /// `[nH*(qk_nope+v), kv_lora_rank]`.
    pub kv_b_proj: Linear<B>,
    /// `[H, nH*v]`.
    pub o_proj: Linear<B>,
    pub(super) num_heads: usize,
    #[module(skip)]
    pub(super) shape: MlaConfig,
    /// `1/sqrt(qk_head_dim)` times YaRN's mscale² ([`crate::DrafterConfig::softmax_scale`]).
    pub(super) scale: f64,
}

/// The drafter layer's attention, chosen by the config (`DrafterConfig::mla`).
// One per drafter layer, built once: the size of the larger variant costs nothing, and burn's
// `Module` derive has no form for a boxed variant.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Attention<B: Backend> {
    /// Llama grouped-query attention.
    Gqa(Eagle3Attention<B>),
    /// DeepSeek-V2 multi-latent attention.
    Mla(MlaAttention<B>),
}

/// `[in, out]` weights of the grouped-query projections (q, k, v, o) in the activation dtype,
/// taken once for all TTT steps (see [`Linear::weight_t`]).
pub(super) type GqaWeightsT<B> = [Tensor<B, 2>; 4];

/// `[B, L, n·d]` → `[B, n, L, d]`.
fn heads<B: Backend>(x: Tensor<B, 3>, n: usize, d: usize) -> Tensor<B, 4> {
    let [b, l, _] = x.dims();
    x.reshape([b, l, n, d]).swap_dims(1, 2)
}

/// DeepSeek rotates interleaved pairs `(2i, 2i+1)` (vLLM/SGLang `is_neox_style=False`,
/// transformers `rope_interleave`): reorder the last dimension to `[evens, odds]`, after which the
/// `rotate_half` RoPE of [`rope::apply`] is the same rotation. Queries and keys are reordered
/// alike, so their dot products, the only use of the rotated part, are DeepSeek's.
fn deinterleave<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, n, l, d] = x.dims();
    x.reshape([b, n, l, d / 2, 2]).swap_dims(3, 4).reshape([b, n, l, d])
}

/// `x` with its last dimension zero-padded to `width`.
fn pad_last<B: Backend>(x: Tensor<B, 4>, width: usize) -> Tensor<B, 4> {
    let [b, n, l, d] = x.dims();
    if d >= width {
        return x;
    }
    let zeros = Tensor::<B, 4>::zeros([b, n, l, width - d], &x.device()).cast(x.dtype());
    Tensor::cat(vec![x, zeros], 3)
}

impl<B: Backend> MlaAttention<B> {
    /// The per-head width D of the common query/key/value layout.
    fn width(&self) -> usize {
        self.shape.qk_head_dim().max(self.shape.v_head_dim)
    }

    fn project(&self, x: Tensor<B, 3>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> [Tensor<B, 4>; 3] {
        let [b, l, _] = x.dims();
        let m = &self.shape;
        let (nh, dn, dr, dv) = (self.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        let q = self.q_b_proj.forward(self.q_a_layernorm.forward(self.q_a_proj.forward(x.clone())));
        let q = heads(q, nh, dn + dr);
        let latent = self.kv_a_proj_with_mqa.forward(x);
        let kv = self.kv_b_proj.forward(self.kv_a_layernorm.forward(latent.clone().narrow(2, 0, m.kv_lora_rank)));
        let kv = heads(kv, nh, dn + dv);
        let k_pe = latent.narrow(2, m.kv_lora_rank, dr).reshape([b, 1, l, dr]);
        let q_pe = rope::apply(deinterleave(q.clone().narrow(3, dn, dr)), cos, sin);
        let k_pe = rope::apply(deinterleave(k_pe), cos, sin).expand([b, nh, l, dr]);
        let width = self.width();
        let q = Tensor::cat(vec![q.narrow(3, 0, dn), q_pe], 3).mul_scalar(self.scale);
        let k = Tensor::cat(vec![kv.clone().narrow(3, 0, dn), k_pe], 3);
        let v = kv.narrow(3, dn, dv);
        [pad_last(q, width), pad_last(k, width), pad_last(v, width)]
    }

    fn output(&self, out: Tensor<B, 4>) -> Tensor<B, 3> {
        let [b, nh, l, _] = out.dims();
        let dv = self.shape.v_head_dim;
        let out = out.narrow(3, 0, dv).swap_dims(1, 2).reshape([b, l, nh * dv]);
        self.o_proj.forward(out)
    }
}

impl<B: Backend> Attention<B> {
    /// Query heads per key head (g); 1 for MLA.
    pub fn groups(&self) -> usize {
        match self {
            Attention::Gqa(a) => a.num_heads / a.num_kv_heads,
            Attention::Mla(_) => 1,
        }
    }

    /// The grouped-query attention, if this is one.
    pub fn gqa(&self) -> Option<&Eagle3Attention<B>> {
        match self {
            Attention::Gqa(a) => Some(a),
            Attention::Mla(_) => None,
        }
    }

    /// The multi-latent attention, if this is one.
    pub fn mla(&self) -> Option<&MlaAttention<B>> {
        match self {
            Attention::Gqa(_) => None,
            Attention::Mla(a) => Some(a),
        }
    }

    /// [`Self::gqa`], mutably (tests perturb single weights).
    pub fn gqa_mut(&mut self) -> Option<&mut Eagle3Attention<B>> {
        match self {
            Attention::Gqa(a) => Some(a),
            Attention::Mla(_) => None,
        }
    }

    /// [`Self::mla`], mutably.
    pub fn mla_mut(&mut self) -> Option<&mut MlaAttention<B>> {
        match self {
            Attention::Gqa(_) => None,
            Attention::Mla(a) => Some(a),
        }
    }

    /// The `o_proj` both attentions end in.
    pub fn o_proj(&self) -> &Linear<B> {
        match self {
            Attention::Gqa(a) => &a.o_proj,
            Attention::Mla(a) => &a.o_proj,
        }
    }

    /// The grouped-query weights as `[in, out]` in `dtype` (MLA's projections are left in the
    /// checkpoint layout).
    pub(super) fn weights_t(&self, dtype: DType) -> Option<GqaWeightsT<B>> {
        self.gqa().map(|a| {
            [a.q_proj.weight_t(dtype), a.k_proj.weight_t(dtype), a.v_proj.weight_t(dtype), a.o_proj.weight_t(dtype)]
        })
    }

    /// Queries, keys and values of `x: [B, L, 2H]` at the positions of the RoPE tables: the
    /// queries scaled and in the grouped-query layout `[B, nKV, g·L, D]` (query head j of key
    /// head j / g, as HF's `repeat_kv`), keys and values `[B, nKV, L, D]`.
    pub(super) fn project(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        w: Option<&GqaWeightsT<B>>,
    ) -> [Tensor<B, 4>; 3] {
        let a = match self {
            Attention::Gqa(a) => a,
            Attention::Mla(m) => return m.project(x, cos, sin),
        };
        let [b, l, _] = x.dims();
        let (nh, nkv, d) = (a.num_heads, a.num_kv_heads, a.head_dim);
        let (q, k, v) = match w {
            Some([wq, wk, wv, _]) => {
                (Linear::forward_t(x.clone(), wq), Linear::forward_t(x.clone(), wk), Linear::forward_t(x, wv))
            }
            None => (a.q_proj.forward(x.clone()), a.k_proj.forward(x.clone()), a.v_proj.forward(x)),
        };
        let q = rope::apply(heads(q, nh, d), cos, sin);
        let k = rope::apply(heads(k, nkv, d), cos, sin);
        let v = heads(v, nkv, d);
        let q = q.reshape([b, nkv, (nh / nkv) * l, d]).mul_scalar(1.0 / (d as f64).sqrt());
        [q, k, v]
    }

    /// The attention output `[B, nKV, g·L, D]` (the query layout) through `o_proj`: `[B, L, H]`.
    pub(super) fn output(&self, out: Tensor<B, 4>, w: Option<&GqaWeightsT<B>>) -> Tensor<B, 3> {
        let a = match self {
            Attention::Gqa(a) => a,
            Attention::Mla(m) => return m.output(out),
        };
        let [b, _, gl, d] = out.dims();
        let nh = a.num_heads;
        let l = gl / (nh / a.num_kv_heads);
        let out = out.reshape([b, nh, l, d]).swap_dims(1, 2).reshape([b, l, nh * d]);
        match w {
            Some([.., wo]) => Linear::forward_t(out, wo),
            None => a.o_proj.forward(out),
        }
    }

    /// Every linear weight in the decoding layout ([`Linear::into_row_major`]).
    pub(super) fn into_row_major(self) -> Self {
        match self {
            Attention::Gqa(a) => Attention::Gqa(Eagle3Attention {
                q_proj: a.q_proj.into_row_major(),
                k_proj: a.k_proj.into_row_major(),
                v_proj: a.v_proj.into_row_major(),
                o_proj: a.o_proj.into_row_major(),
                ..a
            }),
            Attention::Mla(m) => Attention::Mla(MlaAttention {
                q_a_proj: m.q_a_proj.into_row_major(),
                q_b_proj: m.q_b_proj.into_row_major(),
                kv_a_proj_with_mqa: m.kv_a_proj_with_mqa.into_row_major(),
                kv_b_proj: m.kv_b_proj.into_row_major(),
                o_proj: m.o_proj.into_row_major(),
                ..m
            }),
        }
    }
}
