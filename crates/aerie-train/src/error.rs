//! Errors of training. Every variant names what it is about (the config file and key, the run
//! directory, the step and the samples): a training run is long and unattended, and an error that
//! does not say where to look costs a rerun.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong while configuring, running or resuming training.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the model crate (checkpoints, shapes, the TTT forward, collation: includes data
    /// captured for another target or aux layout).
    #[error(transparent)]
    Model(#[from] aerie_model::Error),
    /// From the shard reader.
    #[error(transparent)]
    Data(#[from] aerie_data::Error),
    /// A chart that could not be drawn or written.
    #[error(transparent)]
    Plot(#[from] aerie_plot::Error),
    /// Filesystem error on a named path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A config file that does not parse, names an unknown key, or has a bad value.
    #[error("{}: {message}", path.display())]
    Config {
        /// The config file (or `--set` for command-line overrides).
        path: PathBuf,
        /// The key and the problem; unknown keys come with the nearest valid one.
        message: String,
    },
    /// A drafter initialisation that cannot be done as asked (a vocab that disagrees with a
    /// warm-start drafter, a target that does not fit, ...).
    #[error("{}: {message}", path.display())]
    Init {
        /// The file or directory concerned.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A run directory that cannot be resumed: no complete checkpoint, a damaged training state,
    /// or a config that differs from the run's in keys that change the result.
    #[error("{}: cannot resume: {message}", path.display())]
    Resume {
        /// The run directory or checkpoint.
        path: PathBuf,
        /// What is wrong (differing keys are listed one per line).
        message: String,
    },
    /// A checkpoint that could not be written or read (optimizer state, training state).
    #[error("{}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The loss or the gradient norm became NaN or infinite. Training stops; the last checkpoint
    /// on disk is the last good state.
    #[error(
        "step {step}: {what} is {value} (not finite); samples of this step: {}; the last good checkpoint is {}",
        samples.join(", "),
        last_checkpoint.as_ref().map_or("none (no checkpoint was saved yet)".to_string(), |p| p.display().to_string())
    )]
    NonFinite {
        /// The optimizer step (1-based) being computed.
        step: u64,
        /// `loss` or `grad_norm`.
        what: &'static str,
        /// The offending value.
        value: f64,
        /// The samples of the micro-batch (for the loss) or of the whole step (for the gradient
        /// norm): `DATASET#INDEX` plus the capture's sample id when the shards carry them.
        samples: Vec<String>,
        /// The newest complete checkpoint of the run, if any.
        last_checkpoint: Option<PathBuf>,
    },
    /// The all-reduce that sums the replicas' gradients failed (see [`crate::collective`]).
    #[error("step {step}: summing the replicas' gradients ({via} all-reduce) failed: {message}")]
    Collective {
        /// The optimizer step (1-based) being computed.
        step: u64,
        /// The all-reduce (`host`, `nccl`).
        via: &'static str,
        /// What failed.
        message: String,
    },
    /// Options that do not make sense together (devices, precision).
    #[error("{0}")]
    Options(String),
    /// A run's `metrics.jsonl` or TensorBoard event file that cannot be read (`aerie plot`, a
    /// resume), or curves that cannot be drawn from it.
    #[error("{}: {message}", path.display())]
    Metrics {
        /// The file (or the run directory).
        path: PathBuf,
        /// What is wrong, and where in the file.
        message: String,
    },
}

impl Error {
    /// Attach a path to an I/O error.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    /// A config error on `path`.
    pub fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Config { path: path.into(), message: message.into() }
    }
}
