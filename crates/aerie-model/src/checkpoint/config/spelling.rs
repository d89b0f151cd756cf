//! Keep a published `config.json`'s own spelling when a drafter read from it is written back in
//! its own layout.
//!
//! aerie writes the keys it interprets, in its own spelling. A published drafter's file says
//! more: keys aerie does not read (`bos_token_id`, modelopt's `eagle_config.parallel_draft_step`,
//! TorchSpec's `mla_use_nope`), other spellings of what it does read (`model_type: kimi_k2`,
//! `rope_scaling: null`), and it leaves out keys aerie would add (`fc_norm: false`). A warm start
//! exported untrained must give back the file it came from (issue 37), so the written object
//! takes every one of the source's values whose substitution leaves the parsed drafter the same,
//! and drops every key of its own whose absence leaves it the same. Anything the parse would read
//! differently keeps aerie's value: the drafter written is always the one in memory.

use std::path::Path;

use serde_json::Value;

use super::parse_config;

type Object = serde_json::Map<String, Value>;
use crate::Result;
use crate::checkpoint::Dtype;

/// `ours` (aerie's config object for a drafter) with `source`'s spelling wherever it means the
/// same drafter: same resolved config, dialect and `torch_dtype`. `path` names the file in errors.
pub fn keep_source_spelling(ours: Value, source: &Value, path: &Path) -> Result<Value> {
    let (Value::Object(mut out), Value::Object(src)) = (ours, source) else {
        return Err(super::config_err(path, "a drafter config must be a JSON object"));
    };
    // `torch_dtype` and transformers 5's `dtype` both name the weights' dtype: every one named
    // counts, so a source's `dtype: bfloat16` never joins a `torch_dtype: float32` of aerie's.
    let meaning = |m: &serde_json::Map<String, Value>| {
        let mut dtypes: Vec<Option<Dtype>> = ["torch_dtype", "dtype"]
            .iter()
            .filter_map(|k| m.get(*k))
            .map(|v| v.as_str().and_then(Dtype::parse))
            .collect();
        dtypes.sort_by_key(|d| d.map(Dtype::torch_name));
        dtypes.dedup();
        parse_config(&Value::Object(m.clone()), path, None).ok().map(|p| (p.config, p.dialect, p.torch_dtype, dtypes))
    };
    let want = meaning(&out);
    if want.is_none() {
        return Ok(Value::Object(out));
    }
    let ours = out.clone();
    for (key, value) in src {
        if out.get(key) == Some(value) {
            continue;
        }
        let previous = out.insert(key.clone(), value.clone());
        if meaning(&out) != want {
            match previous {
                Some(p) => out.insert(key.clone(), p),
                None => out.remove(key),
            };
        }
    }
    let own: Vec<String> = out.keys().filter(|k| !src.contains_key(*k)).cloned().collect();
    for key in own {
        let previous = out.remove(&key).expect("listed from the map");
        if meaning(&out) != want {
            out.insert(key, previous);
        }
    }
    keep_legacy_rope(&mut out, &ours, |m| meaning(m) == want);
    Ok(Value::Object(out))
}

/// The RoPE keys SGLang, vLLM and speculators' converter read: `rope_theta` and `rope_scaling`.
/// They read no transformers-5 `rope_parameters`, and aerie's parse prefers `rope_parameters`, so
/// a source that spells RoPE only there (or beside stale legacy keys) would lose its scaling in
/// every engine while aerie reads it back unchanged. Wherever the written object keeps
/// `rope_parameters` (the top level, or speculators' `transformer_layer_config`), the legacy keys
/// are written beside it: the source's own when they alone mean the same drafter, else aerie's.
fn keep_legacy_rope(out: &mut Object, ours: &Object, same: impl Fn(&Object) -> bool) {
    const LEGACY: [&str; 2] = ["rope_theta", "rope_scaling"];
    const LAYER: &str = "transformer_layer_config";
    // The levels that hold the Llama keys, as (child key or None for the top level).
    for level in [None, Some(LAYER)] {
        let at = |m: &Object| -> Option<Object> {
            match level {
                None => Some(m.clone()),
                Some(k) => m.get(k).and_then(Value::as_object).cloned(),
            }
        };
        let (Some(here), Some(ours_here)) = (at(out), at(ours)) else { continue };
        if !here.contains_key("rope_parameters") || !LEGACY.iter().all(|k| ours_here.contains_key(*k)) {
            continue;
        }
        let put = |m: &mut Object, f: &dyn Fn(&mut Object)| match level {
            None => f(m),
            Some(k) => f(m.get_mut(k).and_then(Value::as_object_mut).expect("checked above")),
        };
        // Missing legacy keys take aerie's values.
        put(out, &|m| {
            for k in LEGACY {
                if !m.contains_key(k) {
                    m.insert(k.into(), ours_here[k].clone());
                }
            }
        });
        // Read as an engine does, without `rope_parameters`: the same drafter, or aerie's values.
        let mut legacy_view = out.clone();
        put(&mut legacy_view, &|m| {
            m.remove("rope_parameters");
        });
        if !same(&legacy_view) {
            put(out, &|m| {
                for k in LEGACY {
                    m.insert(k.into(), ours_here[k].clone());
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn source_spelling_is_kept_where_it_means_the_same() {
        let p = Path::new("t/config.json");
        let ours = json!({
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
            "num_hidden_layers": 1, "vocab_size": 512, "draft_vocab_size": 128, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 256, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": true},
            "fc_norm": false, "norm_output": false,
        });
        let mut source = ours.clone();
        let s = source.as_object_mut().unwrap();
        s.remove("fc_norm");
        s.insert("bos_token_id".into(), json!(1));
        s.insert("rope_scaling".into(), Value::Null);
        s["eagle_config"]["parallel_draft_step"] = json!(1);
        // A different meaning is never taken: the drafter in memory has 64 hidden units.
        s.insert("hidden_size".into(), json!(32));
        let got = keep_source_spelling(ours, &source, p).unwrap();
        assert_eq!(got["bos_token_id"], json!(1));
        assert_eq!(got["rope_scaling"], Value::Null);
        assert_eq!(got["eagle_config"]["parallel_draft_step"], json!(1));
        assert!(got.get("fc_norm").is_none());
        assert_eq!(got["hidden_size"], json!(64));

        // transformers 5's `dtype` replaces `torch_dtype` when it names the same dtype, never
        // beside another.
        let mut source = got.clone();
        let s = source.as_object_mut().unwrap();
        s.remove("torch_dtype");
        s.insert("dtype".into(), json!("bfloat16"));
        let same = keep_source_spelling(got.clone(), &source, p).unwrap();
        assert_eq!((same.get("torch_dtype"), &same["dtype"]), (None, &json!("bfloat16")));
        let mut f32 = got;
        f32["torch_dtype"] = json!("float32");
        let other = keep_source_spelling(f32, &source, p).unwrap();
        assert_eq!((&other["torch_dtype"], other.get("dtype")), (&json!("float32"), None));
    }

    /// A source that spells RoPE only in transformers 5's `rope_parameters` (llama3 scaling) is
    /// written with the legacy `rope_theta` and `rope_scaling` beside it, which engines read; a
    /// stale legacy key beside `rope_parameters` is replaced by what the drafter means.
    #[test]
    fn rope_parameters_only_sources_get_the_legacy_keys_too() {
        use crate::DrafterConfig;
        use crate::checkpoint::Dialect;
        use crate::checkpoint::config::{parse_config, to_json};
        use crate::config::RopeScaling;
        let p = Path::new("t/config.json");
        let mut cfg = DrafterConfig::smollm2_135m(8192);
        cfg.rope.theta = 500000.0;
        cfg.rope.scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let params = json!({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        for dialect in [Dialect::Sglang, Dialect::Speculators] {
            let ours = to_json(&cfg, dialect, Dtype::BF16, p).unwrap();
            let mut source = ours.clone();
            let level = match dialect {
                Dialect::Sglang => source.as_object_mut().unwrap(),
                _ => source["transformer_layer_config"].as_object_mut().unwrap(),
            };
            level.remove("rope_theta");
            level.remove("rope_scaling");
            level.insert("rope_parameters".into(), params.clone());
            let got = keep_source_spelling(ours, &source, p).unwrap();
            let level = match dialect {
                Dialect::Sglang => &got,
                _ => &got["transformer_layer_config"],
            };
            assert_eq!(level["rope_parameters"], params, "{dialect}: the source's rope_parameters are kept");
            assert_eq!(level["rope_theta"], json!(500000.0), "{dialect}: {got}");
            assert_eq!(level["rope_scaling"]["rope_type"], json!("llama3"), "{dialect}: {got}");
            assert_eq!(level["rope_scaling"]["type"], json!("llama3"), "{dialect}: {got}");
            assert_eq!(level["rope_scaling"]["factor"], json!(8.0), "{dialect}: {got}");
            // What an engine reads (the legacy keys alone) is the drafter in memory.
            let mut legacy = got.clone();
            match dialect {
                Dialect::Sglang => legacy.as_object_mut().unwrap().remove("rope_parameters"),
                _ => legacy["transformer_layer_config"].as_object_mut().unwrap().remove("rope_parameters"),
            };
            assert_eq!(parse_config(&legacy, p, None).unwrap().config.rope, cfg.rope, "{dialect}");

            // Stale legacy keys beside rope_parameters (plain RoPE, theta 10000) are overwritten.
            let ours = to_json(&cfg, dialect, Dtype::BF16, p).unwrap();
            let mut stale = source.clone();
            let level = match dialect {
                Dialect::Sglang => stale.as_object_mut().unwrap(),
                _ => stale["transformer_layer_config"].as_object_mut().unwrap(),
            };
            level.insert("rope_theta".into(), json!(10000.0));
            level.insert("rope_scaling".into(), Value::Null);
            let got = keep_source_spelling(ours, &stale, p).unwrap();
            let level = match dialect {
                Dialect::Sglang => &got,
                _ => &got["transformer_layer_config"],
            };
            assert_eq!(
                (&level["rope_theta"], &level["rope_scaling"]["rope_type"]),
                (&json!(500000.0), &json!("llama3"))
            );
        }
    }
}
