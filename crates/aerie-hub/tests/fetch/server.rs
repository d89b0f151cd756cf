//! A loopback HTTP/1.1 server for download tests: a fixed table of replies keyed by path, one
//! request per connection (`Connection: close`), byte ranges honoured the way the hub and its CDN
//! honour them, and an optional early close to simulate a cut connection. It serves at most
//! `max_requests` connections and stops when dropped, so a test can never hang on it or reach
//! the real network through it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A canned reply.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Announce the full `Content-Length` but close after this many body bytes.
    pub cut_at: Option<usize>,
}

impl Reply {
    pub fn ok(body: impl Into<Vec<u8>>) -> Self {
        Self { status: 200, headers: Vec::new(), body: body.into(), cut_at: None }
    }

    pub fn redirect(location: &str) -> Self {
        Self { status: 302, headers: vec![("Location".into(), location.into())], body: Vec::new(), cut_at: None }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn cut_at(mut self, n: usize) -> Self {
        self.cut_at = Some(n);
        self
    }
}

/// What the server saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

pub struct Server {
    base: String,
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Bind 127.0.0.1:0 and serve `routes(base_url)` (paths without query strings).
    pub fn start(max_requests: usize, routes: impl FnOnce(&str) -> HashMap<String, Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let base = format!("http://{addr}");
        let routes = routes(&base);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming().take(max_requests) {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    serve(stream, &routes, &seen2);
                }
            }
        });
        Self { base, addr, seen, stop, thread: Some(thread) }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Requests so far, as `METHOD /path`.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|s| format!("{} {}", s.method, s.path)).collect()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop; it sees the flag and returns.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut stream: TcpStream, routes: &HashMap<String, Reply>, seen: &Mutex<Vec<Seen>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return; // the wake-up connection from Drop, or a client that gave up
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let req = Seen { method, path, headers };
    seen.lock().unwrap().push(req.clone());

    let reply = routes.get(&req.path).cloned().unwrap_or_else(|| Reply {
        status: 404,
        headers: Vec::new(),
        body: b"not found".to_vec(),
        cut_at: None,
    });
    let (status, body, range) = match (reply.status, req.header("range").and_then(parse_range)) {
        (200, Some((start, end))) => {
            let len = reply.body.len();
            let end = end.unwrap_or(len.saturating_sub(1)).min(len.saturating_sub(1));
            let start = start.min(len);
            let slice = if start <= end && start < len { reply.body[start..=end].to_vec() } else { Vec::new() };
            (206, slice, Some(format!("bytes {start}-{end}/{len}")))
        }
        _ => (reply.status, reply.body.clone(), None),
    };
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        404 => "Not Found",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(r) = range {
        head.push_str(&format!("Content-Range: {r}\r\nAccept-Ranges: bytes\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    if req.method != "HEAD" {
        let n = reply.cut_at.unwrap_or(body.len()).min(body.len());
        let _ = stream.write_all(&body[..n]);
    }
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// `bytes=a-b` or `bytes=a-`.
fn parse_range(v: &str) -> Option<(usize, Option<usize>)> {
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, if b.is_empty() { None } else { Some(b.parse().ok()?) }))
}
