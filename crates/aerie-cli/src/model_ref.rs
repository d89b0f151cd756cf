//! Model and drafter arguments: a local path, or a Hugging Face Hub id `org/name[@revision]`.
//!
//! Every flag that names a target, a drafter, a tokenizer or a target head goes through
//! [`parse`] (as its clap `value_parser`), so each command sees a plain local path. A path that
//! exists always wins, file or directory, so `--target-head model.safetensors` keeps its file
//! semantics; anything else must be a hub id, resolved by [`aerie_hub::hf::resolve_model_ref`]
//! to its snapshot directory in the shared Hugging Face cache (`HF_HUB_CACHE`, `HF_HOME`),
//! downloading the model files (configs, safetensors, tokenizer) when missing, or answering
//! from the cache alone with `HF_HUB_OFFLINE=1`.

use std::path::PathBuf;

use aerie_hub::hf::{self, HubConfig};

use crate::progress::FileBars;

/// Resolve `s` (a local path or `org/name[@revision]`) to a local path.
pub fn resolve(s: &str) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(s);
    if path.exists() {
        return Ok(path);
    }
    let cfg = HubConfig::from_env();
    let mut bars = FileBars::default();
    let resolved = hf::resolve_model_ref_with(s, &cfg, &mut |file, done, total| bars.update(file, done, total));
    bars.finish();
    Ok(resolved?)
}

/// Whether `s` has the shape of a hub id (`org/name`, optionally `@revision`), not of a path:
/// what a config value must look like to be resolved as one.
pub fn looks_like_hub_id(s: &str) -> bool {
    let repo = s.split_once('@').map_or(s, |(r, _)| r);
    !s.starts_with(['/', '.', '~']) && repo.split('/').count() == 2 && repo.split('/').all(|p| !p.is_empty())
}

/// [`resolve`] as a clap `value_parser`: the error becomes clap's "invalid value" message.
pub fn parse(s: &str) -> Result<PathBuf, String> {
    resolve(s).map_err(|e| format!("{e:#}"))
}
