//! Errors of talking to a serving engine: the URL or file, and what happened there.

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A serving engine that could not be started, reached, or answered with an error.
    #[error("{url}: {message}")]
    Server {
        /// The request URL (or the engine's base URL).
        url: String,
        /// HTTP status, when one came back.
        status: Option<u16>,
        /// What happened, with the server's own message when it sent one.
        message: String,
    },
    /// Filesystem error on a named path (an engine's log, its record).
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An engine asked for something it does not do, or options that cannot work.
    #[error("{0}")]
    Incompatible(String),
}
