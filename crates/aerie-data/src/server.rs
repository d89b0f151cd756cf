//! What aerie reads from a serving engine's HTTP answers, whichever stage talks to it (capture's
//! `regenerate --server`, eval's `measure` and `eval serve`): the message inside an error body,
//! and the payload of one server-sent event. SGLang, vLLM and OpenAI-compatible servers agree on
//! both, so one reader serves them all.

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
