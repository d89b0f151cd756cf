//! `[select]` of a training config: choosing the checkpoint by decoded τ ([`crate::select`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::TrainConfig;

/// `[select]`: every `every_steps` steps (and after the last), greedy speculative decoding of
/// held-out prompts with the native target measures the drafter's τ, and the best drafter so far
/// is kept as `RUN/best/`. Training loss and teacher-forced accept length track τ only loosely
/// across a domain shift (NeMo Automodel's `decode_eval` chooses by decoding for that reason).
/// None of it changes the trained weights, so none of it is part of the resume fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectConfig {
    /// Decode every N optimizer steps, and after the last step (0: after the last step only).
    #[serde(default)]
    pub every_steps: u64,
    /// Held-out prompts: a JSONL file in `aerie eval decode`'s formats, or a named set
    /// (`mtbench`; resolved by the CLI).
    pub prompts: PathBuf,
    /// Drafts per cycle of the greedy chain.
    #[serde(default = "d_select_k")]
    pub k: usize,
    /// New tokens per answer at most.
    #[serde(default = "d_select_max_new_tokens")]
    pub max_new_tokens: usize,
    /// Decode only the first N prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompts: Option<usize>,
    /// The target model directory decoded against (weights, tokenizer, chat template); default
    /// `target.path`, which must then be a model directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<PathBuf>,
    /// Chat template: `auto` (the target's own), a built-in name, or a .jinja file.
    #[serde(default = "d_select_template")]
    pub template: String,
}

impl SelectConfig {
    /// The target directory decoded against: `select.target`, else `target.path`.
    pub fn target_dir<'a>(&'a self, cfg: &'a TrainConfig) -> Option<&'a Path> {
        self.target.as_deref().or(cfg.target.path.as_deref())
    }
}

fn d_select_k() -> usize {
    2
}
fn d_select_max_new_tokens() -> usize {
    64
}
fn d_select_template() -> String {
    "auto".into()
}
