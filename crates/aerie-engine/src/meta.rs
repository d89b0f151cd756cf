//! The request and response shapes of a measured request (`aerie measure`, `eval serve`): request
//! bodies for SGLang's `/generate` and the OpenAI-compatible `/v1/chat/completions` (vLLM, SGLang,
//! others), the tokens and text a streamed chunk carries, and the per-request speculative
//! statistics of SGLang's `meta_info` (kimi-k25.md, "SGLang facts"). Pure functions; the client is
//! `aerie_eval::measure`.
//!
//! `meta_info` keys read (all optional, both generations of names):
//! `completion_tokens`, `spec_verify_ct`, `spec_accept_length`, `spec_accept_histogram` /
//! `spec_correct_drafts_histogram` (h[a] = verify passes that accepted exactly a drafts),
//! `spec_accept_token_num` / `spec_accepted_drafts` / `spec_num_correct_drafts`,
//! `spec_draft_token_num` / `spec_proposed_drafts` / `spec_num_proposed_drafts`.
//! In chat responses `meta_info` sits in `choices[0]` (with `return_meta_info: true`, refused on a
//! stream), and the speculative keys also in `sglext.spec_tokens_details` (with
//! `return_spec_tokens_details: true`, streamed in a chunk of their own).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::counters::MAX_COUNT;
use crate::{Error, Result};

/// Which SGLang endpoint to send to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `/generate` with raw `text` (no chat template).
    Generate,
    /// `/v1/chat/completions` with `messages` (the server's chat template).
    Chat,
}

impl Endpoint {
    /// URL path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Generate => "/generate",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "generate" => Ok(Endpoint::Generate),
            "chat" => Ok(Endpoint::Chat),
            _ => Err(format!("`{s}` is not an endpoint: use generate or chat")),
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Text.
    pub content: String,
}

/// What one request asks: raw text (`/generate`, or one user message in chat), or messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Raw text.
    Text(String),
    /// A conversation ending with a user turn.
    Messages(Vec<Message>),
}

/// The JSON body of one greedy request (temperature 0: the regime where τ is comparable).
pub fn request_body(
    endpoint: Endpoint,
    prompt: &Request,
    max_new_tokens: usize,
    stream: bool,
    model: &str,
) -> Result<Value> {
    Ok(match endpoint {
        Endpoint::Generate => {
            let Request::Text(text) = prompt else {
                return Err(Error::Incompatible(
                    "a `messages` prompt needs --endpoint chat (/generate takes raw text and applies no chat template)"
                        .into(),
                ));
            };
            json!({
                "text": text,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
                "stream": stream,
            })
        }
        Endpoint::Chat => {
            let messages = match prompt {
                Request::Text(t) => vec![Message { role: "user".into(), content: t.clone() }],
                Request::Messages(m) => m.clone(),
            };
            // SGLang (0.5.23) refuses `return_meta_info` on a stream (HTTP 400); its speculative
            // statistics come, streamed or not, in `sglext.spec_tokens_details` when asked for.
            let mut body = json!({
                "model": model,
                "messages": messages,
                "max_tokens": max_new_tokens,
                "temperature": 0,
                "stream": stream,
                "return_spec_tokens_details": true,
            });
            if !stream {
                body["return_meta_info"] = json!(true);
            }
            if stream {
                // `continuous_usage_stats` (vLLM, SGLang) puts the cumulative token count in
                // every chunk: a speculative engine streams several tokens per chunk, so counting
                // chunks would undercount its decode rate.
                body["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
            }
            body
        }
    })
}

/// What one response says about the request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecMeta {
    /// Tokens generated.
    pub completion_tokens: Option<u64>,
    /// Verify passes (absent without speculation).
    pub verify_ct: Option<u64>,
    /// h[a] = passes that accepted exactly a drafts.
    pub histogram: Option<Vec<u64>>,
    /// Accepted drafts as the server counts them.
    pub accepted_drafts: Option<u64>,
    /// Proposed drafts as the server counts them.
    pub proposed_drafts: Option<u64>,
    /// The server's own accept length.
    pub accept_length: Option<f64>,
}

impl SpecMeta {
    /// Take every field `newer` knows, keep the others: a stream spreads one request's statistics
    /// over several chunks (SGLang: `sglext` in one, the usage in another).
    pub fn update(&mut self, newer: SpecMeta) {
        let SpecMeta { completion_tokens, verify_ct, histogram, accepted_drafts, proposed_drafts, accept_length } =
            newer;
        self.completion_tokens = completion_tokens.or(self.completion_tokens);
        self.verify_ct = verify_ct.or(self.verify_ct);
        self.histogram = histogram.or(self.histogram.take());
        self.accepted_drafts = accepted_drafts.or(self.accepted_drafts);
        self.proposed_drafts = proposed_drafts.or(self.proposed_drafts);
        self.accept_length = accept_length.or(self.accept_length);
    }
}

/// A JSON number as a count: a non-negative integer (an integral float included) up to 2^53,
/// the bound vLLM's counters get ([`MAX_COUNT`]), else nothing: an engine's `1e300` or `-3` is
/// no count, and summing it would overflow.
fn count(v: &Value) -> Option<u64> {
    let f = v.as_u64().map(|n| n as f64).or_else(|| v.as_f64())?;
    (f.is_finite() && (0.0..=MAX_COUNT).contains(&f) && f.fract() == 0.0).then_some(f as u64)
}

fn first_u64(obj: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| obj.get(*k).and_then(count))
}

/// The `meta_info` object of a response (top level for `/generate`, `choices[0]` for chat), or
/// the chat response's or stream chunk's `sglext.spec_tokens_details` (the first, for n > 1),
/// which carries the same speculative keys.
pub fn meta_info(response: &Value) -> Option<&Value> {
    response.get("meta_info").or_else(|| response.get("choices")?.get(0)?.get("meta_info")).or_else(|| {
        let d = response.get("sglext")?.get("spec_tokens_details")?;
        if d.is_array() { d.get(0) } else { Some(d) }
    })
}

/// Read the speculative statistics of one (final) response.
pub fn parse_meta(response: &Value) -> SpecMeta {
    let usage_completion = response.get("usage").and_then(|u| first_u64(u, &["completion_tokens"]));
    let Some(m) = meta_info(response) else {
        return SpecMeta { completion_tokens: usage_completion, ..SpecMeta::default() };
    };
    let histogram = ["spec_accept_histogram", "spec_correct_drafts_histogram"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Value::as_array))
        // One entry that is no count makes the whole histogram unusable.
        .and_then(|a| a.iter().map(count).collect::<Option<Vec<u64>>>());
    SpecMeta {
        completion_tokens: first_u64(m, &["completion_tokens"]).or(usage_completion),
        verify_ct: first_u64(m, &["spec_verify_ct"]).filter(|&v| v > 0),
        histogram,
        accepted_drafts: first_u64(m, &["spec_accept_token_num", "spec_accepted_drafts", "spec_num_correct_drafts"]),
        proposed_drafts: first_u64(m, &["spec_draft_token_num", "spec_proposed_drafts", "spec_num_proposed_drafts"]),
        // An accept length is at least 1 and at most the tokens of one verify pass; a value
        // outside any plausible range (1e300, NaN is not JSON) is dropped like a bad count.
        accept_length: m.get("spec_accept_length").and_then(Value::as_f64).filter(|a| (0.0..=MAX_COUNT).contains(a)),
    }
}

/// Tokens a streamed chunk carries, as far as it shows: for `/generate` the cumulative
/// `completion_tokens` (returned as is); for chat the cumulative `usage.completion_tokens` of a
/// chunk of the answer when the server sends it (continuous usage statistics), with or without
/// text: the end-of-sequence token arrives as an empty delta with the finish reason and counts
/// one more token, timed like the others. Without usage statistics, 1 per non-empty content
/// delta. The count 0 (vLLM's first chunk, the role alone) and usage-only chunks (no choice, the
/// stream's summary) carry no token.
pub fn chunk_progress(endpoint: Endpoint, chunk: &Value) -> ChunkProgress {
    match endpoint {
        Endpoint::Generate => match meta_info(chunk).and_then(|m| first_u64(m, &["completion_tokens"])) {
            Some(n) => ChunkProgress::Cumulative(n),
            None => ChunkProgress::None,
        },
        Endpoint::Chat => {
            let of_answer = chunk.get("choices").and_then(|c| c.get(0)).is_some();
            let usage = chunk.get("usage").and_then(|u| first_u64(u, &["completion_tokens"]));
            match (chunk_text(endpoint, chunk), usage) {
                (_, Some(n)) if of_answer && n > 0 => ChunkProgress::Cumulative(n),
                (Some(s), None) if !s.is_empty() => ChunkProgress::Delta,
                _ => ChunkProgress::None,
            }
        }
    }
}

/// The generated text a streamed chunk carries: the chat delta's `content`, or `/generate`'s
/// cumulative `text`.
pub fn chunk_text(endpoint: Endpoint, chunk: &Value) -> Option<&str> {
    match endpoint {
        Endpoint::Generate => chunk.get("text").and_then(Value::as_str),
        Endpoint::Chat => chunk
            .get("choices")
            .and_then(|c| c.get(0))
            .and_then(|c| c.get("delta"))
            .and_then(|d| d.get("content"))
            .and_then(Value::as_str),
    }
}

/// The answer text of a complete (unstreamed) response.
pub fn response_text(endpoint: Endpoint, response: &Value) -> Option<&str> {
    match endpoint {
        Endpoint::Generate => response.get("text").and_then(Value::as_str),
        Endpoint::Chat => response
            .get("choices")
            .and_then(|c| c.get(0))
            .and_then(|c| c.get("message"))
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str),
    }
}

/// See [`chunk_progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkProgress {
    /// No generated text in this chunk.
    None,
    /// New text of unknown token count.
    Delta,
    /// The cumulative token count so far.
    Cumulative(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 34 §2: the end-of-sequence token of a chat stream arrives in an empty delta with the
    /// finish reason; its cumulative count is a token timed like the others (it used to be
    /// dropped from the timing, while the total counted it: plain rates read a little high).
    #[test]
    fn an_eos_token_in_an_empty_chunk_is_counted_where_it_arrives() {
        let role =
            json!({"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": {"completion_tokens": 0}});
        let text = json!({"choices": [{"delta": {"content": "Hi"}}], "usage": {"completion_tokens": 4}});
        let eos = json!({"choices": [{"delta": {"content": ""}, "finish_reason": "stop"}], "usage": {"completion_tokens": 5}});
        let summary = json!({"choices": [], "usage": {"completion_tokens": 5}});
        assert_eq!(chunk_progress(Endpoint::Chat, &role), ChunkProgress::None);
        assert_eq!(chunk_progress(Endpoint::Chat, &text), ChunkProgress::Cumulative(4));
        assert_eq!(chunk_progress(Endpoint::Chat, &eos), ChunkProgress::Cumulative(5));
        assert_eq!(chunk_progress(Endpoint::Chat, &summary), ChunkProgress::None);
        let no_usage = json!({"choices": [{"delta": {"content": "a"}}]});
        assert_eq!(chunk_progress(Endpoint::Chat, &no_usage), ChunkProgress::Delta);
    }

    #[test]
    fn request_bodies() {
        let b = request_body(Endpoint::Generate, &Request::Text("x".into()), 64, false, "m").unwrap();
        assert_eq!(b["sampling_params"]["max_new_tokens"], 64);
        assert_eq!(b["sampling_params"]["temperature"], 0);
        let c = request_body(Endpoint::Chat, &Request::Text("x".into()), 8, true, "m").unwrap();
        // SGLang answers a stream asking for meta_info with HTTP 400; the details come in sglext.
        assert!(c.get("return_meta_info").is_none(), "{c}");
        assert_eq!(c["return_spec_tokens_details"], true);
        let unstreamed = request_body(Endpoint::Chat, &Request::Text("x".into()), 8, false, "m").unwrap();
        assert_eq!(unstreamed["return_meta_info"], true);
        assert_eq!(unstreamed["return_spec_tokens_details"], true);
        assert_eq!(c["messages"][0]["role"], "user");
        assert_eq!(c["stream_options"]["include_usage"], true);
        assert_eq!(c["stream_options"]["continuous_usage_stats"], true);
        let msgs = Request::Messages(vec![Message { role: "user".into(), content: "x".into() }]);
        assert!(request_body(Endpoint::Generate, &msgs, 8, false, "m").is_err());
    }

    #[test]
    fn meta_in_both_places_and_both_generations() {
        let gen_resp = json!({"text": "a", "meta_info": {"completion_tokens": 91, "spec_verify_ct": 21,
            "spec_accept_histogram": [2, 4, 2, 1, 1, 11], "spec_accept_token_num": 70, "spec_draft_token_num": 105,
            "spec_accept_length": 4.333}});
        let m = parse_meta(&gen_resp);
        assert_eq!(
            (m.completion_tokens, m.verify_ct, m.accepted_drafts, m.proposed_drafts),
            (Some(91), Some(21), Some(70), Some(105))
        );
        assert_eq!(m.histogram.as_deref(), Some(&[2, 4, 2, 1, 1, 11][..]));
        let chat = json!({"choices": [{"message": {"content": "a"}, "meta_info": {"completion_tokens": 7,
            "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 1, 1], "spec_accepted_drafts": 5}}],
            "usage": {"completion_tokens": 7}});
        let m = parse_meta(&chat);
        assert_eq!((m.completion_tokens, m.verify_ct, m.accepted_drafts), (Some(7), Some(2), Some(5)));
        assert_eq!(m.histogram.as_deref(), Some(&[0, 0, 1, 1][..]));
        let plain = parse_meta(&json!({"choices": [{"message": {}}], "usage": {"completion_tokens": 5}}));
        assert_eq!((plain.completion_tokens, plain.verify_ct), (Some(5), None));
        let zero = parse_meta(&json!({"meta_info": {"completion_tokens": 5, "spec_verify_ct": 0}}));
        assert_eq!(zero.verify_ct, None);
    }

    #[test]
    fn spec_tokens_details_of_a_chat_stream_chunk_merge_with_its_usage() {
        // SGLang 0.5.23's shapes: a chunk with only `sglext`, and the usage chunk after it.
        let details = json!({"choices": [], "sglext": {"spec_tokens_details": {"spec_accept_length": 1.38,
            "spec_num_correct_drafts": 17, "spec_num_proposed_drafts": 141, "spec_verify_ct": 47,
            "spec_correct_drafts_histogram": [33, 11, 2, 1]}}});
        let mut m = parse_meta(&details);
        assert_eq!((m.verify_ct, m.accepted_drafts, m.proposed_drafts), (Some(47), Some(17), Some(141)));
        assert_eq!(m.histogram.as_deref(), Some(&[33, 11, 2, 1][..]));
        m.update(parse_meta(&json!({"choices": [], "usage": {"completion_tokens": 64}})));
        assert_eq!((m.completion_tokens, m.verify_ct, m.accepted_drafts), (Some(64), Some(47), Some(17)));
        let n2 = json!({"sglext": {"spec_tokens_details": [{"spec_verify_ct": 3}, {"spec_verify_ct": 9}]}});
        assert_eq!(parse_meta(&n2).verify_ct, Some(3));
    }

    /// Issue 47: an engine's counter that is no count (1e300, u64::MAX, negative, fractional) is
    /// dropped before any sum can overflow, as vLLM's Prometheus counters are refused.
    #[test]
    fn counters_that_are_no_count_are_dropped_before_any_sum() {
        let r = json!({"text": "a", "meta_info": {"completion_tokens": 1e300, "spec_verify_ct": u64::MAX,
            "spec_accept_histogram": [3, 1e300], "spec_accept_token_num": -3, "spec_draft_token_num": 2.5,
            "spec_accept_length": 1e300}});
        assert_eq!(parse_meta(&r), SpecMeta::default());
        let ok = json!({"meta_info": {"completion_tokens": 9.0, "spec_verify_ct": 4, "spec_accept_histogram": [1, 3.0],
            "spec_accept_length": 2.25}});
        let m = parse_meta(&ok);
        assert_eq!((m.completion_tokens, m.verify_ct, m.histogram), (Some(9), Some(4), Some(vec![1, 3])));
        assert_eq!(m.accept_length, Some(2.25));
    }
}
