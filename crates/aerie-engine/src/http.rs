//! The HTTP side of talking to a serving engine, whichever stage does it (`regenerate
//! --server`, `measure`, `eval serve`, readiness and detection): one blocking agent, one cap on
//! the bytes a response may bring, the message inside an error body, and the payload of one
//! server-sent event. SGLang, vLLM and OpenAI-compatible servers agree on both, so one reader
//! serves them all.

use std::io::Read;
use std::time::Duration;

use serde_json::Value;

/// The server's message in an error body: `message`, `error.message` (OpenAI), `error`,
/// `detail` (FastAPI), or the raw text; at most 400 characters, so a server that answers with an
/// HTML page does not flood the terminal.
pub fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let pick = |x: &Value| x.as_str().map(str::to_owned).or_else(|| (!x.is_null()).then(|| x.to_string()));
        v.get("message")
            .and_then(pick)
            .or_else(|| v.get("error").and_then(|e| e.get("message").and_then(pick).or_else(|| pick(e))))
            .or_else(|| v.get("detail").and_then(pick))
    });
    let text = from_json.unwrap_or_else(|| body.trim().to_owned());
    match text.char_indices().nth(400) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// One server-sent event's JSON payload: the text after `data:` on a line, `None` for other
/// lines (comments, keep-alives) and for `[DONE]`.
pub fn sse_data(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("data:")?.trim();
    (rest != "[DONE]" && !rest.is_empty()).then_some(rest)
}

/// The most bytes aerie reads from one response (a whole answer, or a whole event stream):
/// 64 MiB, 30× a streamed answer of 4096 tokens with usage statistics in every event. A server
/// that answers without end (a bug, a proxy looping) fails the request at this cap instead of
/// making aerie buffer gigabytes until the request's timeout.
pub const MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// The blocking agent every request goes through: a status is not an error (the body says why),
/// `timeout` bounds the whole request, connecting takes at most 10 s of it.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .timeout_connect(Some(timeout.min(Duration::from_secs(10))))
        .build()
        .into()
}

/// A response body as text, at most [`MAX_RESPONSE_BYTES`] (invalid UTF-8 replaced).
pub fn read_text(body: &mut ureq::Body) -> Result<String, ureq::Error> {
    body.with_config().limit(MAX_RESPONSE_BYTES).lossy_utf8(true).read_to_string()
}

/// A response body as a reader that fails (an I/O error saying the body is larger than the
/// limit) after [`MAX_RESPONSE_BYTES`]: for event streams, read line by line.
pub fn capped_reader(body: ureq::Body) -> impl Read {
    body.into_with_config().limit(MAX_RESPONSE_BYTES).reader()
}

/// Whether a read failed because the response passed [`MAX_RESPONSE_BYTES`] (final: trying
/// again would read the same endless answer).
pub fn over_cap(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::BodyExceedsLimit(_)))
}

/// What to say when a response passed [`MAX_RESPONSE_BYTES`].
pub fn over_cap_message() -> String {
    format!(
        "the response passed {} MiB, the most aerie reads from one answer: an answer without end (stopped)",
        MAX_RESPONSE_BYTES >> 20
    )
}

/// `GET url` answered with (status, body), or the transport error's text.
pub fn get(agent: &ureq::Agent, url: &str) -> Result<(u16, String), String> {
    let mut resp = agent.get(url).header("Accept", "application/json").call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = read_text(resp.body_mut()).map_err(|e| e.to_string())?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_of_each_server_kind_and_events() {
        let sglang = r#"{"object": "error", "message": "Unsupported Media Type: Only 'application/json' is allowed"}"#;
        assert!(error_message(sglang).starts_with("Unsupported Media Type"));
        assert_eq!(error_message(r#"{"error": {"message": "boom"}}"#), "boom");
        assert_eq!(error_message(r#"{"error": "flat"}"#), "flat");
        assert_eq!(error_message(r#"{"detail": "nope"}"#), "nope");
        assert_eq!(error_message("Internal Server Error"), "Internal Server Error");
        let long = "é".repeat(1000);
        assert_eq!(error_message(&long).chars().count(), 401);
        assert_eq!(sse_data("data: {\"a\":1}"), Some("{\"a\":1}"));
        assert_eq!(sse_data("data: [DONE]"), None);
        assert_eq!(sse_data(": keep-alive"), None);
    }
}
