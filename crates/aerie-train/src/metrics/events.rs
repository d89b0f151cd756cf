//! TensorBoard event files: `tensorboard --logdir runs/` shows what `metrics.jsonl` holds.
//!
//! The format is TensorFlow's: a file named `events.out.tfevents.*` of TFRecords (`u64` length,
//! masked CRC-32C of the length, the data, masked CRC-32C of the data; all little-endian), each
//! record one `Event` protobuf (`tensorflow/core/util/event.proto`). The first event carries
//! `file_version = "brain.Event:2"`; every later one a `Summary` of `simple_value` scalars at a
//! step, which is what `torch.utils.tensorboard` writes for `add_scalar` and what TensorBoard's
//! scalar dashboard reads. Only the four messages needed are encoded here, by hand (the encoding
//! is a few varints and length prefixes), rather than through a protobuf code generator.
//!
//! The file is a view of `metrics.jsonl`: when a run resumes, [`EventsFile::create`] rewrites it
//! from the lines the run keeps, so both files always show the same steps.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Event files of aerie are named `events.out.tfevents.<unix seconds>.aerie`: TensorBoard finds
/// files by the `tfevents` in their name, and the suffix tells aerie's own from any other writer's.
pub const PREFIX: &str = "events.out.tfevents.";
const SUFFIX: &str = ".aerie";
const FILE_VERSION: &str = "brain.Event:2";
const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// One event, as written or read back.
#[derive(Debug, Clone, PartialEq)]
pub struct TbEvent {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// The optimizer step.
    pub step: i64,
    /// The header event's `brain.Event:2`.
    pub file_version: Option<String>,
    /// `(tag, simple_value)` pairs: scalars are single precision in TensorBoard.
    pub scalars: Vec<(String, f32)>,
}

/// TFRecord's masked CRC-32C: the rotation and offset keep a CRC of data holding CRCs sane.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = CRC32C.checksum(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn put_bytes(buf: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(buf, (field << 3) | 2);
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// The protobuf bytes of `event` (fields: wall_time 1, step 2, file_version 3, summary 5;
/// Summary.value 1; Value.tag 1, Value.simple_value 2).
fn encode(event: &TbEvent) -> Vec<u8> {
    let mut buf = Vec::new();
    put_varint(&mut buf, (1 << 3) | 1);
    buf.extend_from_slice(&event.wall_time.to_le_bytes());
    put_varint(&mut buf, 2 << 3);
    put_varint(&mut buf, event.step as u64);
    if let Some(v) = &event.file_version {
        put_bytes(&mut buf, 3, v.as_bytes());
    }
    if !event.scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, value) in &event.scalars {
            let mut v = Vec::new();
            put_bytes(&mut v, 1, tag.as_bytes());
            put_varint(&mut v, (2 << 3) | 5);
            v.extend_from_slice(&value.to_le_bytes());
            put_bytes(&mut summary, 1, &v);
        }
        put_bytes(&mut buf, 5, &summary);
    }
    buf
}

/// One TFRecord around `data`.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// A protobuf field value: the wire types these messages use.
enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// The `(field number, value)` pairs of a protobuf message, or what is wrong with it.
fn fields(mut b: &[u8]) -> std::result::Result<Vec<(u64, Field<'_>)>, String> {
    fn varint(b: &mut &[u8]) -> std::result::Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first().ok_or("truncated varint")?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }
    fn take<'a>(b: &mut &'a [u8], n: usize) -> std::result::Result<&'a [u8], String> {
        if b.len() < n {
            return Err(format!("field of {n} bytes past the end of its message"));
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let value = match key & 7 {
            0 => Field::Varint(varint(&mut b)?),
            1 => Field::Fixed64(take(&mut b, 8)?.try_into().expect("8 bytes")),
            2 => {
                let n = varint(&mut b)? as usize;
                Field::Bytes(take(&mut b, n)?)
            }
            5 => Field::Fixed32(take(&mut b, 4)?.try_into().expect("4 bytes")),
            w => return Err(format!("wire type {w} of field {}", key >> 3)),
        };
        out.push((key >> 3, value));
    }
    Ok(out)
}

fn decode(data: &[u8]) -> std::result::Result<TbEvent, String> {
    let mut event = TbEvent { wall_time: 0.0, step: 0, file_version: None, scalars: Vec::new() };
    for (field, value) in fields(data)? {
        match (field, value) {
            (1, Field::Fixed64(v)) => event.wall_time = f64::from_le_bytes(v),
            (2, Field::Varint(v)) => event.step = v as i64,
            (3, Field::Bytes(v)) => event.file_version = Some(String::from_utf8_lossy(v).into_owned()),
            (5, Field::Bytes(summary)) => {
                for (f, value) in fields(summary)? {
                    let (1, Field::Bytes(value)) = (f, value) else { continue };
                    let (mut tag, mut simple) = (String::new(), None);
                    for pair in fields(value)? {
                        match pair {
                            (1, Field::Bytes(t)) => tag = String::from_utf8_lossy(t).into_owned(),
                            (2, Field::Fixed32(v)) => simple = Some(f32::from_le_bytes(v)),
                            _ => {}
                        }
                    }
                    if let Some(v) = simple {
                        event.scalars.push((tag, v));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(event)
}

/// Read every event of an event file, checking both CRCs of each record. A last record cut
/// short (a writer killed mid-record) ends the file, as it does for TensorBoard's reader; a
/// complete record that fails its checksum is an error.
pub fn read(path: &Path) -> Result<Vec<TbEvent>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |at: usize, message: String| Error::Metrics {
        path: path.to_path_buf(),
        message: format!("event record at byte {at}: {message}"),
    };
    let mut events = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= 12 {
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
        if masked_crc(len_bytes) != len_crc {
            return Err(bad(at, "length checksum mismatch".into()));
        }
        let Some(end) = (at + 12).checked_add(len).and_then(|e| e.checked_add(4)).filter(|&e| e <= bytes.len()) else {
            break;
        };
        let data = &bytes[at + 12..end - 4];
        if masked_crc(data) != u32::from_le_bytes(bytes[end - 4..end].try_into().expect("4 bytes")) {
            return Err(bad(at, "data checksum mismatch".into()));
        }
        events.push(decode(data).map_err(|m| bad(at, m))?);
        at = end;
    }
    Ok(events)
}

/// aerie's event files in `run`, oldest name first.
pub fn files(run: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(run) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(run, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(run, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(PREFIX) && name.ends_with(SUFFIX) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Seconds since the Unix epoch, as event wall times are.
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The run's event file, open for appending.
#[derive(Debug)]
pub struct EventsFile {
    path: PathBuf,
    file: std::fs::File,
}

impl EventsFile {
    /// Write `RUN`'s event file afresh (atomically) with the header and `events`, then open it
    /// for appending. An existing aerie event file keeps its name, so TensorBoard sees one file
    /// per run; other aerie event files in `run` are removed (they would draw every curve twice).
    pub fn create(run: &Path, events: &[TbEvent]) -> Result<Self> {
        let existing = files(run)?;
        let path = match existing.first() {
            Some(p) => p.clone(),
            None => run.join(format!("{PREFIX}{}{SUFFIX}", now() as u64)),
        };
        let header = TbEvent { wall_time: now(), step: 0, file_version: Some(FILE_VERSION.into()), scalars: vec![] };
        let mut bytes = frame(&encode(&header));
        for e in events {
            bytes.extend_from_slice(&frame(&encode(e)));
        }
        aerie_data::atomic::write_bytes(&path, &bytes)?;
        for other in existing.iter().skip(1) {
            std::fs::remove_file(other).map_err(|e| Error::io(other, e))?;
        }
        let file = aerie_data::atomic::no_follow(std::fs::OpenOptions::new().append(true))
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Ok(Self { path, file })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one event (one record, written with one call and flushed).
    pub fn append(&mut self, event: &TbEvent) -> Result<()> {
        let bytes = frame(&encode(event));
        self.file.write_all(&bytes).and_then(|()| self.file.flush()).map_err(|e| Error::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRC-32C check value of the catalogue ("123456789" → 0xE3069283), and TFRecord's mask
    /// as TensorFlow's `crc32c::Mask` computes it.
    #[test]
    fn masked_crc32c_is_tensorflows() {
        assert_eq!(CRC32C.checksum(b"123456789"), 0xe306_9283);
        // ((crc >> 15) | (crc << 17)) + 0xa282ead8, computed by hand.
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn events_round_trip_and_a_cut_record_ends_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = TbEvent {
            wall_time: 1.5e9,
            step: 300,
            file_version: None,
            scalars: vec![("train/loss".into(), 2.5), ("eval/held-out/loss".into(), -0.125)],
        };
        let mut f = EventsFile::create(dir.path(), std::slice::from_ref(&e)).unwrap();
        f.append(&TbEvent { step: 301, ..e.clone() }).unwrap();
        let path = f.path().to_path_buf();
        let back = read(&path).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[0].file_version.as_deref(), Some(FILE_VERSION));
        assert_eq!(back[1], e);
        assert_eq!(back[2].step, 301);
        // A kill mid-record: the complete records stay readable.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        assert_eq!(read(&path).unwrap().len(), 2);
        // A flipped bit inside a complete record is refused.
        let mut bad = bytes.clone();
        bad[bytes.len() - 10] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("data checksum mismatch"), "{err}");
    }

    /// A second `create` keeps the first file's name and removes any other aerie event file.
    #[test]
    fn create_rewrites_the_one_file_of_a_run() {
        let dir = tempfile::tempdir().unwrap();
        let first = EventsFile::create(dir.path(), &[]).unwrap().path().to_path_buf();
        let stray = dir.path().join(format!("{PREFIX}9999999999{SUFFIX}"));
        std::fs::copy(&first, &stray).unwrap();
        let other = dir.path().join(format!("{PREFIX}1.somehost"));
        std::fs::write(&other, b"").unwrap();
        let again = EventsFile::create(dir.path(), &[]).unwrap();
        assert_eq!(again.path(), first);
        assert!(!stray.exists());
        assert!(other.exists(), "another writer's file is not aerie's to remove");
        assert_eq!(files(dir.path()).unwrap(), vec![first]);
    }
}
