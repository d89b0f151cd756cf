//! What a run reports: `metrics.jsonl` (one JSON object per line, `kind` `train` or `eval`), the
//! same numbers as TensorBoard scalars ([`events`]), `summary.json` at the end, and the
//! [`Event`]s a caller (the CLI's progress bar) observes. Field names and scalar tags are a stable
//! interface. [`read`] is the one reader of `metrics.jsonl`; [`curves`] draws it.

pub mod curves;
pub mod events;

use std::io::Write;
use std::path::{Path, PathBuf};

use aerie_model::TttMetrics;
use serde::{Deserialize, Serialize};

use crate::select::{SelectRecord, Selection};
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
    /// Mean L2-SP penalty λ/2·Σ‖θ − θ₀‖² (`optim.anchor_weight`), absent when the run is not
    /// anchored; `loss` does not include it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_penalty: Option<f64>,
    /// Mean share of the pm positions that were cycle starts of the replay walk
    /// (`optim.replay_weight`), absent without replay; `loss` includes the replay term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_starts: Option<f64>,
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
    /// The drafter chosen by decoded τ (`RUN/best/`), when the run has `[select]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<Selection>,
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
    /// A `select` line was written (the drafter's decoded τ; `best/` replaced when it is the
    /// best so far).
    Select(&'a SelectRecord),
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

/// A line of `metrics.jsonl`, and the TensorBoard scalars that show it.
pub trait Record: Serialize {
    /// Optimizer steps done when it was written.
    fn step(&self) -> u64;
    /// Every number of the line as `(tag, value)`, its tag the JSON path of the field: `train/`
    /// then the field (`train/loss`, `train/acc_k/0` for element 0 of `acc_k`), or `eval/`, the
    /// set's name ([`EvalRecord::set_name`]) and the field of the metrics (`eval/held-out/loss`,
    /// `eval/held-out/acc_per_step/0`, `eval/held-out/samples`).
    fn scalars(&self) -> Vec<(String, f64)>;
}

fn push_steps(out: &mut Vec<(String, f64)>, prefix: &str, values: &[f64]) {
    out.extend(values.iter().enumerate().map(|(k, &v)| (format!("{prefix}/{k}"), v)));
}

impl Record for TrainRecord {
    fn step(&self) -> u64 {
        self.step
    }

    fn scalars(&self) -> Vec<(String, f64)> {
        let mut out = vec![("train/epoch".to_string(), self.epoch as f64), ("train/loss".into(), self.loss)];
        push_steps(&mut out, "train/loss_k", &self.loss_k);
        push_steps(&mut out, "train/acc_k", &self.acc_k);
        push_steps(&mut out, "train/alpha_k", &self.alpha_k);
        out.extend([
            ("train/accept_length".into(), self.accept_length),
            ("train/lr".into(), self.lr),
            ("train/grad_norm".into(), self.grad_norm),
            ("train/tokens_per_s".into(), self.tokens_per_s),
            ("train/padded_tokens_per_s".into(), self.padded_tokens_per_s),
            ("train/tokens".into(), self.tokens),
            ("train/elapsed_s".into(), self.elapsed_s),
        ]);
        out.extend(self.anchor_penalty.map(|p| ("train/anchor_penalty".to_string(), p)));
        out.extend(self.replay_starts.map(|p| ("train/replay_starts".to_string(), p)));
        out
    }
}

impl Record for SelectRecord {
    fn step(&self) -> u64 {
        self.step
    }

    fn scalars(&self) -> Vec<(String, f64)> {
        vec![
            ("select/tau".into(), self.decoded.tau),
            ("select/best_tau".into(), self.best_tau),
            ("select/seconds".into(), self.decoded.seconds),
        ]
    }
}

impl EvalRecord {
    /// The set as a tag component: `held-out`, or the eval directory's last path component (a
    /// full path would put slashes, which TensorBoard reads as groups, into the tag).
    pub fn set_name(&self) -> String {
        Path::new(&self.set).file_name().map_or_else(|| self.set.clone(), |n| n.to_string_lossy().into_owned())
    }
}

impl Record for EvalRecord {
    fn step(&self) -> u64 {
        self.step
    }

    fn scalars(&self) -> Vec<(String, f64)> {
        let p = format!("eval/{}", self.set_name());
        let m = &self.metrics;
        let mut out = vec![(format!("{p}/samples"), self.samples as f64), (format!("{p}/loss"), m.loss)];
        push_steps(&mut out, &format!("{p}/loss_per_step"), &m.loss_per_step);
        push_steps(&mut out, &format!("{p}/acc_per_step"), &m.acc_per_step);
        push_steps(&mut out, &format!("{p}/accept_rate_per_step"), &m.accept_rate_per_step);
        out.extend([
            (format!("{p}/simulated_accept_length"), m.simulated_accept_length),
            (format!("{p}/tokens"), m.tokens),
            (format!("{p}/positions"), m.positions),
        ]);
        out
    }
}

/// The lines of a run's `metrics.jsonl`, by kind, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// `kind: "train"` lines.
    pub train: Vec<TrainRecord>,
    /// `kind: "eval"` lines.
    pub eval: Vec<EvalRecord>,
    /// `kind: "select"` lines (decoded τ, [`crate::select`]).
    pub select: Vec<SelectRecord>,
}

/// One parsed line.
enum Line {
    Train(TrainRecord),
    Eval(EvalRecord),
    Select(SelectRecord),
}

impl Line {
    fn parse(line: &str) -> std::result::Result<Self, String> {
        let value: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        match value.get("kind").and_then(serde_json::Value::as_str) {
            Some("train") => serde_json::from_value(value).map(Line::Train).map_err(|e| e.to_string()),
            Some("eval") => serde_json::from_value(value).map(Line::Eval).map_err(|e| e.to_string()),
            Some("select") => serde_json::from_value(value).map(Line::Select).map_err(|e| e.to_string()),
            other => Err(format!("unknown kind {other:?} (train, eval or select)")),
        }
    }

    fn event(&self, wall_time: f64) -> events::TbEvent {
        let (step, scalars) = match self {
            Line::Train(r) => (r.step, r.scalars()),
            Line::Eval(r) => (r.step, r.scalars()),
            Line::Select(r) => (r.step, r.scalars()),
        };
        tb_event(step, &scalars, wall_time)
    }
}

fn tb_event(step: u64, scalars: &[(String, f64)], wall_time: f64) -> events::TbEvent {
    events::TbEvent {
        wall_time,
        step: step as i64,
        file_version: None,
        scalars: scalars.iter().map(|(t, v)| (t.clone(), *v as f32)).collect(),
    }
}

/// Read `RUN/metrics.jsonl` (or the file itself when `run` names one). A last line without its
/// newline is a line being written and is left out; any other line that does not parse is an
/// error naming its number.
pub fn read(run: &Path) -> Result<Metrics> {
    let path = if run.is_dir() { run.join("metrics.jsonl") } else { run.to_path_buf() };
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    let mut metrics = Metrics::default();
    for (i, line) in complete.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match Line::parse(line) {
            Ok(Line::Train(r)) => metrics.train.push(r),
            Ok(Line::Eval(r)) => metrics.eval.push(r),
            Ok(Line::Select(r)) => metrics.select.push(r),
            Err(message) => return Err(Error::Metrics { path, message: format!("line {}: {message}", i + 1) }),
        }
    }
    Ok(metrics)
}

/// Appends lines to `metrics.jsonl` and the same numbers to the run's TensorBoard event file,
/// both flushed per line.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
    events: events::EventsFile,
}

impl MetricsLog {
    /// Open `RUN/metrics.jsonl` for appending, first dropping lines after `keep_until_step` (a
    /// resumed run re-does the steps after its checkpoint and must not log them twice), and
    /// rewrite the event file from the lines kept: their wall times come from the old event file
    /// where it has the step, else are now (a run begun before aerie wrote event files).
    pub fn open(run: &Path, keep_until_step: u64) -> Result<Self> {
        let path = run.join("metrics.jsonl");
        let mut kept_events = Vec::new();
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
            let wall_times = old_wall_times(run);
            let now = events::now();
            kept_events = kept
                .iter()
                .filter_map(|line| Line::parse(line).ok())
                .map(|line| {
                    let step = match &line {
                        Line::Train(r) => r.step,
                        Line::Eval(r) => r.step,
                        Line::Select(r) => r.step,
                    };
                    line.event(wall_times.get(&(step as i64)).copied().unwrap_or(now))
                })
                .collect();
        }
        let events = events::EventsFile::create(run, &kept_events)?;
        // Never through a link planted at `metrics.jsonl` (docs/reliability.md).
        let file = aerie_data::atomic::no_follow(std::fs::OpenOptions::new().create(true).append(true))
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Ok(Self { path, file, events })
    }

    /// Append one record to both files.
    pub fn write<T: Record>(&mut self, record: &T) -> Result<()> {
        let mut line = serde_json::to_string(record).expect("records serialise");
        line.push('\n');
        self.file.write_all(line.as_bytes()).and_then(|()| self.file.flush()).map_err(|e| Error::io(&self.path, e))?;
        self.events.append(&tb_event(record.step(), &record.scalars(), events::now()))
    }
}

/// Wall time per step in the run's existing event file. An unreadable one only costs the old
/// wall times (the numbers come from `metrics.jsonl`), so it reads as empty.
fn old_wall_times(run: &Path) -> std::collections::BTreeMap<i64, f64> {
    let files = events::files(run).unwrap_or_default();
    let events = files.first().and_then(|f| events::read(f).ok()).unwrap_or_default();
    events.into_iter().filter(|e| e.file_version.is_none()).map(|e| (e.step, e.wall_time)).collect()
}

/// Write `RUN/summary.json` (atomically: a temporary file renamed into place).
pub fn write_summary(run: &Path, summary: &Summary) -> Result<()> {
    let path = run.join("summary.json");
    let mut text = serde_json::to_string_pretty(summary).expect("summary serialises");
    text.push('\n');
    Ok(aerie_data::atomic::write_bytes(&path, text.as_bytes())?)
}
