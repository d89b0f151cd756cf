//! What a capture's samples are, beyond what the shard metadata records: which target (by the
//! digest of its files, [`target_digest`]), which prepared dataset and which split they come
//! from. The shard writer refuses a resume with other aux layers, dtype or teacher (they are
//! metadata); this file, `capture-options.json` in the dataset directory, makes the same true of
//! the inputs, so a capture killed and rerun with another `--split`, `--data` or target is
//! refused instead of appending eval samples to a train set or another model's states to this
//! one's. Both engines (native and the Python worker) start with [`claim`]: the output's lock,
//! then the check, so two captures into one `--out` cannot both pass the check and overwrite
//! each other's record.
//!
//! `--max-samples` is not recorded: every capture takes the first N samples of its split in
//! order, so a rerun with another N extends or stops the same sequence and mixes nothing.

use std::io::Read;
use std::path::Path;

use aerie_data::lock::OutputLock;
use aerie_data::prepare::REPORT_FILE;
use aerie_data::shard::{MANIFEST_FILE, ShardDataset, sha256_file};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The file beside the shards.
pub const OPTIONS_FILE: &str = "capture-options.json";

/// A capture's hold on its output directory: the lock (held until dropped) and what the
/// directory already holds.
#[derive(Debug)]
pub struct Claim {
    _lock: OutputLock,
    /// Samples already in the dataset (a resume).
    pub samples_on_disk: u64,
    /// The `target` name the dataset's metadata records, when it holds samples of this very
    /// target (same [`target_digest`]): a resume through another spelling of the target's path
    /// keeps the first name instead of being refused for it.
    pub recorded_target: Option<String>,
    /// What the caller should tell the user (an output whose file system has no `flock`).
    pub warnings: Vec<String>,
}

/// Lock the capture output `out` (beside it, [`OutputLock::beside`]: the Python worker locks
/// the dataset itself from inside, so aerie's lock must be another file), then check the inputs
/// against those the dataset was captured from, or record them ([`check_or_record`]). Every
/// capture takes this before it writes anything, whatever its engine.
pub fn claim(out: &Path, target: &Path, data: &Path, split: &str) -> Result<Claim> {
    let lock = OutputLock::beside(out)?;
    // Shards written into the inputs would mix two datasets in one directory.
    aerie_data::owned::check_not_input(out, "--out", &[("--data", data), ("--target", target)])?;
    if aerie_data::prepare::is_prepared_dir(out) {
        return Err(aerie_data::Error::NotOurs {
            path: out.to_path_buf(),
            message: "--out holds a prepared dataset (its report.json), which shards would be mixed into: \
                      capture into a directory of its own, e.g. shards/"
                .into(),
        }
        .into());
    }
    // A file system without `flock` is told on stderr by the lock itself, as for every writer.
    let warnings = Vec::new();
    let dataset = if out.join(MANIFEST_FILE).exists() { Some(ShardDataset::open(out)?) } else { None };
    let samples_on_disk = dataset.as_ref().map_or(0, |d| d.len() as u64);
    let same_target = check_or_record(out, target, data, split, samples_on_disk)?;
    let recorded_target = dataset.filter(|d| same_target && !d.is_empty()).map(|d| d.metadata().target.clone());
    Ok(Claim { _lock: lock, samples_on_disk, recorded_target, warnings })
}

/// The identity of the target in `dir`: sha256 over `config.json` and the header (length and
/// JSON: tensor names, dtypes, shapes, offsets and metadata) of every `*.safetensors` file, in
/// file-name order, each preceded by its name. Cheap for any model size (no weight is read),
/// and it tells apart what a name cannot: two checkpoints under one `--target` path, or one
/// checkpoint under two paths. Weights rewritten in place with identical shapes and header
/// metadata are not told apart.
pub fn target_digest(dir: &Path) -> Result<String> {
    let mut h = Sha256::new();
    let config = aerie_data::hf_config::config_json_path(dir);
    let bytes = std::fs::read(&config).map_err(|e| aerie_data::Error::io(&config, e))?;
    h.update(b"config.json\n");
    h.update(&bytes);
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| aerie_data::Error::io(dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    for path in files {
        let mut f = std::fs::File::open(&path).map_err(|e| aerie_data::Error::io(&path, e))?;
        let mut len = [0u8; 8];
        f.read_exact(&mut len).map_err(|e| aerie_data::Error::io(&path, e))?;
        let n = u64::from_le_bytes(len);
        if n > 1 << 30 {
            return Err(Error::Invalid(format!("{}: a safetensors header of {n} bytes", path.display())));
        }
        let mut header = vec![0u8; n as usize];
        f.read_exact(&mut header).map_err(|e| aerie_data::Error::io(&path, e))?;
        h.update(path.file_name().unwrap_or_default().as_encoded_bytes());
        h.update(b"\n");
        h.update(len);
        h.update(&header);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The inputs a capture of `split` of the prepared dataset `data` through `target` records.
fn options(target: &Path, data: &Path, split: &str) -> Result<Value> {
    let report = data.join(REPORT_FILE);
    let text = std::fs::read(&report).map_err(|e| aerie_data::Error::io(&report, e))?;
    let parsed: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
    Ok(json!({
        "format": "aerie-capture-options/1",
        "target": std::path::absolute(target).unwrap_or_else(|_| target.to_path_buf()).display().to_string(),
        "target_sha256": target_digest(target)?,
        "data": std::path::absolute(data).unwrap_or_else(|_| data.to_path_buf()).display().to_string(),
        "data_report_sha256": sha256_file(&report)?,
        "split": split,
        "max_length": parsed["max_length"],
    }))
}

/// Record the inputs of a capture into `out` when it holds no sample yet; otherwise refuse
/// inputs other than those recorded, naming the option and both values. A dataset written
/// before this file existed has none and resumes unchecked; one recorded before the target's
/// digest was has its target unchecked here (the shard metadata still names it). Returns
/// whether the record names this very target by its digest.
pub fn check_or_record(out: &Path, target: &Path, data: &Path, split: &str, samples_on_disk: u64) -> Result<bool> {
    let want = options(target, data, split)?;
    let path = out.join(OPTIONS_FILE);
    if samples_on_disk == 0 {
        std::fs::create_dir_all(out).map_err(|e| aerie_data::Error::io(out, e))?;
        let text = serde_json::to_string_pretty(&want).expect("JSON");
        aerie_data::atomic::write_bytes(&path, format!("{text}\n").as_bytes())?;
        return Ok(false);
    }
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(aerie_data::Error::io(&path, e).into()),
    };
    let found: Value = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Invalid(format!("{}: not JSON ({e}); it records what {} holds", path.display(), out.display()))
    })?;
    let show = |v: &Value, key: &str| match key {
        "data_report_sha256" => format!("{} (report.json sha256 {})", v["data"].as_str().unwrap_or("?"), v[key]),
        "target_sha256" => {
            format!("{} (config and weight headers sha256 {})", v["target"].as_str().unwrap_or("?"), v[key])
        }
        _ => v[key].to_string(),
    };
    let differences: Vec<String> = [
        ("target_sha256", "--target"),
        ("split", "--split"),
        ("data_report_sha256", "--data"),
        ("max_length", "--max-length of the prepared data"),
    ]
    .into_iter()
    .filter(|(key, _)| !(*key == "target_sha256" && found[*key].is_null()) && found[*key] != want[*key])
    .map(|(key, option)| format!("{option}: {} then, {} now", show(&found, key), show(&want, key)))
    .collect();
    if differences.is_empty() {
        return Ok(found["target_sha256"] == want["target_sha256"]);
    }
    Err(Error::Invalid(format!(
        "{}: holds {samples_on_disk} samples captured from other inputs ({}); resuming would mix two datasets:\n  - {}\nrerun with the same options to resume, or choose another --out",
        out.display(),
        path.display(),
        differences.join("\n  - ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        bytes
    }

    #[test]
    fn a_target_is_its_config_and_weight_headers() {
        let root = tempfile::tempdir().unwrap();
        let write = |name: &str, config: &str, header: &str, data: &[u8]| {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.json"), config).unwrap();
            std::fs::write(dir.join("model.safetensors"), safetensors(header, data)).unwrap();
            target_digest(&dir).unwrap()
        };
        let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let a = write("a", r#"{"hidden_size": 2}"#, header, &[0; 8]);
        assert_eq!(a.len(), 64);
        // The same files under another path are the same target; the weights' values are not read.
        assert_eq!(write("b", r#"{"hidden_size": 2}"#, header, &[1; 8]), a);
        // Another config, or another tensor layout, is another target.
        assert_ne!(write("c", r#"{"hidden_size": 2, "rope_theta": 1}"#, header, &[0; 8]), a);
        let wider = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#;
        assert_ne!(write("d", r#"{"hidden_size": 2}"#, wider, &[0; 12]), a);
        assert!(target_digest(&root.path().join("missing")).is_err());
    }
}
