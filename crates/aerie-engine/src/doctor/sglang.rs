//! SGLang's own account of its configuration. `GET /server_info` (SGLang 0.5.23; older versions
//! and this one also answer the deprecated `/get_server_info`) returns `ServerArgs.resolved_dict()`:
//! every field under its `ServerArgs` name (`srt/arg_groups/fields/*.py`) with the values
//! resolution gave it, plus `launch_command` (what was asked for), `version` and
//! `internal_states` (one per data-parallel rank: `avg_spec_accept_length`,
//! `effective_max_running_requests_per_dp`). `GET /model_info` (`/get_model_info`) names the
//! target's `architectures`.
//!
//! The fields read, by rule: `speculative_algorithm`, `speculative_num_steps`,
//! `speculative_eagle_topk`, `speculative_num_draft_tokens`, `speculative_draft_model_path`;
//! `attention_backend`, `prefill_attention_backend`, `decode_attention_backend`,
//! `speculative_attention_mode`, `speculative_draft_attention_backend` (null: the draft runs the
//! target's backends, `speculative/draft_utils.py`); `quantization`,
//! `speculative_draft_model_quantization` with `_speculative_draft_quantization_explicitly_set`
//! (unset, the draft takes the target's: `arg_groups/serving_hook.py`); `device`,
//! `disable_cuda_graph`, `disable_decode_cuda_graph`, `cuda_graph_config.decode` (`backend`,
//! `max_bs`; before it, `cuda_graph_max_bs`), `max_running_requests`.

use serde_json::Value;

use super::{Knob, ServerConfig, as_string, as_u64};
use crate::Engine;
use crate::http::{error_message, get};

/// Read the server at `base_url` (never fails: what cannot be read is listed as unread).
pub fn read(agent: &ureq::Agent, base_url: &str) -> ServerConfig {
    let mut cfg = ServerConfig::empty(Engine::Sglang, base_url);
    let base = cfg.url.clone();
    match first_json(agent, &base, &["/server_info", "/get_server_info"]) {
        Ok((path, info)) => {
            cfg.read.push(format!("GET {path}"));
            apply_server_info(&mut cfg, &info);
        }
        Err(why) => cfg.unread("the server's arguments (/server_info, /get_server_info)", why),
    }
    match first_json(agent, &base, &["/model_info", "/get_model_info"]) {
        Ok((path, info)) => {
            cfg.read.push(format!("GET {path}"));
            apply_model_info(&mut cfg, &info);
        }
        Err(why) => cfg.unread("the target's architectures (/model_info, /get_model_info)", why),
    }
    cfg
}

/// The first of `paths` under `base` that answers 200 with JSON, as (path, body); else why not.
fn first_json(agent: &ureq::Agent, base: &str, paths: &[&str]) -> Result<(String, Value), String> {
    let mut tried = Vec::new();
    for path in paths {
        match get(agent, &format!("{base}{path}")) {
            Ok((200, body)) => match serde_json::from_str(&body) {
                Ok(v) => return Ok((path.to_string(), v)),
                Err(e) => tried.push(format!("{path}: HTTP 200 but not JSON ({e})")),
            },
            Ok((status, body)) => tried.push(format!("{path}: HTTP {status} {}", error_message(&body))),
            Err(e) => tried.push(format!("{path}: {e}")),
        }
    }
    Err(tried.join("; "))
}

/// Fill `cfg` from a `/server_info` body.
pub fn apply_server_info(cfg: &mut ServerConfig, info: &Value) {
    let mut missing: Vec<&str> = Vec::new();
    let mut string = |key: &'static str| -> Option<String> {
        if info.get(key).is_none() {
            missing.push(key);
        }
        info.get(key).and_then(as_string)
    };
    cfg.version = string("version");
    cfg.model = string("model_path");
    cfg.device = string("device");
    cfg.algorithm = string("speculative_algorithm");
    cfg.draft_model_path = string("speculative_draft_model_path");
    cfg.attention_backend = string("attention_backend");
    cfg.prefill_attention_backend = string("prefill_attention_backend");
    cfg.decode_attention_backend = string("decode_attention_backend");
    cfg.speculative_attention_mode = string("speculative_attention_mode");
    cfg.quantization = string("quantization");
    cfg.launch_command = string("launch_command");
    cfg.speculating = info.get("speculative_algorithm").map(|v| !v.is_null());
    let int = |key: &str| info.get(key).and_then(as_u64);
    cfg.num_steps = int("speculative_num_steps");
    cfg.eagle_topk = int("speculative_eagle_topk");
    cfg.num_draft_tokens = int("speculative_num_draft_tokens");

    cfg.draft_attention_backend = match info.get("speculative_draft_attention_backend") {
        None => Knob::Unknown,
        Some(v) => match as_string(v) {
            Some(b) => Knob::Explicit(Some(b)),
            None => Knob::Inherited(None),
        },
    };
    cfg.draft_quantization = match info.get("speculative_draft_model_quantization") {
        None => Knob::Unknown,
        Some(v) => {
            let value = as_string(v).filter(|q| q != "unquant");
            match info.get("_speculative_draft_quantization_explicitly_set").and_then(Value::as_bool) {
                Some(true) => Knob::Explicit(value),
                // Without the provenance field (older SGLang) a value equal to the target's is
                // the inherited default of `_handle_missing_default_values`.
                Some(false) => Knob::Inherited(value),
                None if value == cfg.quantization => Knob::Inherited(value),
                None => Knob::Explicit(value),
            }
        }
    };

    // CUDA graphs of the decode step (the verify pass replays them: the decode runner captures
    // TARGET_VERIFY too, `model_executor/runner/decode_cuda_graph_runner.py`).
    let decode_graph = info.get("cuda_graph_config").and_then(|c| c.get("decode"));
    let flag = |key: &str| info.get(key).and_then(Value::as_bool);
    let backend_off = decode_graph.and_then(|d| d.get("backend")).and_then(Value::as_str).map(|b| b == "disabled");
    let flags = [flag("disable_cuda_graph"), flag("disable_decode_cuda_graph"), backend_off];
    cfg.cuda_graph_disabled = if flags.iter().all(Option::is_none) { None } else { Some(flags.contains(&Some(true))) };
    if cfg.cuda_graph_disabled.is_none() {
        missing.push("disable_cuda_graph");
    }
    cfg.cuda_graph_max_bs = decode_graph
        .and_then(|d| d.get("max_bs"))
        .and_then(as_u64)
        .or_else(|| int("cuda_graph_max_bs_decode"))
        .or_else(|| int("cuda_graph_max_bs"));
    if cfg.cuda_graph_max_bs.is_none() && cfg.cuda_graph_disabled != Some(true) {
        missing.push("cuda_graph_config.decode.max_bs (or cuda_graph_max_bs)");
    }

    let states: Vec<&Value> = info.get("internal_states").and_then(Value::as_array).into_iter().flatten().collect();
    cfg.max_running_requests = states
        .iter()
        .filter_map(|s| s.get("effective_max_running_requests_per_dp").and_then(as_u64))
        .max()
        .or_else(|| int("max_running_requests"));
    cfg.avg_spec_accept_length =
        states.iter().filter_map(|s| s.get("avg_spec_accept_length").and_then(Value::as_f64)).collect();
    if !missing.is_empty() {
        cfg.unread(format!("server_info fields {}", missing.join(", ")), "absent from this SGLang's /server_info");
    }
}

/// Fill `cfg` from a `/model_info` body (the target's `architectures`).
pub fn apply_model_info(cfg: &mut ServerConfig, info: &Value) {
    cfg.target_architectures = info
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    if cfg.model.is_none() {
        cfg.model = info.get("model_path").and_then(as_string);
    }
    if cfg.target_architectures.is_empty() {
        cfg.unread("the target's architectures", "/model_info lists none");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn both_endpoints_are_read_and_an_old_server_falls_back_to_get_server_info() {
        let url = crate::fake::serve(|_, path| match path {
            "/get_server_info" => (
                200,
                json!({"version": "0.4.9", "speculative_algorithm": "EAGLE3", "cuda_graph_max_bs": 8,
                       "disable_cuda_graph": false, "speculative_draft_model_quantization": null,
                       "quantization": null, "speculative_draft_attention_backend": null,
                       "internal_states": [{"avg_spec_accept_length": 2.5}]})
                .to_string(),
            ),
            "/get_model_info" => (200, json!({"model_path": "/m", "architectures": ["LlamaForCausalLM"]}).to_string()),
            _ => (404, r#"{"detail": "Not Found"}"#.into()),
        });
        let agent = crate::http::agent(std::time::Duration::from_secs(5));
        let cfg = read(&agent, &url);
        assert_eq!(cfg.read, ["GET /get_server_info", "GET /get_model_info"]);
        assert_eq!(
            (cfg.version.as_deref(), cfg.cuda_graph_max_bs, cfg.cuda_graph_disabled),
            (Some("0.4.9"), Some(8), Some(false))
        );
        assert_eq!(cfg.draft_quantization, Knob::Inherited(None));
        assert_eq!(cfg.draft_attention_backend, Knob::Inherited(None));
        assert_eq!(cfg.avg_spec_accept_length, [2.5]);
        assert_eq!(cfg.target_architectures, ["LlamaForCausalLM"]);
        // What the old server did not say is listed, by name.
        assert!(cfg.unread.iter().any(|u| u.what.contains("device")), "{:?}", cfg.unread);

        let down = read(&agent, "http://127.0.0.1:9");
        assert_eq!(down.unread.len(), 2, "{:?}", down.unread);
        assert!(down.unread[0].why.contains("/server_info") && down.unread[0].why.contains("/get_server_info"));
    }
}
