//! One POST attempt of a regenerated turn, classified as a success, a failure worth retrying
//! (connection errors, timeouts, 429, 5xx) or a final one, through aerie-engine's agent and its
//! response-size cap.

use std::time::Duration;

use aerie_engine::http::{error_message, over_cap_message, read_text};
use serde_json::Value;

/// One failed attempt: what to say, and whether trying again may help (with the cause).
pub(super) struct Failure {
    pub(super) status: Option<u16>,
    pub(super) message: String,
    pub(super) retry_as: Option<String>,
}

fn transport_failure(e: &ureq::Error, timeout: Duration) -> Failure {
    let (message, cause) = match e {
        ureq::Error::Timeout(_) => {
            (format!("no complete answer within {:.0} s (--timeout)", timeout.as_secs_f64()), Some("timeout"))
        }
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            ("connection refused: is the server running and listening there?".to_owned(), Some("connection"))
        }
        ureq::Error::ConnectionFailed => ("connection failed".to_owned(), Some("connection")),
        ureq::Error::Io(io) => (format!("I/O error: {io}"), Some("connection")),
        ureq::Error::HostNotFound => ("host not found".to_owned(), None),
        ureq::Error::BadUri(u) => (format!("bad URL `{u}`"), None),
        other => (other.to_string(), Some("connection")),
    };
    Failure { status: None, message, retry_as: cause.map(str::to_owned) }
}

/// One POST; the parsed JSON on 2xx.
pub(super) fn attempt(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    timeout: Duration,
) -> std::result::Result<Value, Failure> {
    let mut resp = agent
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json")
        .send(body)
        .map_err(|e| transport_failure(&e, timeout))?;
    let status = resp.status().as_u16();
    let text = read_text(resp.body_mut()).map_err(|e| match e {
        ureq::Error::BodyExceedsLimit(_) => {
            Failure { status: Some(status), message: over_cap_message(), retry_as: None }
        }
        e => transport_failure(&e, timeout),
    })?;
    if !(200..300).contains(&status) {
        let retry = status == 429 || status >= 500;
        return Err(Failure {
            status: Some(status),
            message: format!("HTTP {status}: {}", error_message(&text)),
            retry_as: retry.then(|| status.to_string()),
        });
    }
    serde_json::from_str(&text).map_err(|e| Failure {
        status: Some(status),
        message: format!("HTTP {status} but the body is not JSON ({e}): {}", error_message(&text)),
        retry_as: None,
    })
}
