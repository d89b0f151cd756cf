//! Errors of a capture, naming the input, output and problem.

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the target model.
    #[error(transparent)]
    Model(#[from] aerie_model::Error),
    /// From the prepared-data reader or the shard writer.
    #[error(transparent)]
    Data(#[from] aerie_data::Error),
    /// Options that cannot work with this target or data.
    #[error("{0}")]
    Invalid(String),
    /// A serving engine refused or failed a request (the message names the request).
    #[error("{0}")]
    Server(String),
}
