//! Never delete or overwrite what aerie did not write. A command replacing an existing output
//! (`--force`, `--overwrite`), or writing a side file the user did not name (the JSON report
//! beside `--out X.safetensors`), first recognises what is there as its own writer's output,
//! positively: a JSON file whose `format` is that writer's, a directory holding exactly the
//! files that writer writes. Anything else is refused, naming the file and why, since a path
//! typed wrong (a model directory, a dataset, the user's notes) is the common case and its loss
//! is silent. An output is also never an input of the same run, nor a directory holding one:
//! replacing it would destroy what the run reads.

use std::path::Path;

use crate::lock::resolve_output;
use crate::{Error, Result};

/// Refuse `path` when it exists and `ours` does not recognise its JSON as written by `what`
/// (a missing file is always free to write). `flag` names where the path came from, for the
/// message (`"--out"`, `"the report beside --out"`).
pub fn check_json_is_ours(
    path: &Path,
    what: &str,
    flag: &str,
    ours: impl Fn(&serde_json::Value) -> bool,
) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let recognised = meta.is_file()
        && std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| ours(&v));
    if recognised {
        return Ok(());
    }
    Err(Error::NotOurs {
        path: path.to_path_buf(),
        message: format!(
            "exists and is not {what} (aerie replaces only what it wrote); it is {flag}: move the file away or \
             choose another output"
        ),
    })
}

/// Refuse `path` when it exists and is not a safetensors file whose metadata `format` is
/// `format` (what aerie's writers record, e.g. `aerie-vocab/1`).
pub fn check_safetensors_is_ours(path: &Path, format: &str, what: &str, flag: &str) -> Result<()> {
    // A header past this is not one of aerie's small files (and is not read into memory).
    const MAX_HEADER: u64 = 1 << 20;
    let ours = || -> Option<bool> {
        use std::io::Read;
        let mut f = std::fs::File::open(path).ok()?;
        if !f.metadata().ok()?.is_file() {
            return Some(false);
        }
        let mut len = [0u8; 8];
        f.read_exact(&mut len).ok()?;
        let n = u64::from_le_bytes(len);
        if n > MAX_HEADER {
            return Some(false);
        }
        let mut header = vec![0u8; n as usize];
        f.read_exact(&mut header).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&header).ok()?;
        Some(v.get("__metadata__").is_some_and(|m| has_format(m, format)))
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
        Ok(_) if ours() == Some(true) => Ok(()),
        Ok(_) => Err(Error::NotOurs {
            path: path.to_path_buf(),
            message: format!(
                "exists and is not {what} (aerie replaces only what it wrote); it is {flag}: move the file away or \
                 choose another output"
            ),
        }),
    }
}

/// Whether a JSON value is an object whose `format` is `format`.
pub fn has_format(v: &serde_json::Value, format: &str) -> bool {
    v.get("format").and_then(|f| f.as_str()) == Some(format)
}

/// Refuse an output `out` that is one of `inputs` or a directory holding one, however either
/// is spelled (symlinks and `..` resolved). Each input is `(what, path)`, `what` naming it in
/// the message (`"the drafter"`, `"--data"`).
pub fn check_not_input(out: &Path, flag: &str, inputs: &[(&str, &Path)]) -> Result<()> {
    let out_parent = crate::paths::parent_dir(out);
    if !out_parent.exists() {
        return Ok(());
    }
    let out_real = resolve_output(out)?;
    for (what, input) in inputs {
        let Ok(real) = std::fs::canonicalize(input) else { continue };
        if real.starts_with(&out_real) {
            let how = if real == out_real { "is" } else { "holds" };
            return Err(Error::NotOurs {
                path: out.to_path_buf(),
                message: format!(
                    "{flag} {how} {what} {} of this run; writing it would destroy the input: choose another output",
                    input.display()
                ),
            });
        }
    }
    Ok(())
}

/// Refuse a non-empty directory `dir` unless its entries are exactly a subset of `files` holding
/// every one of `required` (the file set `what`'s writer writes). A missing or empty directory
/// is free to write.
pub fn check_dir_is_ours(dir: &Path, what: &str, files: &[&str], required: &[&str]) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(it) => it,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut names: Vec<String> = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Error::io(dir, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    let foreign: Vec<&String> = names.iter().filter(|n| !files.contains(&n.as_str())).collect();
    let missing: Vec<&&str> = required.iter().filter(|r| !names.iter().any(|n| n == **r)).collect();
    if foreign.is_empty() && missing.is_empty() {
        return Ok(());
    }
    let why = if foreign.is_empty() {
        format!("it lacks {}", missing.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", "))
    } else {
        let shown: Vec<&str> = foreign.iter().take(5).map(|s| s.as_str()).collect();
        let more = foreign.len().saturating_sub(shown.len());
        format!(
            "it holds {}{} besides {}",
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() },
            files.join(", ")
        )
    };
    Err(Error::NotOurs {
        path: dir.to_path_buf(),
        message: format!(
            "is not {what} that aerie wrote ({why}); refusing to replace it: move it away or choose another output"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_json_of_our_format_or_nothing_may_be_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        let ours = |v: &serde_json::Value| has_format(v, "aerie-vocab/1");
        check_json_is_ours(&p, "a vocab report", "--out", ours).unwrap();
        std::fs::write(&p, r#"{"format": "aerie-vocab/1"}"#).unwrap();
        check_json_is_ours(&p, "a vocab report", "--out", ours).unwrap();
        for other in [&br#"{"format": "aerie-prepared/1"}"#[..], b"my notes", b"{}"] {
            std::fs::write(&p, other).unwrap();
            let err = check_json_is_ours(&p, "a vocab report", "--out", ours).unwrap_err().to_string();
            assert!(err.contains("x.json") && err.contains("is not a vocab report"), "{err}");
        }
    }

    #[test]
    fn a_directory_is_ours_only_with_exactly_our_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("ckpt");
        let files = ["config.json", "model.safetensors"];
        check_dir_is_ours(&d, "a checkpoint", &files, &files).unwrap();
        std::fs::create_dir(&d).unwrap();
        check_dir_is_ours(&d, "a checkpoint", &files, &files).unwrap();
        std::fs::write(d.join("config.json"), "{}").unwrap();
        let err = check_dir_is_ours(&d, "a checkpoint", &files, &files).unwrap_err().to_string();
        assert!(err.contains("lacks model.safetensors"), "{err}");
        std::fs::write(d.join("model.safetensors"), "").unwrap();
        check_dir_is_ours(&d, "a checkpoint", &files, &files).unwrap();
        std::fs::write(d.join("tokenizer.json"), "{}").unwrap();
        let err = check_dir_is_ours(&d, "a checkpoint", &files, &files).unwrap_err().to_string();
        assert!(err.contains("holds tokenizer.json"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn an_output_that_is_or_holds_an_input_is_refused_however_spelled() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("model");
        std::fs::create_dir(&d).unwrap();
        let input = d.join("weights.safetensors");
        std::fs::write(&input, "").unwrap();
        std::os::unix::fs::symlink(&d, dir.path().join("link")).unwrap();
        for out in [d.clone(), dir.path().join("link"), dir.path().join("link/../model/"), input.clone()] {
            let err = check_not_input(&out, "--out", &[("the drafter", &input)]).unwrap_err().to_string();
            assert!(err.contains("the drafter") && err.contains("--out"), "{}: {err}", out.display());
        }
        check_not_input(&dir.path().join("other"), "--out", &[("the drafter", &input)]).unwrap();
    }
}
