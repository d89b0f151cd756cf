//! The HTTP side: one blocking ureq agent per worker, a GET, and one POST attempt classified as a
//! success, a failure worth retrying (connection errors, timeouts, 429, 5xx) or a final one, and
//! the message a server puts in an error body.

use std::time::Duration;

use serde_json::Value;

pub(super) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .timeout_connect(Some(timeout.min(Duration::from_secs(10))))
        .build()
        .into()
}

/// Answer `GET path` with (status, body), or the transport error's text.
pub(super) fn get(agent: &ureq::Agent, url: &str) -> std::result::Result<(u16, String), String> {
    let resp = agent.get(url).header("Accept", "application/json").call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp.into_body().read_to_string().unwrap_or_default();
    Ok((status, body))
}

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
    let resp = agent
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json")
        .send(body)
        .map_err(|e| transport_failure(&e, timeout))?;
    let status = resp.status().as_u16();
    let text = resp.into_body().read_to_string().map_err(|e| transport_failure(&e, timeout))?;
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

pub(super) use aerie_data::server::error_message;
