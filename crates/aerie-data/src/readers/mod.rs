//! Readers of chat datasets, all streaming (memory stays flat whatever the input size):
//!
//! - **ShareGPT JSON**: one JSON array of records ([`InputFormat::JsonArray`]), split element by
//!   element; a file cut mid-record yields every complete record before the cut.
//! - **JSONL**: one record per line ([`InputFormat::Jsonl`]).
//! - **Parquet**: the Hugging Face `datasets` layout ([`InputFormat::Parquet`]), a file or a
//!   directory of files.
//!
//! JSON records hold a `conversations` or `messages` list of `{from, value}` or
//! `{role, content}` turns, or MT-Bench's prompt-only `turns` (user turns); see `record.rs`. Readers yield [`RawConversation`]s exactly as
//! found; [`crate::conversation::normalize`] applies the training rules.
//!
//! Bad input is handled by one policy. A malformed record (not a conversation) is skipped and
//! counted; a truncated file ends the stream after the last complete record. Both are noted in
//! [`ReadReport`] with the byte offset or line. With [`ReadOptions::strict`] either is an
//! [`Error::Input`] instead.

mod json_array;
mod jsonl;
mod parquet;
mod record;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::conversation::RawConversation;
use crate::{Error, Result};

/// At most this many warnings are kept verbatim in a [`ReadReport`]; the rest are counted.
pub const MAX_WARNINGS: usize = 20;

/// The layout of an input file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// Decide from the path: a directory or `.parquet` is parquet, `.jsonl` is JSONL, otherwise
    /// the first non-blank byte decides (`[` a JSON array, `{` JSONL).
    #[default]
    Auto,
    /// A JSON array of records (ShareGPT).
    JsonArray,
    /// One JSON record per line.
    Jsonl,
    /// Parquet, HF `datasets` layout.
    Parquet,
}

impl std::str::FromStr for InputFormat {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => Self::Auto,
            "json" | "sharegpt" | "json-array" => Self::JsonArray,
            "jsonl" => Self::Jsonl,
            "parquet" => Self::Parquet,
            _ => {
                return Err(Error::InvalidOption(format!("unknown input format `{s}` (auto, json, jsonl, parquet)")));
            }
        })
    }
}

/// Options of [`ConversationReader::open`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadOptions {
    /// The input's layout.
    pub format: InputFormat,
    /// Fail on the first malformed record or truncation instead of skipping it with a warning.
    pub strict: bool,
}

/// Where a truncated input was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    /// Offset of the first byte that could not be used (start of the incomplete record).
    pub byte_offset: u64,
    /// Complete records before the cut (including malformed ones).
    pub complete_records: u64,
    /// What was found.
    pub message: String,
}

/// What a reader met besides good records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReport {
    /// The input.
    pub path: PathBuf,
    /// The layout it was read as.
    pub format: InputFormat,
    /// Records yielded.
    pub records: u64,
    /// Records skipped as malformed.
    pub malformed: u64,
    /// Set when the input ends mid-record (or cannot be read past some point).
    pub truncated: Option<Truncation>,
    /// Human-readable warnings, at most [`MAX_WARNINGS`].
    pub warnings: Vec<String>,
    /// Warnings beyond [`MAX_WARNINGS`], counted only.
    pub warnings_omitted: u64,
}

impl ReadReport {
    fn warn(&mut self, message: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(message);
        } else {
            self.warnings_omitted += 1;
        }
    }
}

/// What a format-specific source found next.
pub(crate) enum Event {
    /// A complete record.
    Record(RawConversation),
    /// A complete but unusable record.
    Malformed { at: String, message: String },
    /// The input ends (or becomes unreadable) mid-record; nothing follows.
    Truncated { byte_offset: u64, message: String },
    /// Bytes after the end of the data, ignored.
    Trailing { byte_offset: u64, message: String },
}

/// A format-specific stream of events.
pub(crate) trait Source {
    /// The next event; `None` at the end.
    fn next_event(&mut self) -> Result<Option<Event>>;
    /// (done, total) in the source's unit (bytes for JSON, rows for parquet).
    fn progress(&self) -> (u64, u64);
}

/// Unit of [`ConversationReader::progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressUnit {
    /// Bytes of a JSON or JSONL file.
    Bytes,
    /// Rows of a parquet dataset.
    Rows,
}

/// A stream of [`RawConversation`]s from any supported input.
pub struct ConversationReader {
    source: Box<dyn Source + Send>,
    report: ReadReport,
    strict: bool,
    unit: ProgressUnit,
    failed: bool,
}

impl std::fmt::Debug for ConversationReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConversationReader").field("report", &self.report).finish_non_exhaustive()
    }
}

/// Resolve [`InputFormat::Auto`] for `path`.
pub fn detect_format(path: &Path) -> Result<InputFormat> {
    if path.is_dir() {
        return Ok(InputFormat::Parquet);
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("parquet") => return Ok(InputFormat::Parquet),
        Some("jsonl") => return Ok(InputFormat::Jsonl),
        _ => {}
    }
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut head = [0u8; 4096];
    let n = file.read(&mut head).map_err(|e| Error::io(path, e))?;
    let head = head[..n].strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&head[..n]);
    match head.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => Ok(InputFormat::JsonArray),
        Some(b'{') => Ok(InputFormat::Jsonl),
        _ if head.starts_with(b"PAR1") => Ok(InputFormat::Parquet),
        _ => Err(Error::Input {
            path: path.to_owned(),
            at: "byte 0".into(),
            message: "cannot tell the format: not a JSON array (`[`), JSONL (`{`) or parquet; \
                      pass the format explicitly"
                .into(),
        }),
    }
}

impl ConversationReader {
    /// Open `path` with `opts`.
    pub fn open(path: &Path, opts: &ReadOptions) -> Result<Self> {
        let format = match opts.format {
            InputFormat::Auto => detect_format(path)?,
            f => f,
        };
        let (source, unit): (Box<dyn Source + Send>, _) = match format {
            InputFormat::JsonArray => (Box::new(json_array::JsonArraySource::open(path)?), ProgressUnit::Bytes),
            InputFormat::Jsonl => (Box::new(jsonl::JsonlSource::open(path)?), ProgressUnit::Bytes),
            InputFormat::Parquet | InputFormat::Auto => {
                (Box::new(parquet::ParquetSource::open(path)?), ProgressUnit::Rows)
            }
        };
        Ok(Self {
            source,
            report: ReadReport { path: path.to_owned(), format, ..ReadReport::default() },
            strict: opts.strict,
            unit,
            failed: false,
        })
    }

    /// What was met so far; complete once the iterator is exhausted.
    pub fn report(&self) -> &ReadReport {
        &self.report
    }

    /// Consume the reader, returning its report.
    pub fn into_report(self) -> ReadReport {
        self.report
    }

    /// Progress as (done, total, unit).
    pub fn progress(&self) -> (u64, u64, ProgressUnit) {
        let (done, total) = self.source.progress();
        (done, total, self.unit)
    }

    fn input_error(&self, at: String, message: String) -> Error {
        Error::Input { path: self.report.path.clone(), at, message }
    }

    fn step(&mut self) -> Result<Option<RawConversation>> {
        loop {
            let Some(event) = self.source.next_event()? else {
                return Ok(None);
            };
            match event {
                Event::Record(rec) => {
                    self.report.records += 1;
                    return Ok(Some(rec));
                }
                Event::Malformed { at, message } => {
                    if self.strict {
                        return Err(self.input_error(at, format!("malformed record: {message}")));
                    }
                    self.report.malformed += 1;
                    self.report.warn(format!("{at}: malformed record skipped: {message}"));
                }
                Event::Truncated { byte_offset, message } => {
                    let complete = self.report.records + self.report.malformed;
                    let at = format!("byte {byte_offset}");
                    if self.strict {
                        return Err(self.input_error(at, format!("{message}; {complete} complete records precede it")));
                    }
                    self.report.warn(format!(
                        "{}: {at}: {message}; keeping the {complete} complete records before it",
                        self.report.path.display()
                    ));
                    self.report.truncated = Some(Truncation { byte_offset, complete_records: complete, message });
                }
                Event::Trailing { byte_offset, message } => {
                    let at = format!("byte {byte_offset}");
                    if self.strict {
                        return Err(self.input_error(at, message));
                    }
                    self.report.warn(format!("{}: {at}: {message}", self.report.path.display()));
                }
            }
        }
    }
}

impl Iterator for ConversationReader {
    type Item = Result<RawConversation>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(r) => r.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
