//! Llama hyperparameters from GGUF metadata (`llama.*` keys written by llama.cpp's
//! `convert_hf_to_gguf.py`), and the HF `config.json` / `generation_config.json` they become.

use serde::Serialize;
use serde_json::{Value as Json, json};

use super::reader::GgufFile;
use crate::error::{Error, Result};

/// The HF `LlamaForCausalLM` hyperparameters recovered from a GGUF file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaHparams {
    /// `llama.embedding_length`.
    pub hidden_size: usize,
    /// `llama.feed_forward_length`.
    pub intermediate_size: usize,
    /// `llama.block_count`.
    pub num_hidden_layers: usize,
    /// `llama.attention.head_count`.
    pub num_attention_heads: usize,
    /// `llama.attention.head_count_kv` (default: `num_attention_heads`).
    pub num_key_value_heads: usize,
    /// `llama.attention.key_length` (default: `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `llama.attention.layer_norm_rms_epsilon`.
    pub rms_norm_eps: f64,
    /// `llama.rope.freq_base` (default 10000).
    pub rope_theta: f64,
    /// `llama.context_length`.
    pub max_position_embeddings: u64,
    /// Rows of `token_embd` (checked against `llama.vocab_size` when present).
    pub vocab_size: usize,
    /// HF `rope_scaling`, from `llama.rope.scaling.*` (`null` when absent or `none`).
    pub rope_scaling: Json,
}

impl LlamaHparams {
    /// Read and validate the hyperparameters; `vocab_size` is the row count of `token_embd`.
    pub fn from_gguf(g: &GgufFile, vocab_size: usize) -> Result<Self> {
        let unsupported = |problem: String| Error::GgufUnsupported { path: g.path().to_path_buf(), problem };
        match g.get_str("general.architecture")? {
            Some("llama") => {}
            Some(other) => {
                return Err(unsupported(format!(
                    "general.architecture is `{other}`; only `llama` is converted (to LlamaForCausalLM)"
                )));
            }
            None => return Err(g.format_error("`general.architecture` is missing".into())),
        }
        let need = |key: &str| -> Result<usize> {
            let v = g.get_u64(key)?.ok_or_else(|| g.format_error(format!("`{key}` is missing")))?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| g.format_error(format!("`{key}` = {v} is not a positive size")))
        };
        let hidden_size = need("llama.embedding_length")?;
        let intermediate_size = need("llama.feed_forward_length")?;
        let num_hidden_layers = need("llama.block_count")?;
        let num_attention_heads = need("llama.attention.head_count")?;
        let num_key_value_heads = match g.get_u64("llama.attention.head_count_kv")? {
            Some(_) => need("llama.attention.head_count_kv")?,
            None => num_attention_heads,
        };
        if !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(g.format_error(format!(
                "{num_attention_heads} attention heads do not split into groups of {num_key_value_heads} KV heads"
            )));
        }
        let head_dim = match g.get_u64("llama.attention.key_length")? {
            Some(_) => need("llama.attention.key_length")?,
            None => hidden_size / num_attention_heads,
        };
        if let Some(v) = g.get_u64("llama.attention.value_length")?
            && v as usize != head_dim
        {
            return Err(unsupported(format!("value heads of {v} differ from key heads of {head_dim}")));
        }
        if let Some(rot) = g.get_u64("llama.rope.dimension_count")?
            && rot as usize != head_dim
        {
            return Err(unsupported(format!(
                "partial rotary embedding ({rot} of {head_dim} head dims) has no LlamaForCausalLM equivalent"
            )));
        }
        if g.get_u64("llama.expert_count")?.unwrap_or(0) > 0 {
            return Err(unsupported("mixture-of-experts llama files are not converted".into()));
        }
        if let Some(v) = g.get_u64("llama.vocab_size")?
            && v as usize != vocab_size
        {
            return Err(
                g.format_error(format!("llama.vocab_size {v} differs from the {vocab_size} rows of token_embd"))
            );
        }
        let rms_norm_eps = g
            .get_f64("llama.attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| g.format_error("`llama.attention.layer_norm_rms_epsilon` is missing".into()))?;
        Ok(Self {
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope_theta: g.get_f64("llama.rope.freq_base")?.unwrap_or(10000.0),
            max_position_embeddings: need("llama.context_length")? as u64,
            vocab_size,
            rope_scaling: rope_scaling(g)?,
        })
    }
}

/// HF `rope_scaling` from `llama.rope.scaling.*`. Llama 3's frequency-dependent scaling is
/// stored only as a `rope_freqs.weight` tensor, whose parameters GGUF does not keep; the tensor
/// table rejects that file.
fn rope_scaling(g: &GgufFile) -> Result<Json> {
    let ty = g.get_str("llama.rope.scaling.type")?;
    let factor = g.get_f64("llama.rope.scaling.factor")?;
    let orig = g.get_u64("llama.rope.scaling.original_context_length")?;
    let unsupported = |problem: String| Error::GgufUnsupported { path: g.path().to_path_buf(), problem };
    let factor_or_err = || factor.ok_or_else(|| g.format_error("`llama.rope.scaling.factor` is missing".into()));
    Ok(match ty {
        None | Some("none") => Json::Null,
        Some("linear") => json!({"rope_type": "linear", "factor": factor_or_err()?}),
        Some("yarn") => {
            let mut s = json!({"rope_type": "yarn", "factor": factor_or_err()?});
            if let Some(o) = orig {
                s["original_max_position_embeddings"] = o.into();
            }
            for (gguf, hf) in [
                ("yarn_ext_factor", "extrapolation_factor"),
                ("yarn_attn_factor", "attention_factor"),
                ("yarn_beta_fast", "beta_fast"),
                ("yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(v) = g.get_f64(&format!("llama.rope.scaling.{gguf}"))? {
                    s[hf] = v.into();
                }
            }
            s
        }
        Some(other) => return Err(unsupported(format!("RoPE scaling type `{other}` is not converted"))),
    })
}

/// Token ids that go into `config.json` and `generation_config.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SpecialIds {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` when it differs from EOS (generation stops on both).
    pub eot: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
}

fn id_json(id: Option<u32>) -> Json {
    id.map_or(Json::Null, Json::from)
}

/// The HF `config.json` of a `LlamaForCausalLM` holding float32 weights.
pub fn config_json(h: &LlamaHparams, ids: &SpecialIds, tied: bool, attention_bias: bool) -> Json {
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": attention_bias,
        "attention_dropout": 0.0,
        "bos_token_id": id_json(ids.bos),
        "eos_token_id": id_json(ids.eos),
        "head_dim": h.head_dim,
        "hidden_act": "silu",
        "hidden_size": h.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": h.intermediate_size,
        "max_position_embeddings": h.max_position_embeddings,
        "mlp_bias": false,
        "num_attention_heads": h.num_attention_heads,
        "num_hidden_layers": h.num_hidden_layers,
        "num_key_value_heads": h.num_key_value_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": h.rms_norm_eps,
        "rope_scaling": h.rope_scaling,
        "rope_theta": h.rope_theta,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "use_cache": true,
        "vocab_size": h.vocab_size,
    });
    if let Some(pad) = ids.pad {
        c["pad_token_id"] = pad.into();
    }
    c
}

/// The HF `generation_config.json`: the special ids only (sampling settings are not in GGUF).
pub fn generation_config_json(ids: &SpecialIds) -> Json {
    let eos = match (ids.eos, ids.eot) {
        (Some(eos), Some(eot)) if eos != eot => json!([eos, eot]),
        (eos, _) => id_json(eos.or(ids.eot)),
    };
    let mut c = json!({"_from_model_config": true, "bos_token_id": id_json(ids.bos), "eos_token_id": eos});
    if let Some(pad) = ids.pad {
        c["pad_token_id"] = pad.into();
    }
    c
}
