//! Reading what a drafter needs from its TARGET model: the layer count (to default aux ids),
//! sizes for compatibility checks, the input embedding (drafters usually ship without it) and
//! the output head (the training teacher, eagle3.md §2).
//!
//! A target is a HF model directory (single or sharded safetensors; multimodal wrappers such as
//! Kimi-K2.5 keep the text model under `language_model.` and its config under `text_config`),
//! or a plain safetensors file holding just the tensor.

use std::path::Path;

use serde_json::Value;

use super::io::WeightFiles;
use super::keys::{TARGET_EMBED_KEYS, TARGET_HEAD_KEYS};
use super::tensors::HostTensor;
use crate::{Error, Result};

/// The target facts aerie checks drafters against, from the target's `config.json`. Values come
/// from `text_config` when the config has one (multimodal wrappers), else from the top level.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TargetInfo {
    /// Decoder layers N (aux ids must lie below N).
    pub num_hidden_layers: Option<usize>,
    /// Ht.
    pub hidden_size: Option<usize>,
    /// V.
    pub vocab_size: Option<usize>,
    /// Context length (the drafter should cover it).
    pub max_position_embeddings: Option<usize>,
    /// Whether the head is the embedding.
    pub tie_word_embeddings: Option<bool>,
    /// `architectures` (top level), for the speculators `verifier` entry.
    pub architectures: Vec<String>,
}

use aerie_data::hf_config::{config_json_path as config_path, text_key};

/// Read a target's `config.json` (give the model directory or the file).
pub fn read_target_info(path: &Path) -> Result<TargetInfo> {
    let cfg = config_path(path);
    let text = std::fs::read_to_string(&cfg).map_err(|e| Error::io(&cfg, e))?;
    let top: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Config { path: cfg.clone(), message: format!("not valid JSON: {e}") })?;
    if !top.is_object() {
        return Err(Error::Config { path: cfg, message: "not a JSON object".into() });
    }
    let get = |key: &str| text_key(&top, key);
    let num = |key: &str| get(key).and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
    // Bounded here, where every command reading a target's sizes reads them (aerie_data::limits).
    {
        use aerie_data::limits::{self, MAX_LAYERS, MAX_POSITIONS, MAX_WIDTH, WHY_LAYERS, WHY_POSITIONS, WHY_WIDTH};
        let at = |k: &str| format!("{}: {k}", cfg.display());
        let u = |k: &str| get(k).and_then(Value::as_u64);
        if let Some(n) = u("num_hidden_layers") {
            limits::check(at("num_hidden_layers"), n, MAX_LAYERS, WHY_LAYERS)?;
        }
        if let Some(n) = u("hidden_size") {
            limits::check(at("hidden_size"), n, MAX_WIDTH, WHY_WIDTH)?;
        }
        if let Some(n) = u("vocab_size") {
            limits::vocab(at("vocab_size"), n)?;
        }
        if let Some(n) = u("max_position_embeddings") {
            limits::check(at("max_position_embeddings"), n, MAX_POSITIONS, WHY_POSITIONS)?;
        }
    }
    Ok(TargetInfo {
        num_hidden_layers: num("num_hidden_layers"),
        hidden_size: num("hidden_size"),
        vocab_size: num("vocab_size"),
        max_position_embeddings: num("max_position_embeddings"),
        tie_word_embeddings: get("tie_word_embeddings").and_then(Value::as_bool),
        architectures: top
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
    })
}

/// The target's decoder layer count N (`num_hidden_layers` or `text_config.num_hidden_layers`),
/// which the default aux ids `[1, N/2-1, N-4]` need.
pub fn target_num_layers(dir: &Path) -> Result<usize> {
    read_target_info(dir)?.num_hidden_layers.ok_or_else(|| Error::Config {
        path: config_path(dir),
        message: "no num_hidden_layers (nor text_config.num_hidden_layers)".into(),
    })
}

fn weights_of(path: &Path) -> Result<WeightFiles> {
    if path.is_dir() { WeightFiles::open_dir(path) } else { Ok(WeightFiles::open_file(path)) }
}

/// The first of `candidates` that `files` holds, loaded.
fn load_first(files: &WeightFiles, candidates: &[&str]) -> Result<Option<HostTensor>> {
    for key in candidates {
        if files.contains(key)? {
            let t = files.load(&[key])?.remove(*key);
            // The target side is checked like the drafter: a NaN head makes every loss 0.
            if let Some(p) = t.as_ref().and_then(|t| super::validate::check_finite(key, t)) {
                return Err(Error::Invalid { path: files.source().to_path_buf(), problems: vec![p.message] });
            }
            return Ok(t);
        }
    }
    Ok(None)
}

/// The target's input embedding `[V, Ht]`: from a model directory (`model.embed_tokens.weight`,
/// or under `language_model.`; sharded or not) or a plain safetensors file holding
/// `embed_tokens.weight` / `model.embed_tokens.weight`.
pub fn load_target_embedding(path: &Path) -> Result<HostTensor> {
    let files = weights_of(path)?;
    load_first(&files, TARGET_EMBED_KEYS)?.ok_or_else(|| Error::Invalid {
        path: files.source().to_path_buf(),
        problems: vec![format!("no target embedding under any of {TARGET_EMBED_KEYS:?}")],
    })
}

/// The target's output head `[V, Ht]` (the teacher of training): `lm_head.weight` from a
/// safetensors file, or from a model directory, where a tied model (`tie_word_embeddings`, or
/// no head stored) uses its input embedding instead.
pub fn load_target_head(path: &Path) -> Result<HostTensor> {
    let files = weights_of(path)?;
    let tied =
        path.is_dir() && config_path(path).is_file() && read_target_info(path)?.tie_word_embeddings == Some(true);
    if !tied && let Some(t) = load_first(&files, TARGET_HEAD_KEYS)? {
        return Ok(t);
    }
    if path.is_dir()
        && let Some(t) = load_first(&files, TARGET_EMBED_KEYS)?
    {
        return Ok(t);
    }
    Err(Error::Invalid {
        path: files.source().to_path_buf(),
        problems: vec![if path.is_dir() {
            format!("no target head under {TARGET_HEAD_KEYS:?} and no embedding under {TARGET_EMBED_KEYS:?}")
        } else {
            format!("no target head under {TARGET_HEAD_KEYS:?}")
        }],
    })
}
