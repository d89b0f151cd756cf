//! Which engine a running server is, and the model it serves, by one rule for every command that
//! talks to a server it did not start (`regenerate --server`, `measure --server`):
//!
//! 1. `GET /get_model_info` answering 200 is SGLang (only SGLang serves it; it also serves
//!    `/v1/models`, so it is asked first), and its `model_path` names the model;
//! 2. else `GET /v1/models` answering 200 with a `data` list of model cards is an
//!    OpenAI-compatible server, and vLLM when its first card is `owned_by: "vllm"` (vLLM's
//!    `ModelCard` default, `vllm/entrypoints/serve/engine/protocol.py`); the first card's `id`
//!    names the model;
//! 3. else an error saying what each endpoint answered.
//!
//! An engine named by the user (`--api`) is taken as given; only the model is still asked for
//! when the user names none.

use std::time::Duration;

use serde_json::Value;

use crate::http::{agent, error_message, get};
use crate::{Engine, Error, Result};

/// What a server is, as resolved at the start of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// The engine (dialect) to speak.
    pub engine: Engine,
    /// The model to name in requests: the given one, else the server's own.
    pub model: Option<String>,
    /// `given` (named by `--api`) or `detected`.
    pub source: &'static str,
}

/// Resolve the engine (`given`, or ask the server at `base_url`) and the model (`model`, or ask).
pub fn detect(base_url: &str, given: Option<Engine>, model: Option<&str>) -> Result<Detected> {
    let base = base_url.trim_end_matches('/');
    let agent = agent(Duration::from_secs(30));
    let source = if given.is_some() { "given" } else { "detected" };
    let server = |message: String| Error::Server { url: base.to_string(), status: None, message };
    let info_url = format!("{base}/get_model_info");
    let info = if given.is_none() || given == Some(Engine::Sglang) { Some(get(&agent, &info_url)) } else { None };
    let sglang = match (&info, given) {
        (Some(Err(e)), None) => {
            return Err(server(format!("GET {info_url} failed ({e}): is the server running and listening there?")));
        }
        (Some(Ok((200, _))), None) => true,
        (_, g) => g == Some(Engine::Sglang),
    };
    if sglang {
        let from_server = || {
            let (status, body) = info?.ok()?;
            let v: Value = (status == 200).then(|| serde_json::from_str(&body).ok())??;
            v.get("model_path")?.as_str().map(str::to_owned)
        };
        let model = model.map(str::to_owned).or_else(from_server);
        return Ok(Detected { engine: Engine::Sglang, model, source });
    }
    let url = format!("{base}/v1/models");
    let listed = || -> Result<Value> {
        let (status, body) = get(&agent, &url)
            .map_err(|e| server(format!("GET {url} failed ({e}): is the server running and listening there?")))?;
        let first = (status == 200)
            .then(|| serde_json::from_str::<Value>(&body).ok())
            .flatten()
            .and_then(|v| v.get("data")?.get(0).cloned())
            .filter(|card| card.get("id").is_some_and(Value::is_string));
        first.ok_or_else(|| {
            server(format!(
                "answers as none of SGLang (GET {info_url}), vLLM or an OpenAI-compatible server (GET {url}: HTTP \
                 {status} without a model id: {}); name it with --api if it is one, and the model with --model",
                error_message(&body)
            ))
        })
    };
    // The model list is needed to detect vLLM, or to name the model when none is given.
    let card = if given.is_none() || model.is_none() { Some(listed()?) } else { None };
    let engine = match given {
        Some(e) => e,
        None if card.as_ref().and_then(|c| c.get("owned_by")).and_then(Value::as_str) == Some("vllm") => Engine::Vllm,
        None => Engine::Openai,
    };
    let model = model.map(str::to_owned).or_else(|| card?.get("id")?.as_str().map(str::to_owned));
    Ok(Detected { engine, model, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback server answering each path with a fixed (status, body).
    fn fake(routes: &'static [(&'static str, u16, &'static str)]) -> String {
        crate::fake::serve(|_, path| {
            let (status, body) = routes.iter().find(|r| r.0 == path).map_or((404, "not here"), |r| (r.1, r.2));
            (status, body.to_owned())
        })
    }

    #[test]
    fn one_rule_for_each_engine_and_a_clear_error_for_none() {
        let sglang = fake(&[("/get_model_info", 200, r#"{"model_path": "/m/qwen"}"#), ("/v1/models", 200, "{}")]);
        let d = detect(&sglang, None, None).unwrap();
        assert_eq!((d.engine, d.model.as_deref(), d.source), (Engine::Sglang, Some("/m/qwen"), "detected"));
        let vllm = fake(&[("/v1/models", 200, r#"{"data": [{"id": "target", "owned_by": "vllm"}]}"#)]);
        let d = detect(&vllm, None, None).unwrap();
        assert_eq!((d.engine, d.model.as_deref()), (Engine::Vllm, Some("target")));
        let d = detect(&vllm, Some(Engine::Openai), Some("m")).unwrap();
        assert_eq!((d.engine, d.model.as_deref(), d.source), (Engine::Openai, Some("m"), "given"));
        let other = fake(&[("/v1/models", 200, r#"{"data": [{"id": "llama", "owned_by": "llamacpp"}]}"#)]);
        assert_eq!(detect(&other, None, None).unwrap().engine, Engine::Openai);
        let none = fake(&[]);
        let e = detect(&none, None, None).unwrap_err().to_string();
        assert!(e.contains("none of SGLang") && e.contains("HTTP 404") && e.contains("--api"), "{e}");
    }
}
