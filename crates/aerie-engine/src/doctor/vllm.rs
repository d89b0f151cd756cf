//! vLLM's account of its configuration. vLLM has no endpoint for its arguments in production:
//! `GET /version` gives its version, `/v1/models` the served model, `/metrics` whether it
//! speculates (`vllm:spec_decode_*` counters exist only then); its `/server_info?config_format=json`
//! (the whole `VllmConfig`) answers only with `VLLM_SERVER_DEV_MODE=1`. Where the server listens
//! on this machine, the command line of the process holding its port (`/proc/net/tcp*`, then the
//! process whose descriptors hold that socket) gives the rest: `--speculative-config`
//! (`-sc`, JSON or dotted keys), `--quantization`, `--enforce-eager`, `--max-num-seqs`,
//! `--max-cudagraph-capture-size`, `--compilation-config` (`-cc`), `--attention-backend`,
//! `--device` (names of vLLM 0.32's `engine/arg_utils.py`). A value set nowhere is left unread:
//! vLLM's defaults depend on the machine.

use std::path::Path;

use serde_json::Value;

use super::{Knob, ServerConfig, as_string, as_u64};
use crate::Engine;
use crate::http::{error_message, get};

/// Read the server at `base_url` (never fails: what cannot be read is listed as unread).
pub fn read(agent: &ureq::Agent, base_url: &str) -> ServerConfig {
    let mut cfg = ServerConfig::empty(Engine::Vllm, base_url);
    let base = cfg.url.clone();
    let fetch = |path: &str| -> Result<String, String> {
        match get(agent, &format!("{base}{path}")) {
            Ok((200, body)) => Ok(body),
            Ok((status, body)) => Err(format!("HTTP {status} {}", error_message(&body))),
            Err(e) => Err(e),
        }
    };
    let json =
        |body: Result<String, String>| body.and_then(|b| serde_json::from_str::<Value>(&b).map_err(|e| e.to_string()));
    match json(fetch("/version")) {
        Ok(v) => {
            cfg.version = v.get("version").and_then(as_string);
            cfg.read.push("GET /version".into());
        }
        Err(why) => cfg.unread("the version (/version)", why),
    }
    match json(fetch("/v1/models")) {
        Ok(v) => {
            let card = v.get("data").and_then(|d| d.get(0));
            cfg.model = card.and_then(|c| c.get("root").or_else(|| c.get("id"))).and_then(as_string);
            cfg.read.push("GET /v1/models".into());
        }
        Err(why) => cfg.unread("the served model (/v1/models)", why),
    }
    match fetch("/metrics") {
        Ok(text) => {
            apply_metrics(&mut cfg, &text);
            cfg.read.push("GET /metrics".into());
        }
        Err(why) => cfg.unread("whether it speculates (/metrics)", why),
    }
    match json(fetch("/server_info?config_format=json")) {
        Ok(v) => {
            apply_vllm_config(&mut cfg, v.get("vllm_config").unwrap_or(&Value::Null));
            cfg.read.push("GET /server_info?config_format=json".into());
        }
        Err(why) => {
            cfg.unread("the engine's configuration (/server_info, served only with VLLM_SERVER_DEV_MODE=1)", why)
        }
    }
    match local_command_line(&base) {
        Ok((pid, argv)) => {
            cfg.read.push(format!("the command line of process {pid} (listening on the server's port)"));
            apply_command_line(&mut cfg, &argv);
        }
        Err(why) => cfg.unread("the server's command line", why),
    }
    for (what, missing) in [
        (
            "the draft method and tokens (--speculative-config)",
            cfg.algorithm.is_none() && cfg.speculating != Some(false),
        ),
        ("the CUDA-graph settings (--enforce-eager, --max-cudagraph-capture-size)", cfg.cuda_graph_disabled.is_none()),
        ("the batch limit (--max-num-seqs)", cfg.max_running_requests.is_none()),
    ] {
        if missing {
            cfg.unread(what, "set neither in the readable configuration nor on a readable command line");
        }
    }
    cfg
}

/// Whether `/metrics` carries the speculative-decoding counters.
pub fn apply_metrics(cfg: &mut ServerConfig, text: &str) {
    let spec = text.lines().any(|l| !l.starts_with('#') && l.starts_with("vllm:spec_decode_num_drafts"));
    cfg.speculating = Some(spec || cfg.speculating == Some(true));
}

/// Fill `cfg` from a `VllmConfig` dumped as JSON (`/server_info?config_format=json`).
pub fn apply_vllm_config(cfg: &mut ServerConfig, v: &Value) {
    let at = |path: &[&str]| path.iter().try_fold(v, |x, k| x.get(k)).filter(|x| !x.is_null());
    if let Some(spec) = at(&["speculative_config"]) {
        apply_speculative(cfg, spec);
    } else if v.get("speculative_config").is_some() {
        cfg.speculating = Some(false);
    }
    if let Some(q) = at(&["model_config", "quantization"]).and_then(as_string) {
        cfg.quantization = Some(q);
    }
    if let Some(d) = at(&["device_config", "device"]).and_then(as_string) {
        cfg.device = Some(d);
    }
    if let Some(b) = at(&["attention_config", "backend"]).and_then(as_string) {
        cfg.attention_backend = Some(b);
    }
    let eager = at(&["model_config", "enforce_eager"]).and_then(Value::as_bool);
    let mode_none =
        at(&["compilation_config", "cudagraph_mode"]).and_then(as_string).map(|m| m.to_uppercase().ends_with("NONE"));
    if eager.is_some() || mode_none.is_some() {
        cfg.cuda_graph_disabled = Some(eager == Some(true) || mode_none == Some(true));
    }
    if let Some(n) = at(&["compilation_config", "max_cudagraph_capture_size"]).and_then(as_u64) {
        cfg.cuda_graph_max_bs = Some(n);
        cfg.cuda_graph_counts_tokens = true;
    }
    if let Some(n) = at(&["scheduler_config", "max_num_seqs"]).and_then(as_u64) {
        cfg.max_running_requests = Some(n);
    }
}

/// A `speculative_config` object (JSON of `--speculative-config`, or the dumped config).
fn apply_speculative(cfg: &mut ServerConfig, spec: &Value) {
    cfg.speculating = Some(true);
    if let Some(m) = spec.get("method").and_then(as_string) {
        cfg.algorithm = Some(m);
    }
    if let Some(k) = spec.get("num_speculative_tokens").and_then(as_u64) {
        cfg.num_steps = Some(k);
    }
    if let Some(m) = spec.get("model").and_then(as_string) {
        cfg.draft_model_path = Some(m);
    }
    cfg.draft_attention_backend = match spec.get("attention_backend").and_then(as_string) {
        Some(b) => Knob::Explicit(Some(b)),
        None => Knob::Inherited(None),
    };
    cfg.draft_quantization = match spec.get("quantization").and_then(as_string) {
        Some(q) => Knob::Explicit(Some(q)),
        None => Knob::Explicit(None),
    };
}

/// Fill `cfg` from the server process's argv.
pub fn apply_command_line(cfg: &mut ServerConfig, argv: &[String]) {
    cfg.launch_command = Some(argv.join(" "));
    let mut spec = serde_json::Map::new();
    let mut i = 0;
    while i < argv.len() {
        let (flag, inline) = match argv[i].split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f.replace('_', "-"), Some(v.to_string())),
            _ => (argv[i].replace('_', "-"), None),
        };
        let takes_value = inline.is_none() && argv.get(i + 1).is_some_and(|n| !n.starts_with("--"));
        let value = inline.clone().or_else(|| takes_value.then(|| argv[i + 1].clone()));
        let consumed = if inline.is_none() && takes_value { 2 } else { 1 };
        match flag.as_str() {
            "--speculative-config" | "-sc" => {
                if let Some(v) = value.as_deref().and_then(|v| serde_json::from_str::<Value>(v).ok())
                    && let Some(o) = v.as_object()
                {
                    spec.extend(o.clone());
                }
            }
            f if f.starts_with("--speculative-config.") => {
                let key = f["--speculative-config.".len()..].replace('-', "_");
                if let Some(v) = value {
                    spec.insert(key, serde_json::from_str(&v).unwrap_or(Value::String(v)));
                }
            }
            "--quantization" | "-q" => cfg.quantization = value,
            "--attention-backend" => cfg.attention_backend = value,
            "--device" => cfg.device = value,
            "--enforce-eager" => {
                let on = inline.as_deref().is_none_or(|v| v != "false");
                cfg.cuda_graph_disabled = Some(on || cfg.cuda_graph_disabled == Some(true));
                i += 1;
                continue;
            }
            "--max-num-seqs" => cfg.max_running_requests = value.as_deref().and_then(|v| v.parse().ok()),
            "--max-cudagraph-capture-size" => {
                cfg.cuda_graph_max_bs = value.as_deref().and_then(|v| v.parse().ok());
                cfg.cuda_graph_counts_tokens = true;
            }
            "--compilation-config" | "-cc" => {
                if let Some(v) = value.as_deref().and_then(|v| serde_json::from_str::<Value>(v).ok()) {
                    apply_vllm_config(cfg, &serde_json::json!({ "compilation_config": v }));
                }
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += consumed;
    }
    if !spec.is_empty() {
        apply_speculative(cfg, &Value::Object(spec));
    } else if cfg.speculating.is_none() {
        cfg.speculating = Some(false);
    }
    if cfg.cuda_graph_disabled.is_none() && argv.iter().any(|a| a.starts_with("--max-cudagraph") || a == "-cc") {
        cfg.cuda_graph_disabled = Some(false);
    }
}

/// The pid and argv of the local process listening on `base_url`'s port (Linux `/proc`).
pub fn local_command_line(base_url: &str) -> Result<(u32, Vec<String>), String> {
    let rest = base_url.split_once("://").map_or(base_url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let (host, port) = authority.rsplit_once(':').ok_or_else(|| format!("{base_url} names no port"))?;
    let host = host.trim_matches(['[', ']']);
    if !["127.0.0.1", "localhost", "0.0.0.0", "::1", "::"].contains(&host) {
        return Err(format!("the server is not on this machine ({host})"));
    }
    let port: u16 = port.parse().map_err(|_| format!("{port} is not a port"))?;
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return Err(format!("no socket listening on port {port} in /proc/net/tcp*"));
    }
    let procs = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .ok()
                .is_some_and(|l| inodes.iter().any(|i| l == Path::new(&format!("socket:[{i}]"))))
        });
        if holds {
            let raw = std::fs::read(entry.path().join("cmdline")).map_err(|e| format!("/proc/{pid}/cmdline: {e}"))?;
            let argv = raw
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            return Ok((pid, argv));
        }
    }
    Err(format!("no readable process holds the socket listening on port {port} (another user's?)"))
}

/// Socket inodes in LISTEN state (`0A`) on `port`, from a `/proc/net/tcp` table.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let local_port = cols.get(1)?.rsplit_once(':')?.1;
            (u16::from_str_radix(local_port, 16).ok()? == port && *cols.get(3)? == "0A")
                .then(|| cols.get(9).map(|s| s.to_string()))?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn the_command_line_gives_the_speculative_config_and_the_graph_limits() {
        let mut cfg = ServerConfig::empty(Engine::Vllm, "http://127.0.0.1:8000");
        apply_command_line(
            &mut cfg,
            &argv(
                r#"python -m aerie_serve vllm serve /m/k25 --tensor-parallel-size 8 --speculative-config {"method":"eagle3","model":"/d/mla","num_speculative_tokens":3} --max-num-seqs=64 --max-cudagraph-capture-size 128 -q fp8"#,
            ),
        );
        assert_eq!(
            (cfg.algorithm.as_deref(), cfg.num_steps, cfg.draft_model_path.as_deref()),
            (Some("eagle3"), Some(3), Some("/d/mla"))
        );
        assert_eq!(
            (cfg.max_running_requests, cfg.cuda_graph_max_bs, cfg.cuda_graph_counts_tokens),
            (Some(64), Some(128), true)
        );
        assert_eq!(
            (cfg.quantization.as_deref(), cfg.cuda_graph_disabled, cfg.speculating),
            (Some("fp8"), Some(false), Some(true))
        );
        assert_eq!(cfg.draft_attention_backend, Knob::Inherited(None));

        let mut eager = ServerConfig::empty(Engine::Vllm, "http://127.0.0.1:8000");
        apply_command_line(
            &mut eager,
            &argv(
                "vllm serve /m --enforce-eager --speculative-config.method eagle --speculative_config.num_speculative_tokens 2",
            ),
        );
        assert_eq!(
            (eager.algorithm.as_deref(), eager.num_steps, eager.cuda_graph_disabled),
            (Some("eagle"), Some(2), Some(true))
        );
    }

    #[test]
    fn the_listening_socket_is_found_in_a_proc_net_tcp_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0\n\
            1: 0100007F:1F40 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 100 0 0 10 0\n";
        assert_eq!(listening_inodes(table, 8000), ["4242"]);
        assert!(listening_inodes(table, 8001).is_empty());
        assert!(local_command_line("http://10.0.0.5:8000").unwrap_err().contains("not on this machine"));
    }
}
