//! What a run reports: `metrics.jsonl` (one JSON object per line, `kind` `train` or `eval`),
//! `summary.json` at the end, and the [`Event`]s a caller (the CLI's progress bar) observes.
//! Field names are a stable interface.

use std::io::Write;
use std::path::{Path, PathBuf};

use aerie_model::TttMetrics;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A `kind: "train"` line: averages over the steps since the previous line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRecord {
    /// `train`.
    pub kind: String,
    /// Optimizer steps done.
    pub step: u64,
    /// Epoch of the last step (0-based).
    pub epoch: u64,
    /// Mean objective per step.
    pub loss: f64,
    /// Soft-CE per unrolled step (Σ pm·CE / positions), whatever the objective.
    pub loss_k: Vec<f64>,
    /// Teacher-forced accuracy per unrolled step.
    pub acc_k: Vec<f64>,
    /// Acceptance rate α per unrolled step.
    pub alpha_k: Vec<f64>,
    /// Simulated accept length 1 + Σ_k Π_{i≤k} acc_i (teacher forced: an upper bound of τ).
    pub accept_length: f64,
    /// Learning rate of the last step.
    pub lr: f64,
    /// Mean global gradient norm (before clipping).
    pub grad_norm: f64,
    /// Real tokens per second of training time.
    pub tokens_per_s: f64,
    /// Padded tokens (B·Lmax) per second.
    pub padded_tokens_per_s: f64,
    /// Real tokens trained on so far.
    pub tokens: f64,
    /// Seconds of training so far (all segments of a resumed run).
    pub elapsed_s: f64,
}

/// A `kind: "eval"` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// `eval`.
    pub kind: String,
    /// Optimizer steps done.
    pub step: u64,
    /// The eval set: its directory, or `held-out` for the `eval_fraction` split.
    pub set: String,
    /// Samples evaluated.
    pub samples: usize,
    /// The teacher-forced metrics (`aerie eval loss`'s).
    pub metrics: TttMetrics,
}

/// Where a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// All steps done, final checkpoint written.
    Completed,
    /// Stopped by the observer (Ctrl-C, or a test simulating a kill); no final checkpoint.
    Interrupted,
    /// Stopped on a NaN/Inf loss or gradient norm; checkpoints stop at the last good one.
    NonFinite,
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// How it ended.
    pub status: Status,
    /// The error, for `non_finite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Optimizer steps done.
    pub steps: u64,
    /// Steps planned.
    pub total_steps: u64,
    /// Epoch reached (0-based).
    pub epoch: u64,
    /// Training samples (after the hold-out and length filter).
    pub train_samples: usize,
    /// Held-out samples of the `eval_fraction` split.
    pub held_out_samples: usize,
    /// Samples skipped by length.
    pub skipped_samples: usize,
    /// Real tokens trained on.
    pub tokens: f64,
    /// Padded tokens processed.
    pub padded_tokens: f64,
    /// Seconds of training (all segments).
    pub elapsed_s: f64,
    /// tokens / elapsed_s.
    pub tokens_per_s: f64,
    /// The last `train` line.
    pub last_train: Option<TrainRecord>,
    /// The last evaluation of each eval set.
    pub eval: Vec<EvalRecord>,
    /// Checkpoints on disk at the end, oldest first.
    pub checkpoints: Vec<PathBuf>,
    /// The checkpoint of the final weights (absent unless completed).
    pub final_checkpoint: Option<PathBuf>,
    /// sha256 of the config's result-affecting keys.
    pub config_hash: String,
    /// The checkpoint this segment resumed from.
    pub resumed_from: Option<PathBuf>,
    /// Facts about the setup (init, data) worth keeping.
    pub notes: Vec<String>,
}

/// What a caller observes during [`crate::train`].
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// Setup done; training starts at `start_step` of `total_steps`.
    Started {
        /// Steps already done (resume) or 0.
        start_step: u64,
        /// Steps of the whole run.
        total_steps: u64,
        /// Setup notes.
        notes: &'a [String],
    },
    /// A step finished.
    Step(&'a StepProgress),
    /// A `train` line was written.
    Log(&'a TrainRecord),
    /// An `eval` line was written.
    Eval(&'a EvalRecord),
    /// A checkpoint was written.
    Checkpoint {
        /// Its step.
        step: u64,
        /// Its directory.
        path: &'a Path,
    },
}

/// Per-step progress for bars: rate and ETA.
#[derive(Debug, Clone, PartialEq)]
pub struct StepProgress {
    /// Steps done.
    pub step: u64,
    /// Steps of the run.
    pub total_steps: u64,
    /// Epoch (0-based).
    pub epoch: u64,
    /// This step's objective.
    pub loss: f64,
    /// This step's step-0 accuracy.
    pub acc_0: f64,
    /// Real tokens per second over this segment.
    pub tokens_per_s: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Seconds of training (all segments).
    pub elapsed_s: f64,
    /// Estimated seconds to the end, at this segment's rate.
    pub eta_s: f64,
}

/// Appends lines to `metrics.jsonl`, flushed per line.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
}

impl MetricsLog {
    /// Open `RUN/metrics.jsonl` for appending, first dropping lines after `keep_until_step` (a
    /// resumed run re-does the steps after its checkpoint and must not log them twice).
    pub fn open(run: &Path, keep_until_step: u64) -> Result<Self> {
        let path = run.join("metrics.jsonl");
        if path.is_file() {
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            let kept: Vec<&str> = text
                .lines()
                .filter(|line| {
                    serde_json::from_str::<serde_json::Value>(line)
                        .ok()
                        .and_then(|v| v.get("step").and_then(serde_json::Value::as_u64))
                        .is_some_and(|s| s <= keep_until_step)
                })
                .collect();
            let mut body = kept.join("\n");
            if !body.is_empty() {
                body.push('\n');
            }
            // Atomically: a kill here must not lose the lines that stay.
            aerie_data::atomic::write_bytes(&path, body.as_bytes())?;
        }
        let file =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::io(&path, e))?;
        Ok(Self { path, file })
    }

    /// Append one record.
    pub fn write<T: Serialize>(&mut self, record: &T) -> Result<()> {
        let mut line = serde_json::to_string(record).expect("records serialise");
        line.push('\n');
        self.file.write_all(line.as_bytes()).and_then(|()| self.file.flush()).map_err(|e| Error::io(&self.path, e))
    }
}

/// Write `RUN/summary.json` (atomically: a temporary file renamed into place).
pub fn write_summary(run: &Path, summary: &Summary) -> Result<()> {
    let path = run.join("summary.json");
    let mut text = serde_json::to_string_pretty(summary).expect("summary serialises");
    text.push('\n');
    Ok(aerie_data::atomic::write_bytes(&path, text.as_bytes())?)
}
