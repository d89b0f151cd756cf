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
    Ok(Value::Object(out))
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
}
