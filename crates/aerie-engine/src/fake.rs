//! A loopback HTTP server for this crate's unit tests: what a real engine cannot be made to show
//! on demand (transient errors, counters that never settle, a port already taken, a server of
//! each kind to detect).

use std::io::{Read, Write};

/// Serve every connection with `answer(n, path)` = (status, body) for the `n`-th request (from
/// 0) of `path`; the base URL `http://127.0.0.1:PORT`. The server lives as long as the test.
pub(crate) fn serve(answer: impl Fn(usize, &str) -> (u16, String) + Send + 'static) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut s) = stream else { break };
            let mut buf = [0u8; 4096];
            let len = s.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..len]);
            let (status, body) = answer(n, request.split_whitespace().nth(1).unwrap_or(""));
            let head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(body.as_bytes());
        }
    });
    url
}
