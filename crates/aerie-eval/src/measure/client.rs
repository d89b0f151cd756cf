//! The HTTP side of a measurement: one greedy request, streamed and timed, with aerie-engine's
//! retry rule ([`aerie_engine::retry`]). `aerie measure` and `aerie eval serve` both send through
//! it, with aerie-engine's agent, POST and its one cap on the bytes of a response
//! (`MAX_RESPONSE_BYTES`).

use std::io::{BufRead, BufReader};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use aerie_engine::http::{
    Failure, capped_reader, error_message, over_cap, over_cap_message, post, post_json, sse_data,
};
use aerie_engine::meta::{
    ChunkProgress, Endpoint, Request, SpecMeta, chunk_progress, chunk_text, parse_meta, request_body, response_text,
};
use aerie_engine::retry::{Retry, with_retries};

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
    /// Tokens the first generated chunk carried, where the stream counts tokens (the server's
    /// cumulative count): 1 is the prefill's token alone; more means cycles ran before the decode
    /// time started, so their cycles must not be set against it ([`super::timed_cycles`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_chunk_tokens: Option<u64>,
    /// The server's cumulative token count at each chunk that carried new tokens (streams that
    /// count tokens): a speculative engine's chunks after the first are its cycles, for τ by
    /// output position ([`crate::profile::stream_buckets`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_tokens: Vec<u64>,
    /// Attempts made.
    pub attempts: usize,
    /// The answer's text (streamed deltas joined, or the response's text).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub answer: String,
}

/// One attempt: POST `body` and return the final response JSON plus stream timings.
fn attempt(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    opts: &MeasureOptions,
) -> std::result::Result<RequestResult, Failure> {
    let start = Instant::now();
    if !opts.stream {
        let v = post_json(agent, url, body, opts.timeout)?;
        return Ok(RequestResult {
            meta: parse_meta(&v),
            e2e_s: start.elapsed().as_secs_f64(),
            attempts: 1,
            answer: response_text(opts.endpoint, &v).unwrap_or_default().to_string(),
            ..Default::default()
        });
    }
    let (status, resp_body) = post(agent, url, body, "text/event-stream", opts.timeout)?;
    let bad = |m: String| Failure::fatal(Some(status), m);
    let reader = BufReader::new(capped_reader(resp_body));
    // (time, tokens so far) of the first and the latest chunk that carried generated text.
    let mut first: Option<(Instant, u64)> = None;
    let mut last: Option<(Instant, u64)> = None;
    let mut final_meta = SpecMeta::default();
    let mut chat_tokens = 0u64;
    // Whether the counts are the server's token counts (not chat chunks counted one each).
    let mut counted_tokens = false;
    let mut answer = String::new();
    let mut chunk_tokens = Vec::new();
    for line in reader.lines() {
        let line = line.map_err(|e| match over_cap(&e) {
            true => bad(over_cap_message()),
            false => Failure { retry_as: Some("connection".into()), ..bad(format!("stream broke: {e}")) },
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
        let progress = chunk_progress(opts.endpoint, &v);
        let cumulative = matches!(progress, ChunkProgress::Cumulative(_));
        let count = match progress {
            ChunkProgress::None => None,
            ChunkProgress::Delta => {
                chat_tokens += 1;
                Some(chat_tokens)
            }
            ChunkProgress::Cumulative(n) => {
                counted_tokens = true;
                Some(n)
            }
        };
        if let Some(n) = count.filter(|&n| last.is_none_or(|(_, m)| n > m)) {
            if cumulative {
                chunk_tokens.push(n);
            }
            first.get_or_insert((now, n));
            last = Some((now, n));
        }
        final_meta.update(parse_meta(&v));
    }
    if final_meta.completion_tokens.is_none() {
        final_meta.completion_tokens = last.map(|(_, n)| n);
    }
    let first_chunk_tokens = first.filter(|_| counted_tokens).map(|(_, n)| n);
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
        first_chunk_tokens,
        // Per-chunk deltas counted one each are not the server's token counts.
        chunk_tokens: if counted_tokens { chunk_tokens } else { Vec::new() },
        attempts: 1,
        answer,
    })
}

impl RequestResult {
    /// This answer as the output-position buckets read it.
    pub fn streamed(&self) -> crate::profile::StreamedAnswer<'_> {
        crate::profile::StreamedAnswer {
            chunk_tokens: &self.chunk_tokens,
            verify_ct: self.meta.verify_ct,
            accepted_drafts: self.meta.accepted_drafts,
        }
    }
}

/// The HTTP client `measure` and `eval serve` send with: aerie-engine's agent with the
/// whole-request timeout of `opts`.
pub fn agent(opts: &MeasureOptions) -> ureq::Agent {
    aerie_engine::http::agent(opts.timeout)
}

/// Send one greedy request with aerie-engine's retries.
pub fn send(agent: &ureq::Agent, prompt: &Request, opts: &MeasureOptions) -> Result<RequestResult> {
    let url = format!("{}{}", opts.server.trim_end_matches('/'), opts.endpoint.path());
    let body = request_body(opts.endpoint, prompt, opts.max_new_tokens, opts.stream, &opts.model)?.to_string();
    let tries =
        with_retries(Retry { retries: opts.retries, backoff: opts.backoff }, || attempt(agent, &url, &body, opts));
    match tries.result {
        Ok(r) => Ok(RequestResult { attempts: tries.attempts, ..r }),
        Err(f) => Err(Error::Server { url, status: f.status, message: f.explain(tries.attempts) }),
    }
}
