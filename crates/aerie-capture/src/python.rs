//! The Python capture worker (`python/aerie_capture`): `aerie capture --engine transformers`
//! (any HF causal LM, CPU or GPU), `--engine sglang` (SGLang's `ModelRunner` on every
//! tensor-parallel rank, under torchrun) and `--engine vllm` (vLLM's `LLM` in the worker's
//! process with the `extract_hidden_states` method; vLLM starts its own tensor-parallel
//! workers). The worker writes the shards itself (every encoding,
//! format 1 or 2 as the dtype needs); this module
//! builds its command line from the native capture's options, runs it, and then opens the
//! dataset with aerie's own reader and verifies every value, so a dataset that aerie refuses is
//! a failed capture whatever the worker said. docs/capture-python.md has the details.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use aerie_data::shard::{MANIFEST_FILE, ShardDataset, VerifyReport};
use aerie_engine::Engine;
use aerie_engine::process::{die_with_parent, exception_line, root_cause};

use crate::{CaptureOptions, Error, Result};

/// Which engine the worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonEngine {
    /// transformers, one process, on `device`.
    Transformers,
    /// A serving engine in the worker's process: SGLang's `ModelRunner` (`tp` processes started
    /// by torchrun) or vLLM's `LLM` (one process that starts vLLM's own `tp` workers; the
    /// teacher's head on `device`).
    Served(Engine),
}

impl PythonEngine {
    /// The worker's `--engine` name.
    pub fn name(self) -> &'static str {
        match self {
            PythonEngine::Transformers => "transformers",
            PythonEngine::Served(e) => e.name(),
        }
    }
}

/// A Python capture: the native capture's options plus the worker's own.
#[derive(Debug, Clone)]
pub struct PythonCapture {
    /// The interpreter whose environment holds torch and the engine.
    pub python: PathBuf,
    /// The engine.
    pub engine: PythonEngine,
    /// Target model directory (HF layout).
    pub target: PathBuf,
    /// Prepared dataset.
    pub data: PathBuf,
    /// Output shard directory (`None` only for the self-test).
    pub out: Option<PathBuf>,
    /// What to capture, as the native engine takes it (the worker writes the same shards).
    pub capture: CaptureOptions,
    /// Token budget of one forward batch.
    pub max_batch_tokens: usize,
    /// transformers: `cpu` or `cuda:N`; vLLM: where the final norm and the teacher's head run.
    pub device: String,
    /// SGLang and vLLM: tensor-parallel ranks.
    pub tp: usize,
    /// Further worker arguments, passed unchanged.
    pub extra_args: Vec<String>,
}

/// What a Python capture did: the worker's own JSON report, and aerie's verification.
#[derive(Debug, Clone)]
pub struct PythonReport {
    /// The worker's report (`engine`, `created_by`, `resumed_samples`, `captured_samples`,
    /// `captured_tokens`, `seconds`, `tokens_per_second`, ...).
    pub worker: serde_json::Value,
    /// aerie's full verification of the dataset.
    pub verify: VerifyReport,
    /// Bytes per stored token (file sizes over the manifest's tokens).
    pub bytes_per_token: f64,
}

impl PythonCapture {
    /// The worker's command line: `python -m aerie_capture ...`, under torchrun (as `python -m
    /// torch.distributed.run`, so the same interpreter) for SGLang with `tp` > 1. `self_test`
    /// names a self-test phase (`all`, `tiny`, `real`) instead of a capture.
    pub fn command(&self, self_test: Option<&str>) -> Command {
        let mut c = aerie_engine::python::command(&self.python);
        if self.engine == PythonEngine::Served(Engine::Sglang) && self.tp > 1 {
            c.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &self.tp.to_string()]);
        }
        c.args(["-m", "aerie_capture"]);
        c.args(["--engine", self.engine.name()]);
        let o = &self.capture;
        c.arg("--target").arg(&self.target).args(["--target-name", &o.target_name]);
        c.arg("--data").arg(&self.data);
        if let Some(out) = &self.out {
            c.arg("--out").arg(out);
        }
        c.args(["--split", &o.split, "--dtype", o.dtype.as_str(), "--teacher", &o.teacher.to_string()]);
        c.args([
            "--shard-tokens",
            &o.shard_tokens.to_string(),
            "--max-batch-tokens",
            &self.max_batch_tokens.to_string(),
        ]);
        if let Some(ids) = &o.aux_layers {
            let ids: Vec<String> = ids.iter().map(usize::to_string).collect();
            c.args(["--aux-layers", &ids.join(",")]);
        }
        if let Some(n) = o.max_samples {
            c.args(["--max-samples", &n.to_string()]);
        }
        match self.engine {
            PythonEngine::Transformers => c.args(["--device", &self.device]),
            PythonEngine::Served(Engine::Vllm) => c.args(["--tp", &self.tp.to_string(), "--device", &self.device]),
            PythonEngine::Served(_) => c.args(["--tp", &self.tp.to_string()]),
        };
        if let Some(phase) = self_test {
            c.args(["--self-test", phase]);
        }
        c.args(&self.extra_args);
        // A killed `aerie capture` must not leave a job on the GPUs that keeps writing and holds
        // the dataset's lock (torchrun stops its ranks on SIGTERM).
        die_with_parent(&mut c, false);
        c
    }

    fn start_error(&self, e: std::io::Error) -> Error {
        Error::Invalid(format!(
            "cannot start the Python capture worker with {}: {e} (set --python or AERIE_PYTHON)",
            self.python.display()
        ))
    }

    /// Run the capture, then verify the dataset with aerie's reader.
    pub fn run(&self) -> Result<PythonReport> {
        let dir = self.out.as_ref().ok_or_else(|| Error::Invalid("a capture needs --out".into()))?;
        // The worker locks the dataset itself (`.aerie-shard.lock` inside), so aerie cannot hold
        // that lock across the provenance check and the worker's run; it holds the lock beside
        // the dataset instead, so a second aerie capture into it is refused before it checks or
        // records anything (else both could pass the check and the second overwrite the first's
        // record).
        let _lock = aerie_data::lock::OutputLock::beside(dir)?;
        let on_disk = if dir.join(MANIFEST_FILE).exists() { ShardDataset::open(dir)?.len() as u64 } else { 0 };
        crate::provenance::check_or_record(dir, &self.data, &self.capture.split, on_disk)?;
        let mut cmd = self.command(None);
        let (status, stdout, cause) = run_echoing_stderr(&mut cmd).map_err(|e| self.start_error(e))?;
        if !status.success() {
            let cause = cause.map_or_else(
                || "no exception in its stderr (above)".to_string(),
                |c| format!("the {} worker's root cause: {c}", self.engine.name()),
            );
            return Err(Error::Invalid(format!(
                "the Python capture worker ({}) failed with {status}; its stdout:\n{stdout}\n{cause}",
                self.python.display(),
            )));
        }
        let worker: serde_json::Value =
            stdout.lines().rev().find_map(|l| serde_json::from_str(l.trim()).ok()).ok_or_else(|| {
                Error::Invalid(format!("the Python capture worker printed no JSON report; its stdout:\n{stdout}"))
            })?;
        let dataset = ShardDataset::open(dir)?;
        let verify = dataset.verify()?;
        let bytes: u64 = dataset
            .manifest()
            .shards
            .iter()
            .map(|s| std::fs::metadata(dir.join(&s.file)).map(|m| m.len()).unwrap_or(0))
            .sum();
        Ok(PythonReport { worker, verify, bytes_per_token: bytes as f64 / dataset.num_tokens().max(1) as f64 })
    }

    /// Run the self-test: for SGLang and vLLM its two phases as two processes (SGLang's
    /// distributed state is process-global; one vLLM engine per process is what vLLM tests),
    /// for transformers both in one process. The
    /// worker prints one JSON line per phase on stdout (inherited).
    pub fn self_test(&self) -> Result<()> {
        let phases: &[&str] = match self.engine {
            PythonEngine::Served(_) => &["tiny", "real"],
            PythonEngine::Transformers => &["all"],
        };
        for phase in phases {
            let status = self.command(Some(phase)).stdin(Stdio::null()).status().map_err(|e| self.start_error(e))?;
            if !status.success() {
                return Err(Error::Invalid(format!(
                    "self-test phase `{phase}` failed ({status}); its JSON line above says which check"
                )));
            }
        }
        Ok(())
    }
}

/// Run `cmd` with its stdout captured and its stderr passed through to aerie's line by line (the
/// user sees the worker's progress as it comes) and read for its root cause
/// ([`aerie_engine::process::root_cause`]): the exit status, the stdout, and that cause.
fn run_echoing_stderr(cmd: &mut Command) -> std::io::Result<(std::process::ExitStatus, String, Option<String>)> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let echo = std::thread::spawn(move || {
        // The first exception is the cause; the last lines are kept for an ERROR line without
        // one, so an endless log does not grow aerie.
        let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        let mut cause = None;
        for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
            eprintln!("{line}");
            if cause.is_none() {
                cause = exception_line(&line).map(str::to_string);
            }
            if tail.len() == 200 {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        cause.or_else(|| root_cause(&Vec::from(tail).join("\n")))
    });
    let mut stdout = String::new();
    child.stdout.take().expect("stdout is piped").read_to_string(&mut stdout)?;
    let status = child.wait()?;
    let cause = echo.join().unwrap_or(None);
    Ok((status, stdout, cause))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 34 §3: a failed worker's last line names its own root cause, not "exit status 1
    /// (its stderr is above)".
    #[test]
    fn a_failed_worker_is_reported_by_its_root_cause() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo '{\"partial\": 1}'; echo 'Traceback (most recent call last):' >&2; \
             echo 'ModuleNotFoundError: No module named pyarrow' >&2; echo 'RuntimeError: worker failed' >&2; exit 3",
        ]);
        let (status, stdout, cause) = run_echoing_stderr(&mut c).unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(stdout.trim(), "{\"partial\": 1}");
        assert_eq!(cause.as_deref(), Some("ModuleNotFoundError: No module named pyarrow"));
    }
}
