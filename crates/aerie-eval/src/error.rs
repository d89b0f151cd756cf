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
    /// A chart that could not be drawn or written.
    #[error(transparent)]
    Plot(#[from] aerie_plot::Error),
    /// The drafter and the data do not belong together.
    #[error("{0}")]
    Incompatible(String),
    /// Filesystem error on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An input file (costs TOML, accept JSON, prompts) that does not parse or makes no sense.
    #[error("{path}: {message}")]
    Input {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong, precisely.
        message: String,
    },
    /// A serving engine that could not be reached or answered with an error.
    #[error("{url}: {message}")]
    Server {
        /// The request URL.
        url: String,
        /// HTTP status, when one came back.
        status: Option<u16>,
        /// What happened, with the server's own message when it sent one.
        message: String,
    },
    /// A report or plot that could not be written.
    #[error("{0}")]
    Report(String),
    /// A step of an evaluation that failed: `what` names it with the path it was about (loading
    /// the target, its tokenizer or a drafter, pairing the drafter with the target, opening or
    /// evaluating on shards), `source` says why.
    #[error("{what}")]
    Step {
        /// The step.
        what: String,
        /// The error of that step.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// Wrap `source` as the failure of the step `what`.
    pub fn step(what: impl Into<String>, source: impl Into<Error>) -> Self {
        Self::Step { what: what.into(), source: Box::new(source.into()) }
    }
}

/// An engine's error keeps its kind: a server's answer, a file, or a refused option.
impl From<aerie_engine::Error> for Error {
    fn from(e: aerie_engine::Error) -> Self {
        match e {
            aerie_engine::Error::Server { url, status, message } => Error::Server { url, status, message },
            aerie_engine::Error::Io { path, source } => Error::Io { path, source },
            other => Error::Incompatible(other.to_string()),
        }
    }
}
