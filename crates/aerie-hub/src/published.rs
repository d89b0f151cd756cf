//! The layouts the published Kimi drafters are written in, told apart by the keys their trainers
//! write, and the keys of theirs that serving engines ignore without a word.
//!
//! - SpecForge (AQ-MedAI's Kimi-K2 EAGLE-3): `LlamaForCausalLMEagle3`, `eagle_config` holding the
//!   aux ids and `use_aux_hidden_state` only.
//! - TorchSpec (lightseek's kimi-k2.5-eagle3 and -mla): `eagle_config` adds
//!   `use_input_layernorm_in_first_layer`, `use_last_layernorm`, `use_mtp_layernorm`; the MLA one
//!   is `Eagle3DeepseekV2ForCausalLM` with `model_type: kimi_k2`.
//! - TensorRT Model Optimizer (NVIDIA's Kimi-K2.6 EAGLE-3): modelopt's export template adds
//!   `next_layer_regular`, `parallel_draft_step` and `parallel_draft_heads_num_layers` to those.
//!
//! SGLang's and vLLM's EAGLE-3 drafters (`llama_eagle3.py`, `kimi_k25_eagle3.py`,
//! `deepseek_eagle3.py`) read none of TorchSpec's or modelopt's switches: they always normalise the
//! embeddings and the last state, never add an MTP norm, run one dense MLP and no parallel draft
//! heads. A drafter trained with any of those switches the other way is served wrongly with no
//! error; the only symptom is a low accept length.

use serde_json::Value;

use crate::severity::Severity;

/// Which trainer's layout a drafter `config.json` is in, with the published drafters written in
/// it; `None` for a layout none of them uses (aerie's own speculators export, for one).
pub fn recognise(config: &Value) -> Option<&'static str> {
    let eagle = config.get("eagle_config")?.as_object()?;
    let arch = config.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
    let modelopt = ["next_layer_regular", "parallel_draft_step", "parallel_draft_heads_num_layers"]
        .iter()
        .any(|k| eagle.contains_key(*k));
    let torchspec = eagle.contains_key("use_input_layernorm_in_first_layer");
    Some(match arch? {
        "Eagle3DeepseekV2ForCausalLM" | "Eagle3DeepseekV3ForCausalLM" => {
            "TorchSpec MLA EAGLE-3 (lightseekorg/kimi-k2.5-eagle3-mla, kimi-k2.6-eagle3-mla)"
        }
        "LlamaForCausalLMEagle3" if modelopt => "TensorRT Model Optimizer EAGLE-3 (nvidia/Kimi-K2.6-Eagle3)",
        "LlamaForCausalLMEagle3" if torchspec => "TorchSpec EAGLE-3 (lightseekorg/kimi-k2.5-eagle3)",
        "LlamaForCausalLMEagle3" => "SpecForge EAGLE-3 (AQ-MedAI/Kimi-K2-Instruct-eagle3)",
        _ => return None,
    })
}

/// One finding on the published keys: severity, code, message.
pub type KeyFinding = (Severity, &'static str, String);

/// The published keys the engines do not honour, set the way they would change the drafter.
pub fn lint(config: &Value) -> Vec<KeyFinding> {
    let mut out = Vec::new();
    let eagle = config.get("eagle_config").and_then(Value::as_object);
    let flag = |k: &str| eagle.and_then(|e| e.get(k)).and_then(Value::as_bool);
    let engines = "SGLang's and vLLM's EAGLE-3 drafters ignore the key";
    if flag("use_input_layernorm_in_first_layer") == Some(false) {
        out.push((
            Severity::Error,
            "input-layernorm-off",
            format!(
                "eagle_config.use_input_layernorm_in_first_layer is false: {engines} and always normalise the \
                 embeddings, so the drafter would see other inputs than in training"
            ),
        ));
    }
    if flag("use_last_layernorm") == Some(false) {
        out.push((
            Severity::Error,
            "last-layernorm-off",
            format!(
                "eagle_config.use_last_layernorm is false: {engines} and always apply the final norm before lm_head"
            ),
        ));
    }
    if flag("use_mtp_layernorm") == Some(true) {
        out.push((
            Severity::Error,
            "mtp-layernorm-on",
            format!("eagle_config.use_mtp_layernorm is true: {engines} and have no such norm"),
        ));
    }
    let parallel = eagle.and_then(|e| e.get("parallel_draft_step")).and_then(Value::as_u64);
    if let Some(p) = parallel.filter(|&p| p > 1) {
        out.push((
            Severity::Warning,
            "parallel-draft-heads",
            format!(
                "eagle_config.parallel_draft_step is {p}: modelopt's parallel draft heads are not served by SGLang's \
                 or vLLM's EAGLE-3 (nor trained by aerie); only the EAGLE-3 layer drafts"
            ),
        ));
    }
    let mla = crate::published::recognise(config).is_some_and(|l| l.contains("MLA"))
        || config.get("kv_lora_rank").is_some_and(|v| !v.is_null());
    if mla && config.get("use_moe").and_then(Value::as_bool) == Some(true) {
        out.push((
            Severity::Error,
            "mla-moe",
            "use_moe is true: vLLM's Eagle3DeepseekV2ForCausalLM and aerie run one dense MLP (TorchSpec's MoE \
             drafter layer has no engine here)"
                .into(),
        ));
    }
    if mla && config.get("mla_use_nope").and_then(Value::as_bool) == Some(true) {
        out.push((Severity::Warning, "mla-use-nope", aerie_model::checkpoint::config::MLA_USE_NOPE_NOTE.into()));
    }
    if mla && config.get("model_type").and_then(Value::as_str) == Some("deepseek_v3") {
        out.push((
            Severity::Warning,
            "mla-model-type",
            "model_type is deepseek_v3: vLLM 0.32 turns every draft config of that type into a DeepSeek MTP head and \
             refuses to start (`Eagle3DeepSeekMTPModel` not supported); the published drafters write kimi_k2, \
             which both engines read as DeepSeek-V3"
                .into(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_trainer_is_told_apart_and_ignored_switches_are_named() {
        let llama = |eagle: Value| json!({"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": eagle});
        let ids = json!({"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": true});
        assert!(recognise(&llama(ids.clone())).unwrap().contains("AQ-MedAI"));
        let ts = json!({"eagle_aux_hidden_state_layer_ids": [1], "use_input_layernorm_in_first_layer": true});
        assert!(recognise(&llama(ts)).unwrap().contains("kimi-k2.5-eagle3)"));
        let mo = json!({"eagle_aux_hidden_state_layer_ids": [1], "parallel_draft_step": 3,
                        "use_input_layernorm_in_first_layer": false, "use_mtp_layernorm": true});
        assert!(recognise(&llama(mo.clone())).unwrap().contains("nvidia"));
        let codes: Vec<&str> = lint(&llama(mo)).iter().map(|f| f.1).collect();
        assert_eq!(codes, ["input-layernorm-off", "mtp-layernorm-on", "parallel-draft-heads"]);
        assert!(lint(&llama(ids)).is_empty());
        let mla = json!({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v3",
                         "use_moe": true, "eagle_config": {}});
        assert!(recognise(&mla).unwrap().contains("-mla"));
        let codes: Vec<&str> = lint(&mla).iter().map(|f| f.1).collect();
        assert_eq!(codes, ["mla-moe", "mla-model-type"]);
        // mla_use_nope: true selects NoPE, which neither engine nor aerie runs: a warning.
        let nope = json!({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "mla_use_nope": true, "eagle_config": {}});
        let found = lint(&nope);
        assert_eq!(found.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>(), [(Severity::Warning, "mla-use-nope")]);
        assert!(found[0].2.contains("does not implement") && found[0].2.contains("RoPE"), "{}", found[0].2);
        let off = json!({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "mla_use_nope": false, "eagle_config": {}});
        assert!(lint(&off).is_empty());
        assert_eq!(recognise(&json!({"speculators_model_type": "eagle3"})), None);
    }
}
