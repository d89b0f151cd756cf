//! Errors of the data crate. Every variant names the file (and, for shard contents, the tensor)
//! it is about: a capture dataset is written by one program and read by another, often days
//! apart, and "invalid shard" without a file name is useless to whoever has to repair it.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong while writing, opening or verifying a shard dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Filesystem error on a named path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A `format` string this reader does not understand (another major version, or not an
    /// aerie shard at all). Readers must refuse rather than guess.
    #[error("{}: unsupported format `{found}` (this build reads {expected})", path.display())]
    UnsupportedFormat {
        /// The manifest or shard.
        path: PathBuf,
        /// The format string found.
        found: String,
        /// The format this build reads and writes.
        expected: &'static str,
    },
    /// `manifest.json` that does not parse or contradicts itself.
    #[error("{}: {message}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Metadata that is missing a key or has a malformed value.
    #[error("{}: {source}", path.display())]
    Metadata {
        /// The manifest, shard, or (for metadata handed to a writer) the dataset directory.
        path: PathBuf,
        /// The key and the problem.
        source: MetadataError,
    },
    /// A shard whose metadata disagrees with the dataset's (the manifest's), or a writer resumed
    /// with metadata that disagrees with the dataset on disk.
    #[error("{}: metadata disagrees with {}:\n  - {}", path.display(), reference.display(), differences.join("\n  - "))]
    MetadataMismatch {
        /// The shard (or directory) whose metadata differs.
        path: PathBuf,
        /// What it was compared with.
        reference: PathBuf,
        /// One line per differing key: `key: this vs reference`.
        differences: Vec<String>,
    },
    /// A file that the safetensors parser rejects.
    #[error("{}: not a readable safetensors file: {message}", path.display())]
    Safetensors {
        /// The shard file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A tensor in a shard with a wrong dtype, shape or content, or missing altogether.
    #[error("{}: {tensor}: {message}", path.display())]
    Tensor {
        /// The shard file.
        path: PathBuf,
        /// The tensor name (`aux_hidden`, `sample_offsets`, ...).
        tensor: String,
        /// What is wrong, with the numbers involved.
        message: String,
    },
    /// A shard whose bytes do not hash to the sha256 its manifest entry records.
    #[error("{}: sha256 is {found}, manifest.json records {expected}", path.display())]
    Checksum {
        /// The shard file.
        path: PathBuf,
        /// The manifest's digest.
        expected: String,
        /// The file's digest.
        found: String,
    },
    /// The same source sample id twice in one dataset.
    #[error("{}: sample id {id} appears twice (also in {})", path.display(), first.display())]
    DuplicateSampleId {
        /// The shard (or, for a writer, the dataset directory) holding the second copy.
        path: PathBuf,
        /// Where the first copy is.
        first: PathBuf,
        /// The repeated id.
        id: i64,
    },
    /// A sample handed to [`crate::shard::ShardWriter::push`] that does not fit the dataset.
    /// Nothing of it has been written.
    #[error("sample #{index}{}: {message}", sample_id.map(|id| format!(" (id {id})")).unwrap_or_default())]
    Sample {
        /// Position the sample would have had in the dataset.
        index: u64,
        /// Its source id, when given.
        sample_id: Option<i64>,
        /// What is wrong.
        message: String,
    },
    /// [`crate::shard::ShardWriter::create`] on a directory that already holds a dataset.
    #[error("{}: already holds a shard dataset (resume it, or choose an empty directory)", path.display())]
    AlreadyExists {
        /// The directory.
        path: PathBuf,
    },
    /// Another process holds the output's lock ([`crate::lock`]).
    #[error(
        "{}: another process{} is writing this output (it holds {}); wait for it to end, or choose another output",
        path.display(),
        holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
        lock.display()
    )]
    Locked {
        /// The output: a dataset or run directory, or an output file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The holder's pid, when it wrote one and is alive.
        holder: Option<u32>,
    },
    /// An existing file or directory that a command would replace but aerie did not write, or
    /// an output that is an input of the same run ([`crate::owned`]).
    #[error("{}: {message}", path.display())]
    NotOurs {
        /// The output refused.
        path: PathBuf,
        /// What is there and what to do.
        message: String,
    },
    /// A size or count (from a flag or a file) past what aerie can hold ([`crate::limits`]).
    #[error("{what} = {value} is past the limit of {limit}: {why}")]
    Limit {
        /// The flag, key or field, with its file when it came from one.
        what: String,
        /// The value given.
        value: u128,
        /// The largest value accepted.
        limit: u64,
        /// Why the limit is what it is.
        why: &'static str,
    },
    /// Writer options that cannot work.
    #[error("invalid shard writer options: {0}")]
    Options(String),
    /// A caller buffer of the wrong length handed to a decode helper.
    #[error("{what}: buffer holds {found} values, {expected} needed")]
    BufferLength {
        /// The data being decoded.
        what: &'static str,
        /// Values needed.
        expected: usize,
        /// Values the buffer holds.
        found: usize,
    },
    /// Chat data (ShareGPT JSON, JSONL, parquet) that cannot be read, at a named place.
    #[error("{}: {at}: {message}", path.display())]
    Input {
        /// The input file.
        path: PathBuf,
        /// Where in it: `byte 1234 (record #17)`, `line 8`, `row 42`.
        at: String,
        /// What is wrong.
        message: String,
    },
    /// A chat template that does not compile, or fails to render a conversation.
    #[error("chat template `{template}`: {message}")]
    Template {
        /// The template's name (`chatml`, `tokenizer_config.json`, a file path).
        template: String,
        /// The engine's message, or the template's own `raise_exception` text.
        message: String,
    },
    /// A chat template that ran past the budget of one render ([`crate::template::RENDER_FUEL`]):
    /// the template's fault, whatever the conversation, so a command stops at the first.
    #[error("chat template `{template}`: {message}")]
    TemplateBudget {
        /// The template's name.
        template: String,
        /// What ran out, and what to do.
        message: String,
    },
    /// A model's `config.json` that does not give what is asked of it.
    #[error("{}: {message}", path.display())]
    Config {
        /// The `config.json`.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tokenizer directory whose files are missing or unreadable.
    #[error("{}: {message}", path.display())]
    Tokenizer {
        /// The tokenizer file or directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A parquet file that cannot be written or read back (prepared datasets, parquet inputs).
    #[error("{}: {message}", path.display())]
    Parquet {
        /// The parquet file.
        path: PathBuf,
        /// The library's message, or the schema problem.
        message: String,
    },
    /// A draft vocabulary (`d2t`/`t2d`) that cannot be built, or an existing one that breaks
    /// the invariants of eagle3.md §4.
    #[error("{}: {message}", path.display())]
    Vocab {
        /// The prepared dataset, drafter or vocab file concerned.
        path: PathBuf,
        /// What is wrong, with the numbers involved.
        message: String,
    },
    /// Options of a data-preparation or vocabulary step that cannot work.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// Samples that do not fit the batch asked of them (another aux width, a missing teacher):
    /// data captured for another target or layout, named precisely since it is otherwise silent.
    #[error("{0}")]
    Incompatible(String),
}

impl Error {
    /// Attach a path to an I/O error.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    pub(crate) fn tensor(path: impl Into<PathBuf>, tensor: &str, message: impl Into<String>) -> Self {
        Self::Tensor { path: path.into(), tensor: tensor.into(), message: message.into() }
    }

    pub(crate) fn manifest(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Manifest { path: path.into(), message: message.into() }
    }
}

/// A metadata key that is missing or malformed. Kept apart from [`Error`] so that metadata can
/// be parsed from a plain string map (serde, Python-written shards) before a path is known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata `{key}`: {message}")]
pub struct MetadataError {
    /// The metadata key.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

impl MetadataError {
    pub(crate) fn new(key: &str, message: impl Into<String>) -> Self {
        Self { key: key.into(), message: message.into() }
    }
}
