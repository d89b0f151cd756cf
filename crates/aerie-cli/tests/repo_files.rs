//! Files of the repository that no code reads the same way a user's machine does, checked as
//! text: the committed fixtures name no machine's path, and `.ci/run` sets `CI=true` itself (so
//! a reference check whose interpreter or fixtures are missing fails CI instead of skipping).

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every string of a JSON value, with the key path that leads to it.
fn strings(v: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::String(s) => out.push((at.to_owned(), s.clone())),
        serde_json::Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| strings(x, &format!("{at}[{i}]"), out)),
        serde_json::Value::Object(m) => m.iter().for_each(|(k, x)| strings(x, &format!("{at}.{k}"), out)),
        _ => {}
    }
}

#[test]
fn fixture_configs_name_no_machine_path() {
    let mut found = Vec::new();
    for dir in std::fs::read_dir(workspace().join("tests/fixtures")).unwrap().flatten() {
        let config = dir.path().join("config.json");
        let Ok(bytes) = std::fs::read(&config) else { continue };
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let mut all = Vec::new();
        strings(&v, "", &mut all);
        for (at, s) in all {
            if s.starts_with('/') || s.starts_with("~/") || s.contains(":\\") {
                found.push(format!("{}: `{at}` is `{s}`", config.display()));
            }
        }
    }
    assert!(found.is_empty(), "fixtures name a machine's path:\n{}", found.join("\n"));
}

#[test]
fn ci_run_sets_ci_true_itself() {
    let script = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    // Commands only: the header's comments may name scripts/test.sh (its timings) before the export.
    let commands: Vec<&str> = script.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let set = commands.iter().position(|l| *l == "export CI=true");
    let tests = commands.iter().position(|l| l.contains("scripts/test.sh"));
    assert!(
        matches!((set, tests), (Some(s), Some(t)) if s < t),
        ".ci/run must `export CI=true` before it runs scripts/test.sh"
    );
}
