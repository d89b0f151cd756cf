//! Errors of the hub crate: checkpoint errors from aerie-model, plus an export that fails its own
//! read-back check (the one failure an exporter must never hide, since engines load a wrong
//! drafter silently).

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong while exporting or inspecting a drafter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading, validating or writing a checkpoint failed (the message names the file).
    #[error(transparent)]
    Model(#[from] aerie_model::Error),
    /// The exported directory, read back, differs from what was meant to be written.
    #[error("{path}: export verification failed:\n  - {}", problems.join("\n  - "))]
    Verify {
        /// The output directory.
        path: PathBuf,
        /// Every difference found.
        problems: Vec<String>,
    },
}
