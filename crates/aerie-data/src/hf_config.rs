//! Reading a target's Hugging Face `config.json`, in one place: where the file is, and where the
//! text model's keys are. Multimodal wrappers (Kimi-K2.5's `KimiK25ForConditionalGeneration`,
//! Qwen2-VL, Llava) keep the language model's config under `text_config`; plain causal LMs keep
//! it at the top level. The tokenizer loader, the drafter initialiser and the checkpoint tools
//! all ask the same questions of the same file.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// `dir/config.json`, or `path` itself when it is a file.
pub fn config_json_path(path: &Path) -> PathBuf {
    if path.is_dir() { path.join("config.json") } else { path.to_path_buf() }
}

/// The text model's config: `text_config` when the config has one (an object), else the top
/// level. For reading a whole shape consistently from one level.
pub fn text_model(top: &Value) -> &Value {
    top.get("text_config").filter(|v| v.is_object()).unwrap_or(top)
}

/// One key of the text model: from `text_config` when it holds it, else from the top level.
pub fn text_key<'a>(top: &'a Value, key: &str) -> Option<&'a Value> {
    top.get("text_config").filter(|v| v.is_object()).and_then(|t| t.get(key)).or_else(|| top.get(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrappers_and_plain_configs() {
        let plain = json!({"hidden_size": 576, "vocab_size": 49152});
        assert_eq!(text_model(&plain), &plain);
        assert_eq!(text_key(&plain, "vocab_size"), Some(&json!(49152)));
        let wrapped = json!({"architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {"hidden_size": 7168, "vocab_size": 163840}, "tie_word_embeddings": false});
        assert_eq!(text_model(&wrapped)["hidden_size"], json!(7168));
        assert_eq!(text_key(&wrapped, "vocab_size"), Some(&json!(163840)));
        assert_eq!(text_key(&wrapped, "tie_word_embeddings"), Some(&json!(false)));
        assert_eq!(text_key(&wrapped, "missing"), None);
    }
}
