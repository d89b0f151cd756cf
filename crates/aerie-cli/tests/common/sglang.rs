//! The real SGLang for the tests that need it (`serve_sglang.rs`): the interpreter of
//! `$AERIE_SGLANG_PYTHON` when SGLang imports there (skipped with a note otherwise, failing when
//! `CI=true`: .ci/run builds that venv from python/requirements-sglang.txt), and SGLang's server on
//! the CPU started through `python -m aerie_serve sglang` in its own process group, killed with
//! the group when dropped.
//!
//! SGLang on these CPUs (shared/reference/sglang-cpu.md): PyPI has no CPU `sgl_kernel`, so the
//! test-only stand-in `python/tests/sglang_cpu` is put on the path (`AERIE_SGLANG_TEST_KERNELS`);
//! `--device cpu --attention-backend intel_amx` (the one backend EAGLE accepts on the CPU),
//! `OMP_NUM_THREADS=1` (with 2, OpenMP spin-waits and decoding slows tenfold on a busy 2-core box).
//! A start takes 50-115 s, most of it importing SGLang. Speed through the stand-in is meaningless:
//! these tests check acceptance, output and plumbing, never speed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::vllm::{answers, free_port, kill_group, python_dir};

/// The stand-in `sgl_kernel`'s directory.
pub fn test_kernels_dir() -> PathBuf {
    python_dir().join("tests/sglang_cpu")
}

/// The engine arguments SGLang needs on these CPUs, as `aerie eval serve --engine-arg` takes
/// them (each one `--engine-arg=ARG`).
pub const CPU_ARGS: [&str; 8] = [
    "--device",
    "cpu",
    "--attention-backend",
    "intel_amx",
    "--disable-cuda-graph",
    "--disable-overlap-schedule",
    "--max-total-tokens",
    "8192",
];

/// `--engine-arg=A` for each of [`CPU_ARGS`].
pub fn cpu_engine_args() -> Vec<String> {
    CPU_ARGS.iter().map(|a| format!("--engine-arg={a}")).collect()
}

/// SGLang's environment on these CPUs, for any command that starts it (directly or through aerie).
/// `AERIE_CAPTURE_PYTHONPATH` names this checkout's `python/` to aerie itself, whose own default
/// is the checkout it was built from.
pub fn sglang_env(c: &mut Command) -> &mut Command {
    c.env("PYTHONPATH", python_dir())
        .env("AERIE_CAPTURE_PYTHONPATH", python_dir())
        .env("AERIE_SGLANG_TEST_KERNELS", test_kernels_dir())
        .env("OMP_NUM_THREADS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
}

/// `$AERIE_SGLANG_PYTHON` when `import sglang` works there; `None` with a note otherwise (a
/// failure under `CI=true`: CI installs python/requirements-sglang.txt).
pub fn sglang_python(test: &str) -> Option<PathBuf> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let Some(py) = std::env::var_os("AERIE_SGLANG_PYTHON").map(PathBuf::from) else {
        assert!(
            !ci,
            "{test}: AERIE_SGLANG_PYTHON is unset but CI=true: CI must run the SGLang checks (.ci/run sets it)"
        );
        println!(
            "note: {test} skipped: set AERIE_SGLANG_PYTHON to a Python with python/requirements-sglang.txt installed"
        );
        return None;
    };
    let out = Command::new(&py).args(["-c", "import sglang; print(sglang.__version__)"]).output();
    match out {
        Ok(o) if o.status.success() => Some(py),
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or_default().to_string();
            assert!(!ci, "{test}: CI=true but $AERIE_SGLANG_PYTHON cannot import sglang: {why}");
            println!("note: {test} skipped: $AERIE_SGLANG_PYTHON cannot import sglang ({why})");
            None
        }
        Err(e) => {
            assert!(!ci, "{test}: CI=true but $AERIE_SGLANG_PYTHON ({}) does not run: {e}", py.display());
            println!("note: {test} skipped: $AERIE_SGLANG_PYTHON does not run ({e})");
            None
        }
    }
}

/// SGLang's server on a loopback port.
pub struct SglangServer {
    pub child: Child,
    pub port: u16,
    pub url: String,
    pub log: PathBuf,
}

impl Drop for SglangServer {
    fn drop(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}

impl SglangServer {
    /// `python -m aerie_serve sglang --model-path MODEL --dtype float32` with [`CPU_ARGS`] and
    /// `extra`; returns once `/v1/models` answers (at most 600 s), its output in `dir/NAME.log`.
    pub fn start(python: &Path, model: &Path, dir: &Path, name: &str, extra: &[&str]) -> SglangServer {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let mut c = Command::new(python);
        sglang_env(&mut c)
            .args(["-m", "aerie_serve", "sglang", "--model-path", super::common::s(model)])
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--dtype", "float32"])
            .args(["--context-length", "2048"])
            .args(CPU_ARGS)
            .args(extra)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::options().append(true).open(&log).unwrap()))
            .process_group(0);
        let child = c.spawn().expect("start python -m aerie_serve sglang");
        let mut server = SglangServer { child, port, url: format!("http://127.0.0.1:{port}"), log };
        let t0 = Instant::now();
        while !answers(port, "/v1/models") {
            let tail = || {
                let text = std::fs::read_to_string(&server.log).unwrap_or_default();
                text.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
            };
            assert!(server.child.try_wait().unwrap().is_none(), "the SGLang server exited:\n{}", tail());
            assert!(t0.elapsed() < Duration::from_secs(600), "the SGLang server did not answer in 600 s:\n{}", tail());
            std::thread::sleep(Duration::from_millis(500));
        }
        println!("SGLang server {name} up in {:.0} s", t0.elapsed().as_secs_f64());
        server
    }
}
