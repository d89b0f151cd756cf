//! Which engine a running server is, and vLLM's speculative counters read from it.
//!
//! Detection asks each engine's own endpoint: vLLM's `/metrics` carries `vllm:` metrics,
//! SGLang answers `/get_server_info`, any OpenAI-compatible server answers `/v1/models`. A server
//! that answers none of them is an error that says what each endpoint answered.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::counters::{SpecCounters, is_vllm, parse_prometheus, vllm_spec_counters};
use crate::sglang::error_message;
use crate::{Error, Result};

/// The dialect a running server speaks, as far as `aerie measure` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerApi {
    /// SGLang: `meta_info` per response.
    Sglang,
    /// vLLM: Prometheus counters at `/metrics`.
    Vllm,
    /// Any other OpenAI-compatible server: timings only.
    Openai,
}

impl std::str::FromStr for ServerApi {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sglang" => Ok(ServerApi::Sglang),
            "vllm" => Ok(ServerApi::Vllm),
            "openai" => Ok(ServerApi::Openai),
            _ => Err(format!("`{s}` is not a server API: use auto, sglang, vllm or openai")),
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// GET `url`: the status and body, or the transport error's text.
fn get(agent: &ureq::Agent, url: &str) -> std::result::Result<(u16, String), String> {
    let resp = agent.get(url).call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp.into_body().read_to_string().map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// Ask the server at `base_url` which engine it is.
pub fn detect_api(base_url: &str) -> Result<ServerApi> {
    let base = base_url.trim_end_matches('/');
    let agent = agent();
    let mut seen = Vec::new();
    let metrics = format!("{base}/metrics");
    match get(&agent, &metrics) {
        Ok((200, body)) => match parse_prometheus(&body) {
            Ok(samples) if is_vllm(&samples) => return Ok(ServerApi::Vllm),
            Ok(_) => seen.push("GET /metrics: 200 without vllm: metrics".to_string()),
            Err(_) => seen.push("GET /metrics: 200, not Prometheus text".to_string()),
        },
        Ok((status, body)) => seen.push(format!("GET /metrics: HTTP {status} {}", error_message(&body))),
        Err(e) => seen.push(format!("GET /metrics: {e}")),
    }
    for (path, api) in [("/get_server_info", ServerApi::Sglang), ("/v1/models", ServerApi::Openai)] {
        match get(&agent, &format!("{base}{path}")) {
            Ok((200, body)) if serde_json::from_str::<serde_json::Value>(&body).is_ok() => return Ok(api),
            Ok((200, body)) => seen.push(format!("GET {path}: 200 but not JSON: {}", error_message(&body))),
            Ok((status, body)) => seen.push(format!("GET {path}: HTTP {status} {}", error_message(&body))),
            Err(e) => seen.push(format!("GET {path}: {e}")),
        }
    }
    Err(Error::Server {
        url: base.to_string(),
        status: None,
        message: format!(
            "answers as none of vLLM, SGLang or an OpenAI-compatible server ({}); name it with --api if it is one",
            seen.join("; ")
        ),
    })
}

/// vLLM's speculative counters now (all zero on a server without speculation).
pub fn vllm_counters(base_url: &str) -> Result<SpecCounters> {
    let url = format!("{}/metrics", base_url.trim_end_matches('/'));
    let server = |message: String, status: Option<u16>| Error::Server { url: url.clone(), status, message };
    let (status, body) = get(&agent(), &url).map_err(|e| server(e, None))?;
    if status != 200 {
        return Err(server(format!("HTTP {status}: {}", error_message(&body)), Some(status)));
    }
    let samples = parse_prometheus(&body).map_err(|m| server(format!("not Prometheus text: {m}"), Some(status)))?;
    if !is_vllm(&samples) {
        return Err(server("no vllm: metrics: is this a vLLM server?".into(), Some(status)));
    }
    vllm_spec_counters(&samples).map_err(|m| server(m, Some(status)))
}

/// vLLM's counters once two readings half a second apart agree: the engine records a step's
/// statistics as it streams that step's outputs, so the last step's may land just after the
/// last answer arrived.
pub fn settled_vllm_counters(base_url: &str) -> Result<SpecCounters> {
    let mut last = vllm_counters(base_url)?;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(500));
        let now = vllm_counters(base_url)?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_is_none_of_them_is_an_error_saying_what_each_endpoint_answered() {
        // A loopback server that answers every request with 404.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for stream in listener.incoming().take(3) {
                let mut s = stream.unwrap();
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf);
                let _ =
                    s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot here\n");
            }
        });
        let e = detect_api(&url).unwrap_err().to_string();
        assert!(e.contains("none of vLLM, SGLang or an OpenAI-compatible server"), "{e}");
        assert!(e.contains("GET /metrics: HTTP 404") && e.contains("GET /v1/models: HTTP 404"), "{e}");
        assert!(e.contains("--api"), "{e}");
        assert_eq!("VLLM".parse::<ServerApi>(), Ok(ServerApi::Vllm));
        assert!("llama".parse::<ServerApi>().unwrap_err().contains("auto, sglang, vllm or openai"));
    }
}
