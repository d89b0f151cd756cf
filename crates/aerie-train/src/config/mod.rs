//! `TrainConfig`: everything a training run needs, read from TOML (style guide, "Training
//! config": nested sections with defaults and an explicit seed, saved with every checkpoint).
//!
//! The recipe defaults are those of the reference trainer (eagle3.md §3): AdamW (0.9, 0.999),
//! eps 1e-8, weight decay 0, lr 1e-4 with 1.5% linear warm-up then cosine to 0, global
//! gradient-norm clip 0.5, `ttt_length` 7, step weights 0.8^k. burn's `AdamWConfig` defaults
//! differ (eps 1e-5, weight decay 1e-4), so every optimiser setting is passed explicitly.
//!
//! Unknown keys are errors that name the nearest valid key ([`keys`]); `--set key=value`
//! overrides go through the same table. [`fingerprint`] hashes the keys that change a run's
//! result, so a resume with a different config is refused with the differing keys listed.
//! [`model_paths`] names the keys that hold model paths, for callers that resolve hub ids.
//!
//! Relative paths are resolved against the working directory, like every other aerie path.

pub mod fingerprint;
pub mod keys;
pub mod model_paths;
mod select;

pub use select::SelectConfig;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A whole training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Seed of the data order and of fresh weights.
    #[serde(default)]
    pub seed: u64,
    /// Run directory: checkpoints, `metrics.jsonl`, `summary.json`.
    pub output_dir: PathBuf,
    /// K, unrolled draft steps of the TTT objective.
    #[serde(default = "d_ttt_length")]
    pub ttt_length: usize,
    /// Step k's loss is weighted `step_weight_decay^k`.
    #[serde(default = "d_step_weight_decay")]
    pub step_weight_decay: f64,
    /// The training objective.
    #[serde(default)]
    pub loss: LossKind,
    /// Compute precision.
    #[serde(default)]
    pub precision: Precision,
    /// Write a `metrics.jsonl` line every N optimizer steps.
    #[serde(default = "d_log_every")]
    pub log_every: u64,
    /// Evaluate on held-out data every N steps (0: only at the end).
    #[serde(default)]
    pub eval_every: u64,
    /// Save a checkpoint every N steps (0: only at the end).
    #[serde(default)]
    pub save_every: u64,
    /// Keep the newest N checkpoints (0: keep all).
    #[serde(default = "d_keep_last")]
    pub keep_last: usize,
    /// Training and evaluation data.
    pub data: DataConfig,
    /// Where the drafter's initial weights come from.
    pub init: InitConfig,
    /// The target's head (teacher) and embedding.
    #[serde(default)]
    pub target: TargetSection,
    /// Optimiser and schedule.
    #[serde(default)]
    pub optim: OptimConfig,
    /// Choose the checkpoint by τ measured in decoding ([`crate::select`]); absent: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<SelectConfig>,
}

/// The training objective (eagle3.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Soft cross-entropy against the teacher over the draft vocab, Σ pm·CE / positions.
    #[default]
    SoftCe,
    /// Total variation: the mean over pm of 1 - α, α = Σ_v min(pf, q).
    Tv,
    /// λ·KL(p‖q) + (1-λ)(1-α) per token, λ = exp(-α) detached; mean over pm.
    Lk,
}

/// Compute precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// float32 weights, activations and optimizer state.
    #[default]
    F32,
    /// bfloat16 activations over float32 master weights and optimizer state (meant for CUDA;
    /// on the CPU it runs, but burn-flex's bf16 kernels are slower than its f32 ones).
    Bf16,
}

impl std::str::FromStr for Precision {
    type Err = String;

    /// The config file's spelling (`f32`, `bf16`), for command-line flags.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            _ => Err(format!("`{s}` is not a precision: use `f32` or `bf16`")),
        }
    }
}

impl Precision {
    /// The activation dtype of the forward.
    pub fn dtype(self) -> burn::tensor::DType {
        match self {
            Precision::F32 => burn::tensor::DType::F32,
            Precision::Bf16 => burn::tensor::DType::BF16,
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Training shard directories (aerie-shard/1).
    pub train: Vec<PathBuf>,
    /// Held-out shard directories.
    #[serde(default)]
    pub eval: Vec<PathBuf>,
    /// Without `eval` dirs: hold out this fraction of the training samples, chosen by a hash of
    /// (dataset position, sample index), independent of the seed.
    #[serde(default)]
    pub eval_fraction: f64,
    /// Token budget of one micro-batch: B · Lmax (padding counted) stays within it. A sample
    /// longer than the budget forms a batch of its own.
    #[serde(default = "d_batch_tokens")]
    pub batch_tokens: usize,
    /// Skip samples longer than this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
    /// Samples per shuffled window that is sorted by length before batching.
    #[serde(default = "d_bucket_window")]
    pub bucket_window: usize,
    /// Samples per forward during evaluation.
    #[serde(default = "d_eval_batch_size")]
    pub eval_batch_size: usize,
    /// Evaluate on at most this many held-out samples (per eval directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_max_samples: Option<usize>,
}

/// How the initial drafter is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitKind {
    /// Fresh weights (HF Llama init, seeded) for a target's shape and a draft vocab.
    Fresh,
    /// Continue from an existing drafter, keeping its d2t/t2d.
    WarmStart,
}

/// `[init]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitConfig {
    /// `fresh` or `warm_start`.
    pub kind: InitKind,
    /// fresh: the target's `config.json` (or its model directory). Default: `target.path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_config: Option<PathBuf>,
    /// The draft vocab from `aerie vocab build` (safetensors with `d2t`, optionally `t2d`).
    /// Required for fresh; for warm_start it is checked against the drafter's own map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<PathBuf>,
    /// warm_start: the drafter directory (SGLang or speculators layout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<PathBuf>,
    /// warm_start: replace the drafter's vocab map by `vocab` when they differ (lm_head rows of
    /// target ids in both maps are kept, the others start fresh). Otherwise that is an error.
    #[serde(default)]
    pub allow_vocab_override: bool,
    /// fresh: start from the target's output side instead of random (see `init::target_init`):
    /// lm_head = the target head's rows of the draft vocab, norm = the target's final norm, fc
    /// passing the last aux feature through, o_proj and down_proj zero. Not serialised when false,
    /// so configs (and resume fingerprints) written before the key existed are unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_target: bool,
    /// fresh: shape overrides of the drafter (default: the target's own shape).
    #[serde(default)]
    pub shape: ShapeOverrides,
}

/// `[init.shape]`: a fresh drafter's shape, where it should differ from the target's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeOverrides {
    /// H (the embedding is the target's, so it must stay Ht unless the target's is projected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_size: Option<usize>,
    /// I.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<usize>,
    /// nH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_attention_heads: Option<usize>,
    /// nKV.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_norm_eps: Option<f64>,
    /// RoPE base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Context the drafter is configured for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    /// Target layers consumed, in the OUTPUT-of-layer convention (eagle3.md §2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux_layer_ids: Option<Vec<usize>>,
    /// EAGLE-3.1 per-feature norms before `fc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fc_norm: Option<bool>,
    /// EAGLE-3.1: feed the post-norm state to the next draft step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_output: Option<bool>,
    /// `[init.shape.mla]`: multi-latent attention (`Eagle3DeepseekV2ForCausalLM`) instead of
    /// grouped-query attention, with DeepSeek's five shape keys, all required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<aerie_model::MlaConfig>,
}

impl ShapeOverrides {
    /// Whether any override is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The `[target]` section of a training config: where the teacher's head and the drafter's
/// embedding come from (the target's shape is `aerie_model::TargetConfig`'s business).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSection {
    /// The target model directory, or a safetensors file holding its head and embedding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Where the head (`lm_head.weight`, teacher) comes from, if not `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<PathBuf>,
    /// Where the input embedding comes from, if not `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<PathBuf>,
    /// Rows of the head per chunk of the full-vocabulary teacher pass.
    #[serde(default = "d_head_chunk_rows")]
    pub head_chunk_rows: usize,
}

impl Default for TargetSection {
    fn default() -> Self {
        Self { path: None, head: None, embedding: None, head_chunk_rows: d_head_chunk_rows() }
    }
}

impl TargetSection {
    /// The head source: `head`, else `path`.
    pub fn head_source(&self) -> Option<&Path> {
        self.head.as_deref().or(self.path.as_deref())
    }

    /// The embedding source: `embedding`, else `path`.
    pub fn embedding_source(&self) -> Option<&Path> {
        self.embedding.as_deref().or(self.path.as_deref())
    }
}

/// `[optim]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    /// Peak learning rate.
    #[serde(default = "d_lr")]
    pub lr: f64,
    /// Share of all steps spent in linear warm-up; cosine decay to 0 follows.
    #[serde(default = "d_warmup_ratio")]
    pub warmup_ratio: f64,
    /// AdamW (β1, β2).
    #[serde(default = "d_betas")]
    pub betas: [f64; 2],
    /// AdamW epsilon (PyTorch's 1e-8; burn's default is 1e-5).
    #[serde(default = "d_eps")]
    pub eps: f64,
    /// Decoupled weight decay (the EAGLE recipe uses 0; burn's default is 1e-4).
    #[serde(default)]
    pub weight_decay: f64,
    /// Clip the GLOBAL gradient norm to this (PyTorch `clip_grad_norm_`); 0 disables.
    #[serde(default = "d_max_grad_norm")]
    pub max_grad_norm: f64,
    /// Micro-batches per device per optimizer step.
    #[serde(default = "d_one")]
    pub grad_accumulation: usize,
    /// Passes over the training data (ignored when `max_steps` is set).
    #[serde(default = "d_one")]
    pub epochs: usize,
    /// Stop after this many optimizer steps (cycling the data as needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// L2-SP (arXiv 1802.01483): λ of the penalty λ/2·Σ‖θ − θ₀‖² that pulls the drafter toward
    /// its warm start's weights θ₀, so a fine-tune for another domain does not forget the first
    /// ([`crate::anchor`]). 0, the default, is off: the run is bit for bit the run without it, and
    /// the key is not serialised, so configs (and resume fingerprints) written before it are
    /// unchanged.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub anchor_weight: f64,
    /// On-policy replay (after Draft-OPD, arXiv 2605.29343): β of the term that adds the soft-CE
    /// again at the positions greedy chain decoding drafts from, walked over the current
    /// drafter's hits in each step ([`crate::replay`]). Soft-CE only. 0, the default, is off and
    /// not serialised, as `anchor_weight`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replay_weight: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self {
            lr: d_lr(),
            warmup_ratio: d_warmup_ratio(),
            betas: d_betas(),
            eps: d_eps(),
            weight_decay: 0.0,
            max_grad_norm: d_max_grad_norm(),
            grad_accumulation: 1,
            epochs: 1,
            max_steps: None,
            anchor_weight: 0.0,
            replay_weight: 0.0,
        }
    }
}

fn d_ttt_length() -> usize {
    7
}
fn d_step_weight_decay() -> f64 {
    0.8
}
fn d_log_every() -> u64 {
    10
}
fn d_keep_last() -> usize {
    3
}
fn d_batch_tokens() -> usize {
    4096
}
fn d_bucket_window() -> usize {
    256
}
fn d_eval_batch_size() -> usize {
    4
}
fn d_head_chunk_rows() -> usize {
    8192
}
fn d_lr() -> f64 {
    1e-4
}
fn d_warmup_ratio() -> f64 {
    0.015
}
fn d_betas() -> [f64; 2] {
    [0.9, 0.999]
}
fn d_eps() -> f64 {
    1e-8
}
fn d_max_grad_norm() -> f64 {
    0.5
}
fn d_one() -> usize {
    1
}

impl TrainConfig {
    /// Read `path`, apply `--set key=value` overrides, and validate. Unknown keys (in the file or
    /// in an override) are errors naming the nearest valid key.
    pub fn load(path: &Path, overrides: &[(String, String)]) -> Result<Self> {
        if path.is_dir() {
            let hint = "is a directory: give the training config (a TOML file, e.g. configs/smollm2-quickstart.toml)";
            return Err(Error::config(path, hint));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_str(&text, path, overrides)
    }

    /// [`Self::load`] from text; `path` names the source in errors.
    pub fn from_toml_str(text: &str, path: &Path, overrides: &[(String, String)]) -> Result<Self> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| Error::config(path, format!("not valid TOML: {e}")))?;
        keys::check_table(&table, "", path)?;
        for (key, value) in overrides {
            keys::set(&mut table, key, value)?;
        }
        // A value of the wrong type is named by its key, and blamed on `--set` when it came
        // from there rather than from the file.
        let cfg: TrainConfig = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let key = e.path().to_string();
            let message = match key.as_str() {
                // The root: "`.`: missing field `output_dir`" (an empty file, say).
                "." => keys::plain_words(e.inner().message()),
                _ => format!("`{key}`: {}", keys::plain_words(e.inner().message())),
            };
            match overrides.iter().find(|(k, _)| *k == key) {
                Some((k, v)) => Error::config(format!("--set {k}={v}"), message),
                None => Error::config(path, message),
            }
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// The config as TOML (what is saved beside every checkpoint).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a TrainConfig always serialises to TOML")
    }

    /// Check values and the keys each init kind needs; `path` names the source in errors.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let mut problems = Vec::new();
        let mut bad = |key: &str, msg: &str| problems.push(format!("`{key}` {msg}"));
        if self.ttt_length == 0 {
            bad("ttt_length", "must be at least 1");
        }
        // The draft depth it trains for: the same limit as a decode's `--k` (one place).
        let max_depth = aerie_model::drafter::shape::MAX_DEPTH;
        if self.ttt_length > max_depth {
            let msg = format!(
                "is {}, past the limit of {max_depth} (the longest draft aerie runs; EAGLE-3 trains 7 steps, and each \
                 step keeps one more copy of the sequence's activations)",
                self.ttt_length
            );
            bad("ttt_length", &msg);
        }
        if !(self.step_weight_decay.is_finite() && self.step_weight_decay > 0.0) {
            bad("step_weight_decay", "must be a positive number");
        }
        if self.log_every == 0 {
            bad("log_every", "must be at least 1");
        }
        if self.data.train.is_empty() {
            bad("data.train", "lists no shard directory");
        }
        if !(0.0..1.0).contains(&self.data.eval_fraction) {
            bad("data.eval_fraction", "must be in [0, 1)");
        }
        if !self.data.eval.is_empty() && self.data.eval_fraction > 0.0 {
            bad("data.eval_fraction", "cannot be combined with `data.eval` directories");
        }
        if self.data.batch_tokens == 0 {
            bad("data.batch_tokens", "must be positive");
        }
        if self.data.bucket_window == 0 {
            bad("data.bucket_window", "must be positive");
        }
        if self.data.eval_batch_size == 0 {
            bad("data.eval_batch_size", "must be positive");
        }
        let o = &self.optim;
        if !(o.lr.is_finite() && o.lr >= 0.0) {
            bad("optim.lr", "must be a non-negative number");
        }
        if !(0.0..=1.0).contains(&o.warmup_ratio) {
            bad("optim.warmup_ratio", "must be in [0, 1]");
        }
        if o.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            bad("optim.betas", "must both be in [0, 1)");
        }
        if !(o.eps.is_finite() && o.eps > 0.0) {
            bad("optim.eps", "must be positive");
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            bad("optim.weight_decay", "must be non-negative");
        }
        if !(o.max_grad_norm.is_finite() && o.max_grad_norm >= 0.0) {
            bad("optim.max_grad_norm", "must be non-negative (0 disables clipping)");
        }
        if o.grad_accumulation == 0 {
            bad("optim.grad_accumulation", "must be at least 1");
        }
        if !(o.anchor_weight.is_finite() && o.anchor_weight >= 0.0) {
            bad("optim.anchor_weight", "must be a non-negative number (0 turns the anchor off)");
        } else if o.anchor_weight > 0.0 && self.init.kind != InitKind::WarmStart {
            bad(
                "optim.anchor_weight",
                "anchors the drafter to its warm start's weights: it needs init.kind = \"warm_start\" (a fresh \
                 drafter has no weights worth keeping; set it to 0)",
            );
        }
        if !(o.replay_weight.is_finite() && o.replay_weight >= 0.0) {
            bad("optim.replay_weight", "must be a non-negative number (0 turns replay off)");
        } else if o.replay_weight > 0.0 && self.loss != LossKind::SoftCe {
            bad(
                "optim.replay_weight",
                "replays the soft cross-entropy at decoding's cycle starts: it needs loss = \"soft_ce\" (set it \
                 to 0 for the tv and lk objectives)",
            );
        }
        if o.max_steps.is_none() && o.epochs == 0 {
            bad("optim.epochs", "must be at least 1 (or set optim.max_steps)");
        }
        if let Some(s) = &self.select {
            if s.k == 0 || s.k > max_depth {
                bad("select.k", &format!("must be in 1..={max_depth}"));
            }
            if s.max_new_tokens == 0 {
                bad("select.max_new_tokens", "must be at least 1");
            }
            if s.max_prompts == Some(0) {
                bad("select.max_prompts", "must be at least 1");
            }
            if !s.target_dir(self).is_some_and(Path::is_dir) {
                bad(
                    "select.target",
                    "must be the target's model directory (weights, tokenizer, chat template) to decode with; by \
                     default it is `target.path`, which is not a directory here",
                );
            }
        }
        if self.target.head_chunk_rows == 0 {
            bad("target.head_chunk_rows", "must be positive");
        }
        let i = &self.init;
        match i.kind {
            InitKind::Fresh => {
                if i.vocab.is_none() {
                    bad("init.vocab", "is required for a fresh drafter (the file `aerie vocab build` writes)");
                }
                if i.target_config.is_none() && !self.target.path.as_deref().is_some_and(Path::is_dir) {
                    bad(
                        "init.target_config",
                        "is required for a fresh drafter unless `target.path` is a model directory",
                    );
                }
                if i.drafter.is_some() {
                    bad("init.drafter", "is only used with kind = \"warm_start\"");
                }
            }
            InitKind::WarmStart => {
                if i.drafter.is_none() {
                    bad("init.drafter", "is required for kind = \"warm_start\"");
                }
                if !i.shape.is_empty() {
                    bad("init.shape", "only applies to kind = \"fresh\" (a warm start keeps the drafter's shape)");
                }
                if i.allow_vocab_override && i.vocab.is_none() {
                    bad("init.allow_vocab_override", "needs `init.vocab` (the vocab to switch to)");
                }
                if i.from_target {
                    bad(
                        "init.from_target",
                        "only applies to kind = \"fresh\" (a warm start keeps the drafter's weights)",
                    );
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::config(path, format!("invalid config:\n  - {}", problems.join("\n  - "))))
        }
    }

    /// The TTT options: K steps weighted `step_weight_decay^k`; α differentiable only for the
    /// objectives built on it (TV, LK).
    pub fn ttt_options(&self) -> aerie_model::TttOptions {
        aerie_model::TttOptions::geometric(self.ttt_length, self.step_weight_decay)
            .with_alpha_grad(self.loss != LossKind::SoftCe)
    }
}
