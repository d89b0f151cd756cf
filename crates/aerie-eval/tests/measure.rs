//! `aerie measure` against a loopback mock of SGLang (`mock_sglang`), for what the real engine
//! cannot show: every failure mode reported clearly (client errors, retries of server errors,
//! timeouts, refused connections, an endless stream), a plain server's T_d and costs file, and
//! the refusal when speculation was expected. τ, the acceptance histogram and streaming timings
//! are tested against the real SGLang (crates/aerie-cli/tests/serve_sglang.rs: `measure` on the
//! chat endpoint streamed and not, and on `/generate`).

mod mock_sglang;

use std::time::Duration;

use aerie_engine::Engine;
use aerie_engine::meta::{Endpoint, Request as Prompt};
use aerie_eval::Error;
use aerie_eval::cost::Provenance;
use aerie_eval::measure::{MeasureOptions, costs_from_report, measure};
use mock_sglang::{Reply, UNSUPPORTED_MEDIA_TYPE, error_body, generate_events, generate_response, plain_meta, start};
use serde_json::json;

const LIFE: Duration = Duration::from_secs(20);

fn prompts(n: usize) -> Vec<Prompt> {
    (0..n).map(|i| Prompt::Text(format!("question {i}"))).collect()
}

fn opts(url: &str, endpoint: Endpoint, stream: bool) -> MeasureOptions {
    MeasureOptions {
        server: url.to_string(),
        endpoint,
        concurrency: 2,
        max_new_tokens: 32,
        stream,
        timeout: Duration::from_secs(5),
        retries: 2,
        backoff: Duration::from_millis(10),
        label: "mock".into(),
        // The mock speaks SGLang only and counts every request: no detection round.
        api: Some(Engine::Sglang),
        ..MeasureOptions::default()
    }
}

fn quiet(_: usize, _: usize) {}

#[test]
fn plain_server_measures_t_d_and_writes_costs() {
    let mock = start(4, LIFE, |_, _| Reply::Events(generate_events(&plain_meta(9), 1), Duration::from_millis(10)));
    let mut o = opts(&mock.url, Endpoint::Generate, true);
    let rep = measure(&prompts(2), &o, &quiet).unwrap();
    assert!(!rep.speculative);
    let td = rep.t_d_ms.unwrap();
    assert!(td > 5.0 && td < 200.0, "T_d {td} ms");
    let prov =
        Provenance { measured_where: "mock".into(), when: "today".into(), by: "test".into(), ..Default::default() };
    let costs = costs_from_report(&rep, None, prov).unwrap();
    assert_eq!(costs.t_d_ms, td);
    assert!(costs.validate().is_ok());
    // The same plain server when speculation was expected: a clear error.
    o.expect_speculation = true;
    let err = measure(&prompts(1), &o, &quiet).unwrap_err().to_string();
    assert!(err.contains("speculation was expected"), "{err}");
    mock.finish();
}

#[test]
fn the_mock_refuses_requests_without_json_content_type() {
    let mock = start(1, LIFE, |_, _| Reply::Json(200, generate_response(plain_meta(1))));
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut resp =
        agent.post(format!("{}/generate", mock.url)).header("Content-Type", "text/plain").send("{}").unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body = resp.body_mut().read_to_string().unwrap();
    assert!(body.contains(UNSUPPORTED_MEDIA_TYPE), "{body}");
    mock.finish();
}

#[test]
fn client_errors_are_reported_with_the_servers_message_and_not_retried() {
    let mock = start(3, LIFE, |_, _| Reply::Json(400, error_body("max_new_tokens must be at most 16", 400)));
    let err = measure(&prompts(1), &opts(&mock.url, Endpoint::Generate, false), &quiet).unwrap_err();
    let seen = mock.finish();
    assert_eq!(seen.len(), 1, "a 400 must not be retried");
    match err {
        Error::Server { status, message, .. } => {
            assert_eq!(status, Some(400));
            assert!(message.contains("max_new_tokens must be at most 16"), "{message}");
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn server_errors_are_retried_with_backoff() {
    // First attempt 503, second succeeds.
    let mock = start(4, LIFE, |i, _| {
        if i == 0 {
            Reply::Json(503, json!({"detail": "busy"}))
        } else {
            Reply::Json(200, generate_response(plain_meta(4)))
        }
    });
    let mut o = opts(&mock.url, Endpoint::Generate, false);
    o.concurrency = 1;
    let rep = measure(&prompts(1), &o, &quiet).unwrap();
    assert_eq!(rep.completion_tokens, 4);
    assert_eq!(mock.finish().len(), 2);

    // Always 500: bounded attempts, then the server's message.
    let mock = start(10, LIFE, |_, _| Reply::Json(500, json!({"detail": "CUDA out of memory"})));
    o.server = mock.url.clone();
    let err = measure(&prompts(1), &o, &quiet).unwrap_err().to_string();
    assert_eq!(mock.finish().len(), 3);
    assert!(
        err.contains("HTTP 500") && err.contains("CUDA out of memory") && err.contains("after 3 attempts"),
        "{err}"
    );
}

#[test]
fn timeouts_and_refused_connections() {
    let mock = start(2, LIFE, |_, _| {
        Reply::Slow(Duration::from_millis(800), Box::new(Reply::Json(200, generate_response(plain_meta(1)))))
    });
    let mut o = opts(&mock.url, Endpoint::Generate, false);
    o.timeout = Duration::from_millis(200);
    o.retries = 1;
    o.concurrency = 1;
    let err = measure(&prompts(1), &o, &quiet).unwrap_err().to_string();
    assert!(err.contains("timeout"), "{err}");
    mock.finish();

    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let o = opts(&format!("http://127.0.0.1:{port}"), Endpoint::Generate, false);
    let err = measure(&prompts(1), &o, &quiet).unwrap_err().to_string();
    assert!(err.contains("refused") || err.contains("connection failed"), "{err}");
    assert!(err.contains("after 3 attempts"), "{err}");

    let bad = MeasureOptions { server: "localhost:30000".into(), ..opts("x", Endpoint::Generate, false) };
    assert!(measure(&prompts(1), &bad, &quiet).unwrap_err().to_string().contains("http://"));
}

/// A server that streams one chat event after another without end, as fast as the socket takes.
fn endless_stream() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { break };
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf);
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            if s.write_all(head.as_bytes()).is_err() {
                continue;
            }
            let event = format!("data: {}\n\n", json!({"choices": [{"delta": {"content": "la "}}]}));
            let chunk = event.repeat(256);
            while s.write_all(chunk.as_bytes()).is_ok() {}
        }
    });
    url
}

/// Issue 34 §1: an endless answer fails at aerie-engine's one response cap (the cap regenerate
/// uses too), without retrying, instead of buffering until the request's timeout.
#[test]
fn an_endless_stream_stops_at_the_response_cap() {
    let url = endless_stream();
    let mut o = opts(&url, Endpoint::Chat, true);
    o.concurrency = 1;
    o.timeout = Duration::from_secs(120);
    let start = std::time::Instant::now();
    let e = measure(&prompts(1), &o, &quiet).unwrap_err().to_string();
    assert!(e.contains("64 MiB") && e.contains("without end"), "{e}");
    assert!(!e.contains("attempts"), "the cap is final, not retried: {e}");
    assert!(start.elapsed() < Duration::from_secs(60), "stopped at the cap, not the timeout: {:?}", start.elapsed());
}
