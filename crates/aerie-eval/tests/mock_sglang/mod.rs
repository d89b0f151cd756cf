//! A loopback stand-in for an SGLang server: std `TcpListener` on 127.0.0.1:0, HTTP/1.1 with
//! `Connection: close`, SGLang's request validation (a POST without `Content-Type:
//! application/json` gets 400 "Unsupported Media Type" in SGLang's error body) and its response
//! shapes (`/generate` with `meta_info`, `/v1/chat/completions` with `choices[0].meta_info`, both
//! optionally as server-sent events). Bounded: it serves at most `max_connections` connections,
//! gives up after `lifetime`, and stops itself; every request it saw is returned by `finish`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A request as the mock saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub content_type: Option<String>,
    pub body: Value,
}

/// What the handler answers.
pub enum Reply {
    /// A JSON body with a status.
    Json(u16, Value),
    /// Server-sent events, one `data:` line per value, then `[DONE]`, `gap` apart.
    Events(Vec<Value>, Duration),
    /// Sleep, then answer (for timeouts).
    Slow(Duration, Box<Reply>),
}

pub struct Mock {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl Mock {
    /// Stop accepting (the listener thread ends at its deadline or connection budget) and
    /// return the requests seen.
    pub fn finish(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("mock thread");
        Arc::try_unwrap(self.seen).map(|m| m.into_inner().unwrap()).unwrap_or_else(|a| a.lock().unwrap().clone())
    }
}

pub const UNSUPPORTED_MEDIA_TYPE: &str = "Unsupported Media Type: Only 'application/json' is allowed";

/// SGLang's error body (OpenAI-style `ErrorResponse`).
pub fn error_body(message: &str, code: u16) -> Value {
    json!({"object": "error", "message": message, "type": "BadRequestError", "param": null, "code": code})
}

/// Start a mock serving at most `max_connections` connections within `lifetime`.
pub fn start(
    max_connections: usize,
    lifetime: Duration,
    handler: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
) -> Mock {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let handler = Arc::new(handler);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let handle = std::thread::spawn(move || {
        let deadline = Instant::now() + lifetime;
        let mut workers = Vec::new();
        let mut served = 0;
        while served < max_connections && Instant::now() < deadline && !stop2.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let (seen, handler) = (Arc::clone(&seen2), Arc::clone(&handler));
                    let index = served;
                    served += 1;
                    workers.push(std::thread::spawn(move || serve_one(stream, index, &seen, &*handler)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => break,
            }
        }
        for w in workers {
            let _ = w.join();
        }
    });
    Mock { url, seen, stop, handle }
}

fn serve_one(
    stream: TcpStream,
    index: usize,
    seen: &Mutex<Vec<Seen>>,
    handler: &(dyn Fn(usize, &Seen) -> Reply + Sync),
) {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (mut content_type, mut length) = (None, 0usize);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "content-type" => content_type = Some(v.trim().to_string()),
                "content-length" => length = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let req = Seen { path, content_type: content_type.clone(), body };
    seen.lock().unwrap().push(req.clone());
    let media = content_type.as_deref().map(|c| c.split(';').next().unwrap().trim().to_ascii_lowercase());
    let reply = if media.as_deref() != Some("application/json") {
        Reply::Json(400, error_body(&format!("[\"{UNSUPPORTED_MEDIA_TYPE}\"]"), 400))
    } else if !matches!(req.path.as_str(), "/generate" | "/v1/chat/completions") {
        Reply::Json(404, json!({"detail": "Not Found"}))
    } else {
        handler(index, &req)
    };
    write_reply(stream, reply);
}

fn write_reply(mut stream: TcpStream, reply: Reply) {
    match reply {
        Reply::Slow(d, inner) => {
            std::thread::sleep(d);
            return write_reply(stream, *inner);
        }
        Reply::Json(status, v) => {
            let body = v.to_string();
            let head = format!(
                "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                if status < 400 { "OK" } else { "Error" },
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
        Reply::Events(events, gap) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
            for e in events {
                let _ = stream.write_all(format!("data: {e}\n\n").as_bytes());
                let _ = stream.flush();
                std::thread::sleep(gap);
            }
            let _ = stream.write_all(b"data: [DONE]\n\n");
        }
    }
    let _ = stream.flush();
}

/// A plain (non-speculative) `meta_info`.
pub fn plain_meta(completion: u64) -> Value {
    json!({"id": "req", "finish_reason": {"type": "length", "length": completion}, "prompt_tokens": 5,
        "completion_tokens": completion, "cached_tokens": 0, "e2e_latency": 0.01})
}

/// A `/generate` response.
pub fn generate_response(meta: Value) -> Value {
    json!({"text": "generated text", "output_ids": [1, 2, 3], "meta_info": meta})
}

/// `/generate` stream events: cumulative text and completion_tokens, `per_chunk` tokens each,
/// the final event carrying the whole `meta`.
pub fn generate_events(meta: &Value, per_chunk: u64) -> Vec<Value> {
    let total = meta["completion_tokens"].as_u64().unwrap();
    let mut out = Vec::new();
    let mut n = 0;
    while n < total {
        n = (n + per_chunk).min(total);
        let m = if n == total { meta.clone() } else { json!({"completion_tokens": n}) };
        out.push(json!({"text": "x".repeat(n as usize), "meta_info": m}));
    }
    out
}
