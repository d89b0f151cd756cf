//! Commands built from other `aerie` commands (the quickstart, `bench shift`): each stage runs
//! the same subcommand a user would type, printed before it runs, so such a command exercises
//! exactly the public interface; a stage whose output exists is skipped, which makes the whole
//! command resumable after an interruption.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// Wall time of one stage.
#[derive(Debug, Clone, Serialize)]
pub struct StageTime {
    pub stage: String,
    pub seconds: f64,
    /// Its output existed, so it did not run.
    pub skipped: bool,
}

/// Runs stages with this binary and records their times.
pub struct Runner {
    exe: PathBuf,
    /// The command to rerun to resume (named in a failed stage's error).
    resume: &'static str,
    pub stages: Vec<StageTime>,
}

impl Runner {
    /// A runner for `aerie RESUME`, which is named in errors as the way to resume.
    pub fn new(resume: &'static str) -> Result<Self> {
        Ok(Self { exe: std::env::current_exe()?, resume, stages: Vec::new() })
    }

    /// Run `aerie ARGS` unless `done` exists; its stdout is returned when `capture` is set and goes
    /// to stderr otherwise.
    pub fn stage(&mut self, name: &str, done: &Path, argv: &Argv, capture: bool) -> Result<String> {
        if done.exists() && !capture {
            eprintln!("== {name}: {} exists, skipped", done.display());
            self.stages.push(StageTime { stage: name.into(), seconds: 0.0, skipped: true });
            return Ok(String::new());
        }
        eprintln!("== {name}: aerie {}", argv.0.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "));
        let start = Instant::now();
        let mut cmd = Command::new(&self.exe);
        cmd.args(&argv.0).stdin(Stdio::null()).stderr(Stdio::inherit());
        let out = if capture {
            cmd.stdout(Stdio::piped()).output().with_context(|| format!("running stage {name}"))?
        } else {
            // A stage's own report goes to stderr with its progress: the caller's stdout is its
            // final report alone, so that `--json` prints one JSON document.
            let status = cmd.stdout(std::io::stderr()).status().with_context(|| format!("running stage {name}"))?;
            std::process::Output { status, stdout: Vec::new(), stderr: Vec::new() }
        };
        if !out.status.success() {
            bail!("stage `{name}` failed ({}); rerun `aerie {}` to resume after fixing it", out.status, self.resume);
        }
        self.stages.push(StageTime { stage: name.into(), seconds: start.elapsed().as_secs_f64(), skipped: false });
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Run another program (`cmd`, stdout to stderr like a stage's) unless `done` exists.
    pub fn external(&mut self, name: &str, done: &Path, mut cmd: Command) -> Result<()> {
        if done.exists() {
            eprintln!("== {name}: {} exists, skipped", done.display());
            self.stages.push(StageTime { stage: name.into(), seconds: 0.0, skipped: true });
            return Ok(());
        }
        let argv: Vec<String> = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        eprintln!("== {name}: {}", argv.join(" "));
        let start = Instant::now();
        let status = cmd
            .stdin(Stdio::null())
            .stdout(std::io::stderr())
            .stderr(Stdio::inherit())
            .status()
            .with_context(|| format!("running stage {name} ({})", argv[0]))?;
        if !status.success() {
            bail!("stage `{name}` failed ({status}); rerun `aerie {}` to resume after fixing it", self.resume);
        }
        self.stages.push(StageTime { stage: name.into(), seconds: start.elapsed().as_secs_f64(), skipped: false });
        Ok(())
    }

    /// Record a stage done in-process (fetching assets, writing inputs).
    pub fn record(&mut self, name: &str, start: Instant) {
        self.stages.push(StageTime { stage: name.into(), seconds: start.elapsed().as_secs_f64(), skipped: false });
    }
}

/// The command line of one stage, `aerie WORDS --flag value ...`, with each flag beside its value.
pub struct Argv(Vec<OsString>);

impl Argv {
    /// The subcommand words, e.g. `["eval", "loss"]`.
    pub fn new(words: &[&str]) -> Self {
        Self(words.iter().map(OsString::from).collect())
    }

    /// A positional argument.
    pub fn arg(mut self, value: impl Into<OsString>) -> Self {
        self.0.push(value.into());
        self
    }

    /// `name value`.
    pub fn flag(mut self, name: &str, value: impl Into<OsString>) -> Self {
        self.0.extend([name.into(), value.into()]);
        self
    }
}

/// `aerie capture` of one split of a prepared directory as a stage, done when `out/.complete`
/// exists (written after the capture succeeds). The teacher is the final hidden state, not the
/// default top-k: on the quickstart's 2-core CPU the top-k pass over SmolLM2's 49,152 logits took
/// 3.9 min more and saved training 1.0 min (33.8 min in all, over the 30-minute budget, for the
/// same held-out τ: 1.319 against 1.311). `f32` stores the hidden states unrounded, as an exact
/// offline walk of decoding needs (`tests/cycle_walk.rs`).
#[allow(clippy::too_many_arguments)]
pub fn capture(
    r: &mut Runner,
    name: &str,
    target: &Path,
    prepared: &Path,
    split: &str,
    max_samples: Option<usize>,
    out: &Path,
    f32: bool,
) -> Result<()> {
    let mut argv = Argv::new(&["capture"])
        .flag("--target", target)
        .flag("--data", prepared)
        .flag("--out", out)
        .flag("--split", split)
        .flag("--teacher", "final-hidden");
    if let Some(n) = max_samples {
        argv = argv.flag("--max-samples", n.to_string());
    }
    if f32 {
        argv = argv.flag("--dtype", "f32");
    }
    r.stage(name, &out.join(".complete"), &argv, false)?;
    aerie_data::atomic::write_bytes(&out.join(".complete"), b"")?;
    Ok(())
}

/// The newest complete checkpoint of a run directory (the trainer's own rule: a `checkpoint-N`
/// directory with its training state), as the drafter of that run.
pub fn latest_checkpoint(run: &Path) -> Result<PathBuf> {
    aerie_train::checkpoint::latest_checkpoint(run)?
        .map(|(_, p)| p)
        .ok_or_else(|| anyhow::anyhow!("{}: no checkpoint-N directory after training", run.display()))
}
