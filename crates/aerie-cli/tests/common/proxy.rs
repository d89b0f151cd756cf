//! A logging pass-through between aerie and a real server (`vllm_regenerate.rs`,
//! `serve_sglang.rs`): the tests see every request aerie sent and every answer it got.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// (path, request JSON, response JSON) of every POST, in the order they finished.
pub type Log = Arc<Mutex<Vec<(String, Value, Value)>>>;

/// Read one HTTP/1.1 message head and its `Content-Length` body.
pub fn read_message(r: &mut BufReader<TcpStream>) -> Option<(Vec<String>, Vec<u8>)> {
    let mut head = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
        head.push(line.trim_end().to_owned());
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// A pass-through to `upstream` that logs (path, request JSON, response JSON) of every POST.
/// Each connection carries one request (`Connection: close` both ways).
pub fn start_proxy(upstream: u16) -> (String, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let log2 = Arc::clone(&log);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let log = Arc::clone(&log2);
            std::thread::spawn(move || {
                let mut r = BufReader::new(client.try_clone().unwrap());
                let Some((head, body)) = read_message(&mut r) else { return };
                let mut up = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                let mut out = String::new();
                for h in &head {
                    if !h.to_ascii_lowercase().starts_with("connection:") {
                        out.push_str(h);
                        out.push_str("\r\n");
                    }
                }
                out.push_str("Connection: close\r\n\r\n");
                up.write_all(out.as_bytes()).unwrap();
                up.write_all(&body).unwrap();
                let mut answer = Vec::new();
                up.read_to_end(&mut answer).unwrap();
                let mut client = client;
                let _ = client.write_all(&answer);
                let path = head[0].split_whitespace().nth(1).unwrap_or("").to_owned();
                if head[0].starts_with("POST") {
                    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").map_or(answer.len(), |i| i + 4);
                    let req = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let resp = serde_json::from_slice(&answer[split..]).unwrap_or(Value::Null);
                    log.lock().unwrap().push((path, req, resp));
                }
            });
        }
    });
    (format!("http://127.0.0.1:{port}"), log)
}
