//! `config.json` of the multi-latent-attention drafter, `Eagle3DeepseekV2ForCausalLM`: the layout
//! of lightseek's `kimi-k2.5-eagle3-mla` and TorchSpec's `configs/draft_models/*_eagle3_mla.json`,
//! served by SGLang (`models/kimi_k25_eagle3.py`) and vLLM (`models/deepseek_eagle3.py`).
//!
//! Both engines read one flat DeepSeek-style config (the MLA keys `q_lora_rank`, `kv_lora_rank`,
//! `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`, YaRN `rope_scaling`) and the same tensor
//! names; speculators has no MLA form. What differs is how each engine numbers the aux layers
//! (eagle3.md §2): SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as outputs of
//! layers, vLLM reads the same key as inputs of layers. aerie therefore writes two files:
//! - [`Dialect::Sglang`]: ids output-of-layer in `eagle_config` only (as published);
//! - [`Dialect::Speculators`] (the vLLM layout): ids input-of-layer, in `eagle_config` for vLLM
//!   and also at the top level, the speculators place, which is how aerie tells the two apart
//!   when it reads a file back.

use serde_json::{Value, json};

use super::fields::Obj;
use super::rope::rope_scaling_json;
use super::{Dialect, Dtype, config_err};
use crate::config::{AuxConvention, DrafterConfig, MlaConfig};
use crate::{Error, Result};
use std::path::Path;

/// The architecture SGLang and vLLM dispatch MLA EAGLE-3 drafters on.
pub const MLA_ARCHITECTURE: &str = "Eagle3DeepseekV2ForCausalLM";
/// The `model_type` written: the published one (lightseek's, TorchSpec's). Both engines map it
/// to DeepSeek-V3's config class (SGLang registers it for this drafter, vLLM 0.32 in
/// `transformers_utils/config.py`). Not `deepseek_v3`: vLLM's `SpeculativeConfig.hf_config_override`
/// (`config/speculative.py`) turns every draft config of that type into a DeepSeek MTP head, and
/// then refuses the architecture `Eagle3DeepSeekMTPModel` before loading anything.
pub const MLA_MODEL_TYPE: &str = "kimi_k2";
/// vLLM's alias of [`MLA_ARCHITECTURE`] (SGLang does not register it: never written).
const MLA_ARCHITECTURE_ALIAS: &str = "Eagle3DeepseekV3ForCausalLM";

/// Whether a `config.json` object describes an MLA drafter: its architecture, or MLA keys.
pub(super) fn is_mla(value: &Value) -> bool {
    let arch = value
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| matches!(v.as_str(), Some(MLA_ARCHITECTURE | MLA_ARCHITECTURE_ALIAS))));
    arch || value.get("kv_lora_rank").is_some_and(|v| !v.is_null())
}

/// The layout an MLA config is written in: the vLLM one when the aux ids sit at the top level.
pub(super) fn mla_dialect(value: &Value) -> Dialect {
    if value.get("eagle_aux_hidden_state_layer_ids").is_some() { Dialect::Speculators } else { Dialect::Sglang }
}

/// The MLA shape keys; every one is required (a null `q_lora_rank`, DeepSeek's "no query latent",
/// is refused: SGLang's MLA drafter raises on it).
pub(super) fn parse_mla(o: &Obj<'_>) -> Result<MlaConfig> {
    if o.get("q_lora_rank").is_none() {
        return Err(config_err(
            o.path,
            "MLA drafter without `q_lora_rank`: SGLang's Eagle3DeepseekV2ForCausalLM requires the query latent \
             (q_a_proj, q_a_layernorm, q_b_proj)",
        ));
    }
    Ok(MlaConfig {
        q_lora_rank: o.req_usize("q_lora_rank")?,
        kv_lora_rank: o.req_usize("kv_lora_rank")?,
        qk_nope_head_dim: o.req_usize("qk_nope_head_dim")?,
        qk_rope_head_dim: o.req_usize("qk_rope_head_dim")?,
        v_head_dim: o.req_usize("v_head_dim")?,
    })
}

/// The `config.json` object of an MLA drafter in `dialect` (see the module doc).
pub(super) fn mla_json(
    cfg: &DrafterConfig,
    m: &MlaConfig,
    dialect: Dialect,
    dtype: Dtype,
    path: &Path,
) -> Result<Value> {
    let refuse = |message: &str| Error::Unsupported { path: path.to_path_buf(), message: message.into() };
    if cfg.norm_before_residual && dialect == Dialect::Sglang {
        return Err(refuse(
            "the drafter uses norm_before_residual=true, which SGLang's Eagle3DeepseekV2ForCausalLM cannot run; \
             export it to the vLLM layout (--to vllm) instead",
        ));
    }
    let ids = match dialect {
        Dialect::Sglang => {
            if cfg.aux_layers.convention == AuxConvention::InputOfLayer && cfg.aux_layers.ids.contains(&0) {
                return Err(refuse(
                    "aux id 0 in the input-of-layer convention (the embedding output) has no output-of-layer \
                     equivalent, so SGLang cannot capture it",
                ));
            }
            cfg.aux_layers.output_of_layer()
        }
        Dialect::Speculators => cfg.aux_layers.input_of_layer(),
    };
    let v = json!({
        "architectures": [MLA_ARCHITECTURE],
        "model_type": MLA_MODEL_TYPE,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "head_dim": m.qk_rope_head_dim,
        "q_lora_rank": m.q_lora_rank,
        "kv_lora_rank": m.kv_lora_rank,
        "qk_nope_head_dim": m.qk_nope_head_dim,
        "qk_rope_head_dim": m.qk_rope_head_dim,
        "v_head_dim": m.v_head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "rope_theta": cfg.rope.theta,
        "rope_scaling": rope_scaling_json(&cfg.rope.scaling),
        "attention_bias": false,
        "tie_word_embeddings": false,
        "torch_dtype": dtype.torch_name(),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": true},
        "norm_before_residual": cfg.norm_before_residual,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
    });
    let Value::Object(mut map) = v else { unreachable!("json! object") };
    if dialect == Dialect::Speculators {
        map.insert("eagle_aux_hidden_state_layer_ids".into(), json!(ids));
    }
    if let Some(name) = &cfg.target_name_or_path {
        map.insert("target_name_or_path".into(), json!(name));
    }
    Ok(Value::Object(map))
}

#[cfg(test)]
mod tests {
    use super::super::{parse_config, to_json};
    use super::*;
    use crate::RopeScaling;

    fn p() -> &'static Path {
        Path::new("test/config.json")
    }

    /// The keys of TorchSpec's `configs/draft_models/kimi_k3_eagle3_mla.json` (the published MLA
    /// drafter layout; K2.5's `kimi-k2.5-eagle3-mla` has the same keys with K2.5's aux ids).
    fn published() -> Value {
        json!({
            "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
            "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 1,
            "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "mla_use_nope": true, "hidden_act": "silu", "rms_norm_eps": 1e-05, "vocab_size": 163840,
            "draft_vocab_size": 163840, "torch_dtype": "bfloat16", "rope_theta": 50000.0,
            "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32768,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
            "max_position_embeddings": 1048576,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 45, 89], "use_aux_hidden_state": true,
                             "use_input_layernorm_in_first_layer": true, "use_last_layernorm": true,
                             "use_mtp_layernorm": false},
            "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 0
        })
    }

    /// `mla_use_nope: true` (NoPE attention) is not what aerie runs: the parse says so in a note
    /// that inspect, train and export show; `false`, or no key, says nothing; a non-boolean is an
    /// error naming the key.
    #[test]
    fn mla_use_nope_true_is_named_as_not_implemented() {
        let notes = parse_config(&published(), p(), None).unwrap().notes;
        assert!(notes.iter().any(|n| n.contains("mla_use_nope") && n.contains("does not implement")), "{notes:?}");
        let mut off = published();
        off["mla_use_nope"] = json!(false);
        assert!(!parse_config(&off, p(), None).unwrap().notes.iter().any(|n| n.contains("mla_use_nope")));
        off.as_object_mut().unwrap().remove("mla_use_nope");
        assert!(!parse_config(&off, p(), None).unwrap().notes.iter().any(|n| n.contains("mla_use_nope")));
        off["mla_use_nope"] = json!("yes");
        let e = parse_config(&off, p(), None).unwrap_err().to_string();
        assert!(e.contains("mla_use_nope"), "{e}");
    }

    #[test]
    fn reads_the_published_mla_layout() {
        let parsed = parse_config(&published(), p(), None).unwrap();
        assert_eq!(parsed.dialect, Dialect::Sglang);
        let c = &parsed.config;
        assert_eq!(
            c.mla,
            Some(MlaConfig {
                q_lora_rank: 1536,
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128
            })
        );
        assert_eq!((c.draft_vocab_size, c.vocab_size, c.rope_dim(), c.kv_groups()), (163840, 163840, 64, 1));
        assert_eq!(c.aux_layers.output_of_layer(), vec![1, 45, 89]);
        assert!(!c.norm_before_residual && !c.fc_norm && !c.norm_output);
        assert!(matches!(c.rope.scaling, RopeScaling::Yarn { factor: 32.0, mscale_all_dim: Some(1.0), .. }));
        // DeepSeek's softmax scale: 192^-0.5 · (0.1 ln 32 + 1)².
        let m = 0.1 * 32f64.ln() + 1.0;
        assert!((c.softmax_scale() - m * m / 192f64.sqrt()).abs() < 1e-15);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
    }

    #[test]
    fn mla_round_trips_in_both_layouts() {
        let published = parse_config(&published(), p(), None).unwrap().config;
        for d in [Dialect::Sglang, Dialect::Speculators] {
            let v = to_json(&published, d, Dtype::BF16, p()).unwrap();
            assert_eq!(v["architectures"], json!([MLA_ARCHITECTURE]));
            assert!(v.get("speculators_config").is_none() && v.get("transformer_layer_config").is_none());
            let parsed = parse_config(&v, p(), None).unwrap();
            assert_eq!(parsed.dialect, d);
            assert_eq!(parsed.config.aux_layers.output_of_layer(), published.aux_layers.output_of_layer());
            let mut got = parsed.config.clone();
            got.aux_layers = published.aux_layers.clone();
            assert_eq!(got, published);
        }
        let sglang = to_json(&published, Dialect::Sglang, Dtype::BF16, p()).unwrap();
        assert_eq!(sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json!([1, 45, 89]));
        assert!(sglang.get("eagle_aux_hidden_state_layer_ids").is_none());
        let vllm = to_json(&published, Dialect::Speculators, Dtype::BF16, p()).unwrap();
        assert_eq!(vllm["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json!([2, 46, 90]));
        assert_eq!(vllm["eagle_aux_hidden_state_layer_ids"], json!([2, 46, 90]));
        assert_eq!(vllm["rope_scaling"]["mscale_all_dim"], json!(1.0));
    }

    #[test]
    fn mla_without_query_latent_is_refused() {
        let mut v = published();
        v["q_lora_rank"] = Value::Null;
        let e = parse_config(&v, p(), None).unwrap_err().to_string();
        assert!(e.contains("test/config.json") && e.contains("q_lora_rank"), "{e}");
        let mut v = published();
        v.as_object_mut().unwrap().remove("v_head_dim");
        let e = parse_config(&v, p(), None).unwrap_err().to_string();
        assert!(e.contains("v_head_dim"), "{e}");
    }
}
