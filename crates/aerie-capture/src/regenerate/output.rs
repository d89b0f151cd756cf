//! The resumable output file protocol. Lines are appended to `OUT.partial`, each flushed and
//! fsynced, beside `OUT.partial.meta.json` (the options the partial output depends on). A rerun
//! with the same options cuts any torn last line and continues after the `source_index` of the
//! last complete one; with other options it stops and lists the differences. At the end the
//! report goes to `OUT`'s `.report.json` sibling and `OUT.partial` is renamed to `OUT`.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use aerie_data::template::ChatTemplate;
use aerie_data::tokenizer::TokenizerFiles;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{RegenerateOptions, RegenerateReport};
use crate::{Error, Result};

/// The state file's format tag.
pub const REGENERATE_FORMAT: &str = "aerie-regenerate/1";

/// `OUT.partial`: the file being appended to.
pub fn partial_path(out: &Path) -> PathBuf {
    with_suffix(out, ".partial")
}

/// `OUT.partial.meta.json`: the options of the run that owns `OUT.partial`.
pub fn meta_path(out: &Path) -> PathBuf {
    with_suffix(out, ".partial.meta.json")
}

/// The report beside `out`: `x.jsonl` → `x.report.json`.
pub fn report_path(out: &Path) -> PathBuf {
    out.with_extension("report.json")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Data(aerie_data::Error::io(path, e))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// What answers the turns, as far as it decides the output.
pub(super) enum Generator<'a> {
    /// The native target in this directory (its `config.json` digest is kept).
    Native { target_dir: &'a Path },
    /// A serving engine: its dialect and model (not its URL: the same model served elsewhere,
    /// or restarted on another port, resumes the same output).
    Server { api: &'a str, model: Option<&'a str> },
}

/// The options a partial output depends on; a resume must find the same.
pub(super) fn run_meta(
    opts: &RegenerateOptions,
    generator: Generator<'_>,
    tok: &TokenizerFiles,
    template: &ChatTemplate,
    eos: &[u32],
) -> Result<Value> {
    let data_abs = std::fs::canonicalize(&opts.data).unwrap_or_else(|_| opts.data.clone());
    let data_bytes = std::fs::metadata(&opts.data).ok().filter(|m| m.is_file()).map(|m| m.len());
    let mut meta = json!({
        "format": REGENERATE_FORMAT,
        "data": data_abs.display().to_string(),
        "data_bytes": data_bytes,
        "read": serde_json::to_value(opts.read).expect("plain options serialise"),
        "normalize": serde_json::to_value(&opts.normalize).expect("plain options serialise"),
        "target": opts.target_name,
    });
    match generator {
        Generator::Native { target_dir } => {
            let config = target_dir.join("config.json");
            meta["target_config_sha256"] = json!(sha256_hex(&std::fs::read(&config).map_err(|e| io(&config, e))?));
        }
        Generator::Server { api, model } => {
            meta["api"] = json!(api);
            meta["model"] = json!(model);
        }
    }
    let s = opts.sampling.effective();
    let rest = json!({
        "tokenizer_sha256": tok.digest,
        "template": template.name(),
        "template_sha256": sha256_hex(template.source().as_bytes()),
        "eos_token_ids": eos,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "max_new_tokens": opts.max_new_tokens,
        "max_length": opts.max_length,
        "max_turns": opts.max_turns,
    });
    let obj = meta.as_object_mut().expect("an object");
    obj.extend(rest.as_object().expect("an object").clone());
    // Only when set, so partial outputs of runs without template variables still resume.
    if !opts.template_kwargs.is_empty() {
        obj.insert("template_kwargs".into(), json!(opts.template_kwargs));
    }
    Ok(meta)
}

fn meta_differences(found: &Value, want: &Value) -> Vec<String> {
    let (Some(f), Some(w)) = (found.as_object(), want.as_object()) else {
        return vec!["not a JSON object".into()];
    };
    let mut keys: Vec<&String> = f.keys().chain(w.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| f.get(*k) != w.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or("(absent)".to_owned(), Value::to_string);
            format!("{k}: {} then, {} now", show(f.get(k)), show(w.get(k)))
        })
        .collect()
}

fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Directory fsync is best effort (some filesystems refuse it); the data files are fsynced.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// An existing `OUT.partial`: cut any incomplete last line, count the records, and return
/// (records, source index of the last one).
fn recover_partial(path: &Path) -> Result<(u64, Option<u64>)> {
    let mut file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| io(path, e))?;
    let mut reader = BufReader::new(&mut file);
    let (mut records, mut complete_len, mut pos) = (0u64, 0u64, 0u64);
    let mut last: Option<Vec<u8>> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(|e| io(path, e))?;
        if n == 0 {
            break;
        }
        pos += n as u64;
        if line.last() == Some(&b'\n') {
            records += 1;
            complete_len = pos;
            last = Some(std::mem::take(&mut line));
        }
    }
    drop(reader);
    if complete_len < pos {
        file.set_len(complete_len).map_err(|e| io(path, e))?;
        file.sync_all().map_err(|e| io(path, e))?;
    }
    let last_index = match last {
        None => None,
        Some(bytes) => {
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
                Error::Invalid(format!(
                    "{}: record {records} (the last complete line) is not JSON ({e}); delete the file \
                     to start over",
                    path.display()
                ))
            })?;
            Some(v.get("source_index").and_then(Value::as_u64).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: record {records} has no `source_index`; not written by aerie regenerate?",
                    path.display()
                ))
            })?)
        }
    };
    Ok((records, last_index))
}

/// `OUT.partial`, open for appending: either resumed (its records counted, the last one's
/// `source_index` known) or started empty with its options written beside it.
pub(super) struct PartialOutput {
    partial: PathBuf,
    meta_file: PathBuf,
    file: File,
    /// Records already in the file when this run started.
    pub resumed_records: u64,
    /// The input records up to this `source_index` are in the file already.
    pub skip_through: Option<u64>,
}

impl PartialOutput {
    /// Resume `OUT.partial` when it was made with `meta`, start over when `overwrite` allows it,
    /// or refuse (other options, or options that cannot be read).
    pub(super) fn resume_or_start(out: &Path, meta: &Value, overwrite: bool) -> Result<Self> {
        let partial = partial_path(out);
        let meta_file = meta_path(out);
        let mut resume = None;
        if partial.exists() {
            let found: Option<Value> = std::fs::read(&meta_file).ok().and_then(|b| serde_json::from_slice(&b).ok());
            match found {
                Some(f) if f == *meta => resume = Some(recover_partial(&partial)?),
                _ if overwrite => {}
                Some(f) => {
                    return Err(Error::Invalid(format!(
                        "{} was started with other options:\n  - {}\ndelete it and {} (or pass --overwrite) \
                         to start over",
                        partial.display(),
                        meta_differences(&f, meta).join("\n  - "),
                        meta_file.display()
                    )));
                }
                None => {
                    return Err(Error::Invalid(format!(
                        "{} exists but {} is missing or unreadable, so it cannot be resumed safely; delete \
                         it (or pass --overwrite) to start over",
                        partial.display(),
                        meta_file.display()
                    )));
                }
            }
        }
        let (resumed_records, skip_through) = match resume {
            Some((n, last)) => (n, last),
            None => {
                if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
                }
                aerie_data::atomic::write_bytes(
                    &meta_file,
                    serde_json::to_string_pretty(meta).expect("JSON").as_bytes(),
                )?;
                // Created new: a link planted at the name is refused, its target untouched.
                aerie_data::atomic::create_tmp(&partial)?.sync_all().map_err(|e| io(&partial, e))?;
                sync_parent(&partial)?;
                (0, None)
            }
        };
        let mut file = aerie_data::atomic::no_follow(OpenOptions::new().append(true))
            .open(&partial)
            .map_err(|e| io(&partial, e))?;
        file.seek(SeekFrom::End(0)).map_err(|e| io(&partial, e))?;
        Ok(Self { partial, meta_file, file, resumed_records, skip_through })
    }

    /// Append one record line (newline included) and make it durable before the next.
    pub(super) fn append(&mut self, line: &str) -> Result<()> {
        self.file.write_all(line.as_bytes()).map_err(|e| io(&self.partial, e))?;
        self.file.sync_data().map_err(|e| io(&self.partial, e))
    }

    /// fsync and close the file; what follows is [`ClosedOutput::publish`] or
    /// [`ClosedOutput::abandon`].
    pub(super) fn close(self) -> Result<ClosedOutput> {
        self.file.sync_all().map_err(|e| io(&self.partial, e))?;
        drop(self.file);
        Ok(ClosedOutput { partial: self.partial, meta_file: self.meta_file })
    }
}

/// A complete `OUT.partial`, closed.
pub(super) struct ClosedOutput {
    partial: PathBuf,
    meta_file: PathBuf,
}

impl ClosedOutput {
    /// Nothing was regenerated: remove the partial output and its options (best effort).
    pub(super) fn abandon(self) {
        let _ = std::fs::remove_file(&self.partial);
        let _ = std::fs::remove_file(&self.meta_file);
    }

    /// Write the report beside `out`, then rename `OUT.partial` to `out`.
    pub(super) fn publish(self, out: &Path, report: &RegenerateReport) -> Result<()> {
        aerie_data::atomic::write_bytes(
            &report_path(out),
            serde_json::to_string_pretty(report).expect("JSON").as_bytes(),
        )?;
        std::fs::rename(&self.partial, out).map_err(|e| io(out, e))?;
        sync_parent(out)?;
        let _ = std::fs::remove_file(&self.meta_file);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_recovery_cuts_the_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.jsonl.partial");
        std::fs::write(&p, "{\"source_index\": 0}\n{\"source_index\": 4}\n{\"source_ind").unwrap();
        assert_eq!(recover_partial(&p).unwrap(), (2, Some(4)));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"source_index\": 0}\n{\"source_index\": 4}\n");
        std::fs::write(&p, "").unwrap();
        assert_eq!(recover_partial(&p).unwrap(), (0, None));
        std::fs::write(&p, "not json\n").unwrap();
        assert!(recover_partial(&p).unwrap_err().to_string().contains("not JSON"));
    }

    #[test]
    fn paths_beside_the_output() {
        let out = Path::new("d/regen.jsonl");
        assert_eq!(partial_path(out), Path::new("d/regen.jsonl.partial"));
        assert_eq!(meta_path(out), Path::new("d/regen.jsonl.partial.meta.json"));
        assert_eq!(report_path(out), Path::new("d/regen.report.json"));
    }
}
