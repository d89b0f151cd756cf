//! Errors of evaluation: the model's and the shard reader's, plus incompatibilities between a
//! drafter and the data it is evaluated on (named precisely, since they are otherwise silent).

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the model crate (checkpoints, shapes).
    #[error(transparent)]
    Model(#[from] aerie_model::Error),
    /// From the shard reader.
    #[error(transparent)]
    Data(#[from] aerie_data::Error),
    /// The drafter and the data do not belong together.
    #[error("{0}")]
    Incompatible(String),
}
