//! What a capture's samples are, beyond what the shard metadata records: which prepared
//! dataset and which split they come from. The shard writer refuses a resume with another
//! target, aux layers, dtype or teacher (they are metadata); this file, `capture-options.json`
//! in the dataset directory, makes the same true of the inputs, so a capture killed and rerun
//! with another `--split` or `--data` is refused instead of appending eval samples to a train
//! set. Both engines (native and the Python worker) go through [`check_or_record`].
//!
//! `--max-samples` is not recorded: every capture takes the first N samples of its split in
//! order, so a rerun with another N extends or stops the same sequence and mixes nothing.

use std::path::Path;

use aerie_data::prepare::REPORT_FILE;
use aerie_data::shard::sha256_file;
use serde_json::{Value, json};

use crate::{Error, Result};

/// The file beside the shards.
pub const OPTIONS_FILE: &str = "capture-options.json";

/// The inputs a capture of `split` of the prepared dataset `data` records.
fn options(data: &Path, split: &str) -> Result<Value> {
    let report = data.join(REPORT_FILE);
    let text = std::fs::read(&report).map_err(|e| aerie_data::Error::io(&report, e))?;
    let parsed: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
    Ok(json!({
        "format": "aerie-capture-options/1",
        "data": std::path::absolute(data).unwrap_or_else(|_| data.to_path_buf()).display().to_string(),
        "data_report_sha256": sha256_file(&report)?,
        "split": split,
        "max_length": parsed["max_length"],
    }))
}

/// Record the inputs of a capture into `out` when it holds no sample yet; otherwise refuse
/// inputs other than those recorded, naming the option and both values. A dataset written
/// before this file existed has none and resumes unchecked.
pub fn check_or_record(out: &Path, data: &Path, split: &str, samples_on_disk: u64) -> Result<()> {
    let want = options(data, split)?;
    let path = out.join(OPTIONS_FILE);
    if samples_on_disk == 0 {
        std::fs::create_dir_all(out).map_err(|e| aerie_data::Error::io(out, e))?;
        let text = serde_json::to_string_pretty(&want).expect("JSON");
        return Ok(aerie_data::atomic::write_bytes(&path, format!("{text}\n").as_bytes())?);
    }
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(aerie_data::Error::io(&path, e).into()),
    };
    let found: Value = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Invalid(format!("{}: not JSON ({e}); it records what {} holds", path.display(), out.display()))
    })?;
    let show = |v: &Value, key: &str| match key {
        "data_report_sha256" => format!("{} (report.json sha256 {})", v["data"].as_str().unwrap_or("?"), v[key]),
        _ => v[key].to_string(),
    };
    let differences: Vec<String> =
        [("split", "--split"), ("data_report_sha256", "--data"), ("max_length", "--max-length of the prepared data")]
            .into_iter()
            .filter(|(key, _)| found[*key] != want[*key])
            .map(|(key, option)| format!("{option}: {} then, {} now", show(&found, key), show(&want, key)))
            .collect();
    if differences.is_empty() {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{}: holds {samples_on_disk} samples captured from other inputs ({}); resuming would mix two datasets:\n  - {}\nrerun with the same options to resume, or choose another --out",
        out.display(),
        path.display(),
        differences.join("\n  - ")
    )))
}
