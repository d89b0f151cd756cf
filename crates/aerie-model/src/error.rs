//! Errors of the model crate: every variant names the file or tensor it is about, because the
//! failures it reports (a wrong key, a bad shape) are otherwise silent in serving engines.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong while reading, validating or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the shard reader (batches are gathered from captured shards).
    #[error(transparent)]
    Data(#[from] aerie_data::Error),
    /// A drafter and the data it is run on that do not belong together (another target, aux
    /// layout or hidden size): named precisely, since it is otherwise silent.
    #[error("{0}")]
    Incompatible(String),
    /// Filesystem error on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON file that does not parse or lacks a required key.
    #[error("{path}: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A safetensors file that cannot be read.
    #[error("{path}: not a readable safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// Checkpoint contents that do not match the config (missing/unexpected keys, shapes,
    /// d2t/t2d invariants). One line per problem.
    #[error("{path}: invalid checkpoint:\n  - {}", problems.join("\n  - "))]
    Invalid {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// Every problem found, not just the first.
        problems: Vec<String>,
    },
    /// An output path that already holds something and may not be replaced.
    #[error("{path}: {message}")]
    OutputExists {
        /// The output file or directory.
        path: PathBuf,
        /// Why it was not replaced and what to do instead.
        message: String,
    },
    /// A request aerie refuses because the result would not run (or would run wrongly) where it
    /// is meant to, e.g. exporting a `norm_before_residual` drafter to SGLang.
    #[error("{path}: {message}")]
    Unsupported {
        /// The checkpoint or file concerned.
        path: PathBuf,
        /// What is unsupported and why.
        message: String,
    },
    /// Inputs to a forward pass with inconsistent shapes.
    #[error("shape error: {0}")]
    Shape(String),
    /// A tensor with a dtype this operation does not take.
    #[error("tensor `{name}`: unsupported dtype {dtype}")]
    Dtype {
        /// Tensor name.
        name: String,
        /// Its dtype.
        dtype: String,
    },
}

impl Error {
    /// Attach a path to an I/O error.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}
