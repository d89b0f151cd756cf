//! The Python capture worker (`python/aerie_capture`): `aerie capture --engine transformers`
//! (any HF causal LM, CPU or GPU), `--engine sglang` (SGLang's `ModelRunner` on every
//! tensor-parallel rank, under torchrun) and `--engine vllm` (vLLM's `LLM` in the worker's
//! process with the `extract_hidden_states` method; vLLM starts its own tensor-parallel
//! workers). The worker writes the shards itself (every encoding,
//! format 1 or 2 as the dtype needs); this module computes the shard metadata and its checks
//! ([`crate::contract`]) and hands the metadata to the worker whole (`--metadata`), builds the
//! rest of its command line from the native capture's options, runs it, reads its report
//! ([`WorkerReport`]), and then opens the dataset with aerie's own reader and verifies every
//! value, so a dataset that aerie refuses is a failed capture whatever the worker said.
//! docs/capture-python.md has the details.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use aerie_data::prepare::PreparedDataset;
use aerie_data::shard::{ShardDataset, ShardMetadata, VerifyReport};
use aerie_engine::Engine;
use aerie_engine::process::{die_with_parent, exception_line, root_cause};
use serde::{Deserialize, Serialize};

use crate::contract::{self, TargetShape};
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
    /// vLLM: the KV cache in GiB; `None` sizes it for capture (one batch and one longest
    /// prompt) instead of vLLM's default share of the device, which on a CPU is 85 % of the
    /// machine's memory and refuses to start when that much is not free.
    pub kv_cache_gb: Option<f64>,
    /// Further worker arguments, passed unchanged.
    pub extra_args: Vec<String>,
}

/// The worker's JSON report (the last line of its stdout; `run` in
/// `python/aerie_capture/worker.py` writes it). A field the worker renames or drops is an error
/// naming the field, not a zero in aerie's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// `transformers`, `sglang` or `vllm`.
    pub engine: String,
    /// The metadata's `created_by`: aerie's version and the engine's description.
    pub created_by: String,
    /// The output directory.
    pub out: String,
    /// Samples already in the dataset when the worker started.
    pub resumed_samples: u64,
    /// Samples this run captured.
    pub captured_samples: u64,
    /// Tokens this run captured.
    pub captured_tokens: u64,
    /// Wall time of the capture loop.
    pub seconds: f64,
    /// `captured_tokens / seconds`.
    pub tokens_per_second: f64,
    /// Samples in the dataset after the run.
    pub dataset_samples: u64,
    /// Tokens in the dataset after the run.
    pub dataset_tokens: u64,
}

impl WorkerReport {
    /// The report in the worker's `stdout`: its last line that is a JSON object.
    pub fn parse(stdout: &str) -> Result<Self> {
        let line = stdout.lines().rev().map(str::trim).find(|l| l.starts_with('{')).ok_or_else(|| {
            Error::Invalid(format!("the Python capture worker printed no JSON report; its stdout:\n{stdout}"))
        })?;
        serde_json::from_str(line).map_err(|e| {
            Error::Invalid(format!(
                "the Python capture worker's report does not match aerie's WorkerReport ({e}; are python/ and aerie \
                 from one checkout?): {line}"
            ))
        })
    }
}

/// What a Python capture did: the worker's own report, and aerie's verification.
#[derive(Debug, Clone)]
pub struct PythonReport {
    /// The worker's report.
    pub worker: WorkerReport,
    /// aerie's full verification of the dataset.
    pub verify: VerifyReport,
    /// Bytes per stored token (file sizes over the manifest's tokens).
    pub bytes_per_token: f64,
    /// What the user should know (an output on a file system without locks).
    pub warnings: Vec<String>,
}

impl PythonCapture {
    /// The shard metadata of this capture ([`contract::metadata`]: the target's shape from its
    /// `config.json`, every check that needs no engine).
    pub fn metadata(&self) -> Result<ShardMetadata> {
        let data = PreparedDataset::open(&self.data)?;
        contract::metadata(&self.target, TargetShape::from_config(&self.target)?, &data, &self.capture)
    }

    /// The worker's command line: `python -m aerie_capture ...`, under torchrun (as `python -m
    /// torch.distributed.run`, so the same interpreter) for SGLang with `tp` > 1, writing
    /// `metadata`. `self_test` names a self-test phase (`all`, `tiny`, `real`) instead of a
    /// capture.
    pub fn command(&self, metadata: &ShardMetadata, self_test: Option<&str>) -> Command {
        let mut c = aerie_engine::python::command(&self.python);
        if self.engine == PythonEngine::Served(Engine::Sglang) && self.tp > 1 {
            c.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &self.tp.to_string()]);
        }
        c.args(["-m", "aerie_capture"]);
        c.args(["--engine", self.engine.name()]);
        let o = &self.capture;
        c.arg("--target").arg(&self.target);
        c.args(["--metadata", &serde_json::to_string(&metadata.to_map()).expect("a map of strings")]);
        c.arg("--data").arg(&self.data);
        if let Some(out) = &self.out {
            c.arg("--out").arg(out);
        }
        c.args(["--split", &o.split]);
        c.args([
            "--shard-tokens",
            &o.shard_tokens.to_string(),
            "--max-batch-tokens",
            &self.max_batch_tokens.to_string(),
        ]);
        if let Some(n) = o.max_samples {
            c.args(["--max-samples", &n.to_string()]);
        }
        match self.engine {
            PythonEngine::Transformers => c.args(["--device", &self.device]),
            PythonEngine::Served(Engine::Vllm) => c.args(["--tp", &self.tp.to_string(), "--device", &self.device]),
            PythonEngine::Served(_) => c.args(["--tp", &self.tp.to_string()]),
        };
        if let (PythonEngine::Served(Engine::Vllm), Some(gb)) = (self.engine, self.kv_cache_gb) {
            c.args(["--kv-cache-gb", &gb.to_string()]);
        }
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
        let mut metadata = self.metadata()?;
        // The worker locks the dataset itself (`.aerie-shard.lock` inside), so aerie's lock,
        // taken before the provenance check and held across the worker's run, is the one beside
        // the dataset that the native capture takes too ([`crate::provenance::claim`]).
        let claim = crate::provenance::claim(dir, &self.target, &self.data, &self.capture.split)?;
        if let Some(name) = &claim.recorded_target {
            metadata.target = name.clone();
        }
        let mut cmd = self.command(&metadata, None);
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
        let worker = WorkerReport::parse(&stdout)?;
        let dataset = ShardDataset::open(dir)?;
        let verify = dataset.verify()?;
        let bytes: u64 = dataset
            .manifest()
            .shards
            .iter()
            .map(|s| std::fs::metadata(dir.join(&s.file)).map(|m| m.len()).unwrap_or(0))
            .sum();
        Ok(PythonReport {
            worker,
            verify,
            bytes_per_token: bytes as f64 / dataset.num_tokens().max(1) as f64,
            warnings: claim.warnings,
        })
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
        let metadata = self.metadata()?;
        for phase in phases {
            let status =
                self.command(&metadata, Some(phase)).stdin(Stdio::null()).status().map_err(|e| self.start_error(e))?;
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

    const REPORT: &str = r#"{"engine": "vllm", "created_by": "aerie-capture 0.1.0 (vllm 0.32.0)", "out": "o", "resumed_samples": 2, "captured_samples": 6, "captured_tokens": 900, "seconds": 3.0, "tokens_per_second": 300.0, "dataset_samples": 8, "dataset_tokens": 1200}"#;

    #[test]
    fn the_worker_report_is_read_through_its_type() {
        let r = WorkerReport::parse(&format!("vllm says hello\n{REPORT}\n")).unwrap();
        assert_eq!((r.captured_samples, r.dataset_tokens, r.tokens_per_second), (6, 1200, 300.0));
        // A renamed field is an error naming it, not a zero.
        let renamed = REPORT.replace("captured_tokens", "tokens_captured");
        let e = WorkerReport::parse(&renamed).unwrap_err().to_string();
        assert!(e.contains("captured_tokens") && e.contains("WorkerReport"), "{e}");
        assert!(WorkerReport::parse("no report\n").unwrap_err().to_string().contains("no JSON report"));
    }
}
