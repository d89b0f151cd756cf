//! JSON Lines: one conversation record per line (blank lines skipped). A last line without its
//! newline that ends mid-JSON is reported as [`Event::Truncated`] (a cut file); any other bad
//! line is [`Event::Malformed`] and reading goes on.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::record::parse_record;
use super::{Event, Source};
use crate::{Error, Result};

/// Streams the lines of a JSONL file.
pub(crate) struct JsonlSource {
    path: PathBuf,
    reader: BufReader<File>,
    pos: u64,
    len: u64,
    line_no: u64,
    index: u64,
    line: Vec<u8>,
}

impl JsonlSource {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(Self {
            path: path.to_owned(),
            reader: BufReader::with_capacity(1 << 20, file),
            pos: 0,
            len,
            line_no: 0,
            index: 0,
            line: Vec::new(),
        })
    }
}

impl Source for JsonlSource {
    fn next_event(&mut self) -> Result<Option<Event>> {
        loop {
            self.line.clear();
            let start = self.pos;
            // At most one byte past the limit: a line without end (`/dev/zero`) is an error, not
            // a buffer growing until the machine kills the process.
            let cap = crate::limits::MAX_RECORD_BYTES;
            let n = (&mut self.reader)
                .take(cap + 1)
                .read_until(b'\n', &mut self.line)
                .map_err(|e| Error::io(&self.path, e))?;
            if n == 0 {
                return Ok(None);
            }
            if n as u64 > cap && !self.line.ends_with(b"\n") {
                return Err(Error::Input {
                    path: self.path.clone(),
                    at: format!("line {} (byte {start})", self.line_no + 1),
                    message: format!(
                        "the line is longer than the limit of {cap} bytes ({})",
                        crate::limits::WHY_RECORD
                    ),
                });
            }
            self.pos += n as u64;
            self.line_no += 1;
            let complete = self.line.ends_with(b"\n");
            let mut bytes = &self.line[..];
            if bytes.starts_with(b"\xEF\xBB\xBF") && start == 0 {
                bytes = &bytes[3..];
            }
            if bytes.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let index = self.index;
            self.index += 1;
            return Ok(Some(match parse_record(bytes, index) {
                Ok(rec) => Event::Record(rec),
                Err(e) if !complete && e.is_eof() => Event::Truncated {
                    byte_offset: start,
                    message: format!("the file ends inside line {} (record #{index}; truncated)", self.line_no),
                },
                Err(e) => Event::Malformed {
                    at: format!("line {} (byte {start}, record #{index})", self.line_no),
                    message: e.to_string(),
                },
            }));
        }
    }

    fn progress(&self) -> (u64, u64) {
        (self.pos, self.len)
    }
}
