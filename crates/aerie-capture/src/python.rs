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

use std::path::PathBuf;
use std::process::{Command, Stdio};

use aerie_data::prepare::PreparedDataset;
use aerie_data::shard::{ShardDataset, ShardMetadata, VerifyReport};
use serde::{Deserialize, Serialize};

use crate::contract::{self, TargetShape};
use crate::{CaptureOptions, Error, Result};

/// Which engine the worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonEngine {
    /// transformers, one process, on `device`.
    Transformers,
    /// SGLang, `tp` processes started by torchrun.
    Sglang,
    /// vLLM, one process that starts vLLM's own `tp` workers; the teacher's head on `device`.
    Vllm,
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

/// Have the worker (or torchrun, which then stops its ranks) receive SIGTERM when aerie dies,
/// even by SIGKILL: otherwise a killed `aerie capture` leaves a job on the GPUs that keeps
/// writing and holds the dataset's lock.
fn stop_with_parent(c: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only calls prctl, which
        // is async-signal-safe; the death signal survives exec.
        unsafe {
            c.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = c;
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
        let mut c = Command::new(&self.python);
        if self.engine == PythonEngine::Sglang && self.tp > 1 {
            c.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &self.tp.to_string()]);
        }
        c.args(["-m", "aerie_capture"]);
        if let Some(dir) = aerie_data::python::package_dir() {
            aerie_data::python::prepend_pythonpath(&mut c, &dir);
        }
        let engine = match self.engine {
            PythonEngine::Transformers => "transformers",
            PythonEngine::Sglang => "sglang",
            PythonEngine::Vllm => "vllm",
        };
        c.args(["--engine", engine]);
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
            PythonEngine::Sglang => c.args(["--tp", &self.tp.to_string()]),
            PythonEngine::Vllm => c.args(["--tp", &self.tp.to_string(), "--device", &self.device]),
        };
        if let (PythonEngine::Vllm, Some(gb)) = (self.engine, self.kv_cache_gb) {
            c.args(["--kv-cache-gb", &gb.to_string()]);
        }
        if let Some(phase) = self_test {
            c.args(["--self-test", phase]);
        }
        c.args(&self.extra_args);
        stop_with_parent(&mut c);
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
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let out = cmd.output().map_err(|e| self.start_error(e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(Error::Invalid(format!(
                "the Python capture worker ({}) failed with {} (its stderr is above); its stdout:\n{stdout}",
                self.python.display(),
                out.status
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
            PythonEngine::Sglang | PythonEngine::Vllm => &["tiny", "real"],
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

#[cfg(test)]
mod tests {
    use super::*;

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
