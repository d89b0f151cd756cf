//! The HTTP side of talking to a serving engine, whichever stage does it (`regenerate
//! --server`, `measure`, `eval serve`, readiness and detection): one blocking agent, one cap on
//! the bytes a response may bring, the message inside an error body, and the payload of one
//! server-sent event, one POST and the [`Failure`] of an attempt (retried by [`crate::retry`]).
//! SGLang, vLLM and OpenAI-compatible servers agree on all of it, so one client serves them all.

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
/// `timeout` bounds the whole request, connecting takes at most 10 s of it. A redirect is never
/// followed (a serving engine does not redirect; one that does, or a proxy in its place, must
/// not send the prompts to another host): it is a final failure naming where it pointed.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .max_redirects(0)
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

/// One failed request attempt: what to say, the HTTP status when one came back, and whether
/// trying again may help (`retry_as`: the cause a report counts it under, `429`, `503`,
/// `timeout`, `connection`), or not (`None`: a refusal, a bad URL, an answer that cannot be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// HTTP status, when one came back.
    pub status: Option<u16>,
    /// What happened, with the server's own message when it sent one.
    pub message: String,
    /// The cause to retry under, or `None` for a final failure.
    pub retry_as: Option<String>,
}

impl Failure {
    /// A failure that trying again would only repeat.
    pub fn fatal(status: Option<u16>, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), retry_as: None }
    }

    /// A request that never got an answer: timeouts and broken connections are worth retrying
    /// (an engine restarting, a proxy hiccup), a host that does not exist or a bad URL are not.
    pub fn transport(e: &ureq::Error, timeout: Duration) -> Self {
        let (message, cause) = match e {
            ureq::Error::Timeout(_) => {
                (format!("no complete answer within {:.1} s (the timeout)", timeout.as_secs_f64()), Some("timeout"))
            }
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                ("connection refused: is the server running and listening there?".to_owned(), Some("connection"))
            }
            ureq::Error::ConnectionFailed => {
                ("connection failed: is the server running and listening there?".to_owned(), Some("connection"))
            }
            ureq::Error::Io(io) => (format!("I/O error: {io}"), Some("connection")),
            ureq::Error::HostNotFound => ("host not found".to_owned(), None),
            ureq::Error::BadUri(u) => (format!("bad URL `{u}`"), None),
            other => (other.to_string(), Some("connection")),
        };
        Self { status: None, message, retry_as: cause.map(str::to_owned) }
    }

    /// A non-2xx answer: 429 and 5xx are retried (busy, overloaded, restarting), other statuses
    /// are the server refusing this request, which it would refuse again.
    pub fn status(status: u16, body: &str) -> Self {
        let retry = status == 429 || status >= 500;
        Self {
            status: Some(status),
            message: format!("HTTP {status}: {}", error_message(body)),
            retry_as: retry.then(|| status.to_string()),
        }
    }

    /// The last failure of a request after `attempts` tries, said once for every caller: how
    /// many attempts a transient failure took, or that a refusal was not retried.
    pub fn explain(&self, attempts: usize) -> String {
        let mut s = self.message.clone();
        if self.retry_as.is_some() {
            s.push_str(&format!(" (after {attempts} attempts)"));
        } else if self.status.is_some_and(|st| (400..500).contains(&st) && st != 429) {
            s.push_str(" (the server refused the request; not retried)");
        }
        s
    }
}

/// One JSON POST: the status and the body of a 2xx answer, or the [`Failure`] (transport or
/// status) to retry or report. `accept` is the `Accept` header (an event stream or JSON).
pub fn post(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    accept: &str,
    timeout: Duration,
) -> Result<(u16, ureq::Body), Failure> {
    let resp = agent
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", accept)
        .send(body)
        .map_err(|e| Failure::transport(&e, timeout))?;
    let status = resp.status().as_u16();
    if let Some(f) = redirect(&resp) {
        return Err(f);
    }
    let mut resp_body = resp.into_body();
    if !(200..300).contains(&status) {
        return Err(Failure::status(status, &read_text(&mut resp_body).unwrap_or_default()));
    }
    Ok((status, resp_body))
}

/// A redirect answer as a final failure naming where it pointed (never followed: [`agent`]).
fn redirect(resp: &ureq::http::Response<ureq::Body>) -> Option<Failure> {
    if !resp.status().is_redirection() {
        return None;
    }
    let status = resp.status().as_u16();
    let to = resp.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or("nowhere (no Location)");
    Some(Failure::fatal(
        Some(status),
        format!(
            "HTTP {status}: the server redirects to {to}; aerie does not follow redirects from a serving engine (give its own URL)"
        ),
    ))
}

/// One JSON POST answered with JSON: the parsed answer, or the [`Failure`]. An answer past
/// [`MAX_RESPONSE_BYTES`] or not JSON is final.
pub fn post_json(agent: &ureq::Agent, url: &str, body: &str, timeout: Duration) -> Result<Value, Failure> {
    let (status, mut resp_body) = post(agent, url, body, "application/json", timeout)?;
    let text = read_text(&mut resp_body).map_err(|e| match e {
        ureq::Error::BodyExceedsLimit(_) => Failure::fatal(Some(status), over_cap_message()),
        e => Failure::transport(&e, timeout),
    })?;
    serde_json::from_str(&text).map_err(|e| {
        Failure::fatal(Some(status), format!("HTTP {status} but the body is not JSON ({e}): {}", error_message(&text)))
    })
}

/// `GET url` answered with (status, body), or the transport error's text.
pub fn get(agent: &ureq::Agent, url: &str) -> Result<(u16, String), String> {
    let mut resp = agent.get(url).header("Accept", "application/json").call().map_err(|e| e.to_string())?;
    if let Some(f) = redirect(&resp) {
        return Err(f.message);
    }
    let status = resp.status().as_u16();
    let body = read_text(resp.body_mut()).map_err(|e| e.to_string())?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-thread HTTP server on 127.0.0.1 answering every request with `answer(path)` (the
    /// whole response); returns its base URL and a counter of the requests it got.
    fn serve(
        answer: impl Fn(&str) -> String + Send + 'static,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&hits);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut reader = BufReader::new(&stream);
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                let mut line = String::new();
                let mut length = 0usize;
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0u8; length];
                let _ = std::io::Read::read_exact(&mut reader, &mut body);
                let path = first.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let _ = (&stream).write_all(answer(&path).as_bytes());
            }
        });
        (base, hits)
    }

    #[test]
    fn a_redirect_to_another_host_is_never_followed() {
        let (elsewhere, hits) = serve(|_| "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".into());
        let target = format!("{elsewhere}/v1/completions");
        let location = target.clone();
        let (server, _) = serve(move |_| {
            format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        });
        let agent = agent(Duration::from_secs(5));
        let f = post_json(&agent, &format!("{server}/v1/completions"), "{}", Duration::from_secs(5)).unwrap_err();
        assert!(f.retry_as.is_none() && f.status == Some(302), "{f:?}");
        assert!(f.message.contains(&target) && f.message.contains("does not follow redirects"), "{}", f.message);
        let e = get(&agent, &format!("{server}/metrics")).unwrap_err();
        assert!(e.contains("does not follow redirects"), "{e}");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the other host was never asked");
    }

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
