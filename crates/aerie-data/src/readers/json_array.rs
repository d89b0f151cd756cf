//! ShareGPT's layout: one JSON array of conversation records, streamed element by element so
//! memory stays flat whatever the file size.
//!
//! A hand-rolled splitter finds each element's bytes (tracking strings, escapes and nesting
//! depth; it never interprets values) and serde parses one element at a time. Because the
//! splitter only needs bracket balance, a file cut mid-record (the public ShareGPT V3 file is,
//! see assets.md) still yields every complete record before the cut; the cut is reported as
//! [`Event::Truncated`] with the byte offset where the incomplete record starts.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::record::parse_record;
use super::{Event, Source};
use crate::{Error, Result};

const BUF_SIZE: usize = 1 << 20;

/// Streams the elements of a top-level JSON array.
pub(crate) struct JsonArraySource {
    path: PathBuf,
    reader: BufReader<File>,
    /// Absolute offset of the next unread byte.
    pos: u64,
    len: u64,
    /// Records (elements) completed so far, including malformed ones.
    index: u64,
    element: Vec<u8>,
    done: bool,
    /// An event found while finishing the previous record, reported after it.
    pending: Option<Event>,
}

impl JsonArraySource {
    /// Open `path` and consume everything up to the first element.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut src = Self {
            path: path.to_owned(),
            reader: BufReader::with_capacity(BUF_SIZE, file),
            pos: 0,
            len,
            index: 0,
            element: Vec::new(),
            done: false,
            pending: None,
        };
        // A UTF-8 byte-order mark is tolerated.
        if src.reader.fill_buf().map_err(|e| Error::io(path, e))?.starts_with(b"\xEF\xBB\xBF") {
            src.consume(3);
        }
        match src.skip_ws()? {
            Some(b'[') => src.consume(1),
            found => {
                return Err(Error::Input {
                    path: path.to_owned(),
                    at: format!("byte {}", src.pos),
                    message: format!("expected a JSON array of conversations (`[`), found {}", describe(found)),
                });
            }
        }
        if src.skip_ws()? == Some(b']') {
            src.consume(1);
            src.done = true;
        }
        Ok(src)
    }

    fn consume(&mut self, n: usize) {
        self.reader.consume(n);
        self.pos += n as u64;
    }

    /// Skip whitespace; the next byte (not consumed), or `None` at end of file.
    fn skip_ws(&mut self) -> Result<Option<u8>> {
        loop {
            let buf = self.reader.fill_buf().map_err(|e| Error::io(&self.path, e))?;
            if buf.is_empty() {
                return Ok(None);
            }
            match buf.iter().position(|b| !b.is_ascii_whitespace()) {
                Some(i) => {
                    let b = buf[i];
                    self.consume(i);
                    return Ok(Some(b));
                }
                None => {
                    let n = buf.len();
                    self.consume(n);
                }
            }
        }
    }

    /// Copy one JSON value into `self.element`. `false` when the file ends inside it.
    fn read_value(&mut self) -> Result<bool> {
        self.element.clear();
        let mut depth = 0usize;
        let mut in_string = false;
        let mut escape = false;
        let mut first = true;
        let mut scalar = false;
        loop {
            let buf = self.reader.fill_buf().map_err(|e| Error::io(&self.path, e))?;
            if buf.is_empty() {
                // A bare scalar may end at end of file; anything open may not.
                return Ok(scalar);
            }
            let mut end = None;
            for (i, &b) in buf.iter().enumerate() {
                if first {
                    first = false;
                    match b {
                        b'{' | b'[' => depth = 1,
                        b'"' => in_string = true,
                        _ => scalar = true,
                    }
                    continue;
                }
                if scalar {
                    if b == b',' || b == b']' || b.is_ascii_whitespace() {
                        end = Some(i);
                        break;
                    }
                } else if in_string {
                    if escape {
                        escape = false;
                    } else if b == b'\\' {
                        escape = true;
                    } else if b == b'"' {
                        in_string = false;
                        if depth == 0 {
                            end = Some(i + 1);
                            break;
                        }
                    }
                } else {
                    match b {
                        b'"' => in_string = true,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                end = Some(i + 1);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            let take = end.unwrap_or(buf.len());
            self.element.extend_from_slice(&buf[..take]);
            self.consume(take);
            if end.is_some() {
                return Ok(true);
            }
            // A value without end (a file of zeros) is an error, not a buffer growing for ever.
            let cap = crate::limits::MAX_RECORD_BYTES;
            if self.element.len() as u64 > cap {
                return Err(Error::Input {
                    path: self.path.clone(),
                    at: format!("byte {} (record #{})", self.pos - self.element.len() as u64, self.index),
                    message: format!(
                        "the record is longer than the limit of {cap} bytes ({})",
                        crate::limits::WHY_RECORD
                    ),
                });
            }
        }
    }
}

impl Source for JsonArraySource {
    fn next_event(&mut self) -> Result<Option<Event>> {
        if let Some(event) = self.pending.take() {
            return Ok(Some(event));
        }
        if self.done {
            return Ok(None);
        }
        let start = self.pos;
        if !self.read_value()? {
            self.done = true;
            return Ok(Some(Event::Truncated {
                byte_offset: start,
                message: format!(
                    "the file ends inside record #{} (truncated; {} bytes of it present)",
                    self.index,
                    self.pos - start
                ),
            }));
        }
        let index = self.index;
        self.index += 1;
        let event = match parse_record(&self.element, index) {
            Ok(rec) => Event::Record(rec),
            Err(e) => Event::Malformed { at: format!("byte {start} (record #{index})"), message: e.to_string() },
        };
        // Between elements: `,` (a trailing `,` before `]` is tolerated) or the closing `]`.
        match self.skip_ws()? {
            Some(b',') => {
                self.consume(1);
                if self.skip_ws()? == Some(b']') {
                    self.consume(1);
                    self.done = true;
                }
            }
            Some(b']') => {
                self.consume(1);
                self.done = true;
            }
            None => {
                self.done = true;
                self.pending = Some(Event::Truncated {
                    byte_offset: self.pos,
                    message: "the file ends without the array's closing `]` (truncated)".into(),
                });
            }
            Some(b) => {
                self.done = true;
                self.pending = Some(Event::Truncated {
                    byte_offset: self.pos,
                    message: format!(
                        "expected `,` or `]` after record #{index}, found {}; nothing after it \
                         can be read",
                        describe(Some(b))
                    ),
                });
            }
        }
        if self.done
            && self.pending.is_none()
            && let Some(b) = self.skip_ws()?
        {
            self.pending = Some(Event::Trailing {
                byte_offset: self.pos,
                message: format!("{} after the closing `]` ignored", describe(Some(b))),
            });
        }
        Ok(Some(event))
    }

    fn progress(&self) -> (u64, u64) {
        (self.pos, self.len)
    }
}

fn describe(b: Option<u8>) -> String {
    match b {
        None => "end of file".into(),
        Some(b) if b.is_ascii_graphic() => format!("`{}`", b as char),
        Some(b) => format!("byte 0x{b:02x}"),
    }
}
