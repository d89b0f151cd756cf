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

/// README's break-even τ for the Kimi-K2.5 node is what `aerie project` computes from the costs
/// file it names (cycle / T_d, the measured cycle holding the draft steps), and the 2.46 quoted
/// beside it is the slow end's own arithmetic, not the 29 ms cycle's.
#[test]
fn readme_break_even_is_aeries_own_arithmetic() {
    use aerie_eval::cost::{Costs, break_even, break_even_tau};
    let path = workspace().join("configs/costs/kimi-k25-8x-rtx-pro-6000.toml");
    let costs = Costs::load(&path).unwrap();
    let k2 = break_even(&costs, 2).unwrap().into_iter().find(|b| b.k == 2).unwrap();
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    // Line breaks as spaces: the sentence wraps.
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let claim = format!(
        "costs {} ms against a {} ms decode step, so τ must pass {} / {} = {:.2}",
        k2.cycle_ms, costs.t_d_ms, k2.cycle_ms, costs.t_d_ms, k2.break_even_tau
    );
    assert!(readme.contains(&claim), "README.md should say `{claim}` (aerie project with {})", path.display());
    let slow = format!("30 / 12.2 = {:.2}", break_even_tau(30.0, 12.2));
    for file in ["README.md", "docs/kimi-k25.md"] {
        let text = std::fs::read_to_string(workspace().join(file)).unwrap();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for (at, _) in text.match_indices("2.46") {
            let (mut from, mut to) = (at.saturating_sub(300), (at + 300).min(text.len()));
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            while !text.is_char_boundary(to) {
                to += 1;
            }
            let near = &text[from..to];
            assert!(near.contains(&slow), "{file}: a 2.46 without its arithmetic `{slow}` nearby: …{near}…");
        }
    }
}
