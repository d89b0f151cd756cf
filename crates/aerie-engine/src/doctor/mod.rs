//! `aerie doctor`: the serving engine's own configuration, read from the running server, checked
//! against the failures that cost a drafter its speed without an error or a warning.
//!
//! Three parts, so the rules stay pure and testable on recorded bodies:
//! - what a server says about itself ([`ServerConfig`]): SGLang's `/server_info` (its resolved
//!   `ServerArgs`, the launch command and each scheduler's internal state) and `/model_info`
//!   ([`sglang`]); vLLM's `/version`, `/v1/models`, `/metrics`, its development `/server_info` and,
//!   where the server runs on this machine, the command line of the process listening on its
//!   port ([`vllm`]). Everything that could not be read is listed in [`ServerConfig::unread`];
//! - what the drafter is ([`Drafter`], filled by aerie-hub from the drafter's config: aerie-engine
//!   never parses a checkpoint);
//! - the rules ([`rules`]): pure functions of the two, each a list of [`Finding`]s (what is wrong,
//!   what to change, the public report it comes from) or the reason it could not check.

pub mod rules;
pub mod sglang;
pub mod vllm;

use std::time::Duration;

use aerie_data::shard::AuxConvention;
use serde::Serialize;

use crate::http::agent;
use crate::{Engine, Result};

/// How bad a finding is. Only errors make `aerie doctor` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Speculation is broken or runs another drafter than the one trained (accept length
    /// collapses, features from the wrong layers): fix before measuring anything.
    Error,
    /// Speculation runs but slower than it could, or on a path known to fail elsewhere.
    Warning,
    /// Worth knowing when reading the engine's numbers; nothing to change.
    Info,
}

/// One known failure found in the configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Stable kebab-case id of the rule (`eagle-not-eagle3`, ...), for scripts.
    pub rule: &'static str,
    /// Error, warning or info.
    pub severity: Severity,
    /// What is wrong, with the values read.
    pub what: String,
    /// What to change.
    pub fix: String,
    /// The public report (issue, pull request, source file) the rule comes from.
    pub source: &'static str,
}

/// A rule that could not run, and why (a value the server did not say, no drafter given).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotChecked {
    /// The rule's id.
    pub rule: &'static str,
    /// What it needed and did not have.
    pub why: String,
}

/// Something about the server that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unread {
    /// What (an endpoint, a field, the command line).
    pub what: String,
    /// Why not.
    pub why: String,
}

/// A setting whose absence means "the same as the target's" in the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "how", content = "value")]
pub enum Knob {
    /// Not read.
    Unknown,
    /// Not set: the engine uses the target's (the value it resolved to, when it says).
    Inherited(Option<String>),
    /// Set explicitly (None: explicitly none, e.g. `unquant`).
    Explicit(Option<String>),
}

/// What a running server says about its own configuration. `None` is "not read" (and listed in
/// [`ServerConfig::unread`]); the engine's own spellings are kept (`EAGLE3`, `eagle3`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerConfig {
    /// The engine.
    pub engine: Engine,
    /// The base URL asked.
    pub url: String,
    /// The engine's version.
    pub version: Option<String>,
    /// The served model (path or name).
    pub model: Option<String>,
    /// The target's `architectures`.
    pub target_architectures: Vec<String>,
    /// `cpu`, `cuda`, ...
    pub device: Option<String>,
    /// The speculative algorithm or method (`EAGLE3`, `EAGLE`, `eagle3`); `None` with
    /// [`ServerConfig::speculating`] false when the server does not speculate.
    pub algorithm: Option<String>,
    /// Whether the server speculates at all (None: not known).
    pub speculating: Option<bool>,
    /// Draft steps per cycle (SGLang `speculative_num_steps`, vLLM `num_speculative_tokens`).
    pub num_steps: Option<u64>,
    /// SGLang `speculative_eagle_topk`.
    pub eagle_topk: Option<u64>,
    /// SGLang `speculative_num_draft_tokens`.
    pub num_draft_tokens: Option<u64>,
    /// The drafter the server loaded (path or hub id).
    pub draft_model_path: Option<String>,
    /// The target's attention backend (SGLang `attention_backend`, vLLM's attention config).
    pub attention_backend: Option<String>,
    /// SGLang `prefill_attention_backend` (None: the same as `attention_backend`).
    pub prefill_attention_backend: Option<String>,
    /// SGLang `decode_attention_backend` (None: the same as `attention_backend`).
    pub decode_attention_backend: Option<String>,
    /// The drafter's attention backend (SGLang `speculative_draft_attention_backend`, vLLM
    /// `speculative_config.attention_backend`).
    pub draft_attention_backend: Knob,
    /// SGLang `speculative_attention_mode` (`prefill`: verify and draft extend run on the prefill
    /// backend; `decode`).
    pub speculative_attention_mode: Option<String>,
    /// The target's quantization (`--quantization`; None also when the checkpoint's own is used).
    pub quantization: Option<String>,
    /// The drafter's quantization (SGLang `speculative_draft_model_quantization`).
    pub draft_quantization: Knob,
    /// Whether CUDA graphs are off for decode, hence for the verify pass (SGLang
    /// `disable_cuda_graph` or `disable_decode_cuda_graph`, vLLM `enforce_eager` or cudagraph
    /// mode NONE).
    pub cuda_graph_disabled: Option<bool>,
    /// The largest batch the decode (and verify) graphs were captured for (SGLang
    /// `cuda_graph_max_bs_decode`, older `cuda_graph_max_bs`); for vLLM the largest captured size
    /// in tokens (`max_cudagraph_capture_size`).
    pub cuda_graph_max_bs: Option<u64>,
    /// Whether [`ServerConfig::cuda_graph_max_bs`] counts tokens (vLLM) rather than requests.
    pub cuda_graph_counts_tokens: bool,
    /// The most requests the server runs at once (SGLang `max_running_requests`, vLLM
    /// `max_num_seqs`).
    pub max_running_requests: Option<u64>,
    /// SGLang's `avg_spec_accept_length`, per data-parallel rank.
    pub avg_spec_accept_length: Vec<f64>,
    /// The command line the server was started with (SGLang `launch_command`; vLLM the listening
    /// process's command line, when local).
    pub launch_command: Option<String>,
    /// Where each value came from (endpoints and the command line that answered).
    pub read: Vec<String>,
    /// What could not be read, and why.
    pub unread: Vec<Unread>,
}

impl ServerConfig {
    /// An empty record for `engine` at `url`: every value unread.
    pub fn empty(engine: Engine, url: &str) -> Self {
        ServerConfig {
            engine,
            url: url.trim_end_matches('/').to_string(),
            version: None,
            model: None,
            target_architectures: Vec::new(),
            device: None,
            algorithm: None,
            speculating: None,
            num_steps: None,
            eagle_topk: None,
            num_draft_tokens: None,
            draft_model_path: None,
            attention_backend: None,
            prefill_attention_backend: None,
            decode_attention_backend: None,
            draft_attention_backend: Knob::Unknown,
            speculative_attention_mode: None,
            quantization: None,
            draft_quantization: Knob::Unknown,
            cuda_graph_disabled: None,
            cuda_graph_max_bs: None,
            cuda_graph_counts_tokens: false,
            max_running_requests: None,
            avg_spec_accept_length: Vec::new(),
            launch_command: None,
            read: Vec::new(),
            unread: Vec::new(),
        }
    }

    /// Note that `what` could not be read because `why`.
    pub fn unread(&mut self, what: impl Into<String>, why: impl Into<String>) {
        self.unread.push(Unread { what: what.into(), why: why.into() });
    }

    /// The attention backends the target runs (the split prefill/decode ones, else the one).
    pub fn target_backends(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for b in [&self.prefill_attention_backend, &self.decode_attention_backend, &self.attention_backend] {
            if let Some(b) = b.as_deref()
                && !out.contains(&b)
            {
                out.push(b);
            }
        }
        out
    }
}

/// What the doctor needs to know about the drafter: read from its `config.json` (aerie-hub's
/// `doctor::drafter`), never from the weights.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drafter {
    /// The directory read.
    pub path: String,
    /// `architectures`, as written.
    pub architectures: Vec<String>,
    /// `model_type`, as written.
    pub model_type: Option<String>,
    /// Whether its attention is multi-latent (DeepSeek MLA) rather than Llama's.
    pub mla: bool,
    /// `quantization_config.quant_method` (None: unquantized).
    pub quantization: Option<String>,
    /// The layout's name (`sglang`: ids under `eagle_config`; `speculators`: top-level ids).
    pub layout: String,
    /// The aux layer ids as written (empty when the config has none).
    pub aux_ids: Vec<usize>,
    /// The convention the written ids are in (output-of-layer for the SGLang layout,
    /// input-of-layer for speculators).
    pub aux_convention: AuxConvention,
}

/// Options of a diagnosis.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The number of requests the server will run at once in the measurement or deployment
    /// (else its own `max_running_requests`).
    pub concurrency: Option<u64>,
}

/// Everything `aerie doctor` found; `Serialize` for `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    /// What the server said.
    pub server: ServerConfig,
    /// The drafter checked against it, when one was given or the server's is on this machine.
    pub drafter: Option<Drafter>,
    /// The findings, errors first.
    pub findings: Vec<Finding>,
    /// The rules that could not run.
    pub not_checked: Vec<NotChecked>,
}

impl Diagnosis {
    /// Number of error findings.
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }

    /// The process exit code: 2 when an error was found, else 0 (warnings and what could not be
    /// read do not fail it).
    pub fn exit_code(&self) -> i32 {
        if self.errors() > 0 { 2 } else { 0 }
    }
}

/// Run every rule over `server` and `drafter`.
pub fn diagnose(server: ServerConfig, drafter: Option<Drafter>, options: Options) -> Diagnosis {
    let mut findings = Vec::new();
    let mut not_checked = Vec::new();
    for (rule, check) in rules::ALL {
        match check(&server, drafter.as_ref(), options) {
            Ok(f) => findings.extend(f),
            Err(why) => not_checked.push(NotChecked { rule, why }),
        }
    }
    findings.sort_by_key(|f| f.severity);
    Diagnosis { server, drafter, findings, not_checked }
}

/// Read the configuration of the server at `base_url`: `engine` as given, else detected
/// ([`crate::detect`]). Fails only when the server cannot be reached or is neither SGLang nor
/// vLLM; every value it does not tell is listed in [`ServerConfig::unread`].
pub fn read_server(base_url: &str, engine: Option<Engine>) -> Result<ServerConfig> {
    let engine = match engine {
        Some(e) => e,
        None => crate::detect::detect(base_url, None, Some("-"))?.engine,
    };
    let agent = agent(Duration::from_secs(30));
    match engine {
        Engine::Sglang => Ok(sglang::read(&agent, base_url)),
        Engine::Vllm => Ok(vllm::read(&agent, base_url)),
        Engine::Openai => Err(crate::Error::Incompatible(format!(
            "{base_url} answers as an OpenAI-compatible server that is neither SGLang nor vLLM: aerie doctor \
             reads SGLang's /server_info or vLLM's configuration (name the engine with --api if it is one)"
        ))),
    }
}

/// `v` as an unsigned integer (JSON number or numeric string).
pub(crate) fn as_u64(v: &serde_json::Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.trim().parse().ok())
}

/// `v` as a non-empty string (numbers and booleans spelled out; null and "" are None).
pub(crate) fn as_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
