//! Reading a target's Hugging Face `config.json`, in one place: where the file is, and where the
//! text model's keys are. Multimodal wrappers (Kimi-K2.5's `KimiK25ForConditionalGeneration`,
//! Qwen2-VL, Llava) keep the language model's config under `text_config`; plain causal LMs keep
//! it at the top level. The tokenizer loader, the drafter initialiser and the checkpoint tools
//! all ask the same questions of the same file.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Error, Result};

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

/// A target's shape as shard metadata records it: what a capture is checked against, and what
/// shards are checked against before they stand for a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetShape {
    /// Decoder layers.
    pub num_layers: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Rows of the head (`vocab_size` of the text model's config).
    pub vocab_size: usize,
}

impl TargetShape {
    /// The text model's shape from `target/config.json` (`text_config` of a multimodal wrapper
    /// such as Kimi-K2.5, else the top level).
    pub fn from_config(target: &Path) -> Result<Self> {
        let path = config_json_path(target);
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let config: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Config { path: path.clone(), message: format!("not valid JSON: {e}") })?;
        let key =
            |name: &str| {
                text_key(&config, name).and_then(Value::as_u64).filter(|&v| v > 0).map(|v| v as usize).ok_or_else(
                    || Error::Config { path: path.clone(), message: format!("no positive integer `{name}`") },
                )
            };
        Ok(Self {
            num_layers: key("num_hidden_layers")?,
            hidden_size: key("hidden_size")?,
            vocab_size: key("vocab_size")?,
        })
    }
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

    #[test]
    fn the_shape_comes_from_the_text_model_of_a_wrapper() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"architectures": ["KimiK25ForConditionalGeneration"], "vocab_size": 7,
                "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}"#,
        )
        .unwrap();
        let shape = TargetShape::from_config(dir.path()).unwrap();
        assert_eq!(shape, TargetShape { num_layers: 61, hidden_size: 7168, vocab_size: 163840 });
        std::fs::write(dir.path().join("config.json"), r#"{"hidden_size": 64}"#).unwrap();
        let e = TargetShape::from_config(dir.path()).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("num_hidden_layers"), "{e}");
    }
}
