//! The HTTP side of a measurement: one greedy request, streamed and timed, with bounded retries
//! and backoff. `aerie measure` and `aerie eval serve` both send through it, with aerie-engine's
//! agent and its one cap on the bytes of a response (`MAX_RESPONSE_BYTES`).

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use aerie_engine::http::{capped_reader, error_message, over_cap, over_cap_message, read_text, sse_data};
use aerie_engine::meta::{
    ChunkProgress, Endpoint, Request, SpecMeta, chunk_progress, chunk_text, parse_meta, request_body, response_text,
};

use super::MeasureOptions;
use crate::{Error, Result};

/// One request's outcome.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestResult {
    /// What `meta_info` said.
    pub meta: SpecMeta,
    /// Wall time, seconds.
    pub e2e_s: f64,
    /// Time to the first generated chunk (streams).
    pub ttft_s: Option<f64>,
    /// First to last generated chunk (streams).
    pub decode_s: Option<f64>,
    /// Tokens generated after the first chunk (streams).
    pub decode_tokens: Option<u64>,
    /// Attempts made.
    pub attempts: usize,
    /// The answer's text (streamed deltas joined, or the response's text).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub answer: String,
}

/// An HTTP failure: the message and whether trying again may help.
struct Failure {
    status: Option<u16>,
    message: String,
    retry: bool,
}

fn transport_failure(e: &ureq::Error, timeout: Duration) -> Failure {
    let (message, retry) = match e {
        ureq::Error::Timeout(_) => {
            (format!("no complete answer within {:.1} s (timeout)", timeout.as_secs_f64()), true)
        }
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            ("connection refused: is the server running and listening there?".to_string(), true)
        }
        ureq::Error::ConnectionFailed => {
            ("connection failed: is the server running and listening there?".to_string(), true)
        }
        ureq::Error::HostNotFound => ("host not found".to_string(), false),
        ureq::Error::BadUri(u) => (format!("bad URL `{u}`"), false),
        other => (other.to_string(), true),
    };
    Failure { status: None, message, retry }
}

/// One attempt: POST `body` and return the final response JSON plus stream timings.
fn attempt(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    opts: &MeasureOptions,
) -> std::result::Result<RequestResult, Failure> {
    let start = Instant::now();
    let resp = agent
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", if opts.stream { "text/event-stream" } else { "application/json" })
        .send(body)
        .map_err(|e| transport_failure(&e, opts.timeout))?;
    let status = resp.status().as_u16();
    let mut resp_body = resp.into_body();
    if !(200..300).contains(&status) {
        let text = read_text(&mut resp_body).unwrap_or_default();
        let retry = status == 429 || status >= 500;
        return Err(Failure {
            status: Some(status),
            message: format!("HTTP {status}: {}", error_message(&text)),
            retry,
        });
    }
    let bad = |m: String| Failure { status: Some(status), message: m, retry: false };
    if !opts.stream {
        let text = read_text(&mut resp_body).map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => bad(over_cap_message()),
            e => transport_failure(&e, opts.timeout),
        })?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| bad(format!("response is not JSON ({e}): {}", error_message(&text))))?;
        return Ok(RequestResult {
            meta: parse_meta(&v),
            e2e_s: start.elapsed().as_secs_f64(),
            attempts: 1,
            answer: response_text(opts.endpoint, &v).unwrap_or_default().to_string(),
            ..Default::default()
        });
    }
    let reader = BufReader::new(capped_reader(resp_body));
    // (time, tokens so far) of the first and the latest chunk that carried generated text.
    let mut first: Option<(Instant, u64)> = None;
    let mut last: Option<(Instant, u64)> = None;
    let mut final_meta = SpecMeta::default();
    let mut chat_tokens = 0u64;
    let mut answer = String::new();
    for line in reader.lines() {
        let line = line.map_err(|e| match over_cap(&e) {
            true => bad(over_cap_message()),
            false => Failure { status: Some(status), message: format!("stream broke: {e}"), retry: true },
        })?;
        let Some(data) = sse_data(&line) else { continue };
        let v: Value =
            serde_json::from_str(data).map_err(|e| bad(format!("stream event is not JSON ({e}): {data}")))?;
        if v.get("error").is_some() || v.get("object").and_then(Value::as_str) == Some("error") {
            return Err(bad(format!("error inside the stream: {}", error_message(data))));
        }
        let now = Instant::now();
        if let Some(text) = chunk_text(opts.endpoint, &v) {
            match opts.endpoint {
                Endpoint::Chat => answer.push_str(text),
                // `/generate` streams the whole text so far in every chunk.
                Endpoint::Generate => text.clone_into(&mut answer),
            }
        }
        let count = match chunk_progress(opts.endpoint, &v) {
            ChunkProgress::None => None,
            ChunkProgress::Delta => {
                chat_tokens += 1;
                Some(chat_tokens)
            }
            ChunkProgress::Cumulative(n) => Some(n),
        };
        if let Some(n) = count.filter(|&n| last.is_none_or(|(_, m)| n > m)) {
            first.get_or_insert((now, n));
            last = Some((now, n));
        }
        final_meta.update(parse_meta(&v));
    }
    if final_meta.completion_tokens.is_none() {
        final_meta.completion_tokens = last.map(|(_, n)| n);
    }
    let (ttft_s, decode_s, decode_tokens) = match (first, last) {
        (Some((t0, n0)), Some((t1, n1))) => {
            // Chat deltas are counted per chunk; rescale to the server's token count when known.
            let total = final_meta.completion_tokens.unwrap_or(n1);
            let after_first =
                if opts.endpoint == Endpoint::Chat && n1 > 0 { total.saturating_sub(total * n0 / n1) } else { n1 - n0 };
            (Some((t0 - start).as_secs_f64()), Some((t1 - t0).as_secs_f64()), Some(after_first))
        }
        _ => (None, None, None),
    };
    Ok(RequestResult {
        meta: final_meta,
        e2e_s: start.elapsed().as_secs_f64(),
        ttft_s,
        decode_s,
        decode_tokens,
        attempts: 1,
        answer,
    })
}

/// The HTTP client `measure` and `eval serve` send with: aerie-engine's agent with the
/// whole-request timeout of `opts`.
pub fn agent(opts: &MeasureOptions) -> ureq::Agent {
    aerie_engine::http::agent(opts.timeout)
}

/// Send one greedy request with bounded retries and exponential backoff.
pub fn send(agent: &ureq::Agent, prompt: &Request, opts: &MeasureOptions) -> Result<RequestResult> {
    let url = format!("{}{}", opts.server.trim_end_matches('/'), opts.endpoint.path());
    let body = request_body(opts.endpoint, prompt, opts.max_new_tokens, opts.stream, &opts.model)?.to_string();
    let mut wait = opts.backoff;
    for n in 0..=opts.retries {
        match attempt(agent, &url, &body, opts) {
            Ok(mut r) => {
                r.attempts = n + 1;
                return Ok(r);
            }
            Err(f) if f.retry && n < opts.retries => {
                std::thread::sleep(wait);
                wait *= 2;
            }
            Err(f) => {
                let tries = if f.retry { format!(" (after {} attempts)", n + 1) } else { String::new() };
                return Err(Error::Server { url, status: f.status, message: format!("{}{tries}", f.message) });
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}
