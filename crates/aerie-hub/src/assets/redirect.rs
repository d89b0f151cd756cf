//! Redirects of asset downloads (the PyPI index and its wheels): followed only within one host,
//! so a compromised or misconfigured index cannot send aerie's requests elsewhere
//! (docs/reliability.md §6).

use super::http_error;
use crate::{Error, Result};

/// Redirects one request follows at most.
const MAX_REDIRECTS: usize = 5;

/// `scheme://host:port` of `url` (the port as written, or the scheme's), lowercased.
pub(super) fn origin(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h).to_ascii_lowercase();
    let scheme = scheme.to_ascii_lowercase();
    let has_port = host.rsplit_once(':').is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let port = match scheme.as_str() {
        _ if has_port => "",
        "https" => ":443",
        "http" => ":80",
        _ => "",
    };
    format!("{scheme}://{host}{port}")
}

/// `GET url`, following a redirect only to the same scheme, host and port (at most
/// [`MAX_REDIRECTS`]): a redirect to another host is an error naming both, never followed (a
/// compromised or misconfigured index must not send aerie's requests elsewhere).
pub(super) fn get_same_host(agent: &ureq::Agent, url: &str) -> Result<ureq::http::Response<ureq::Body>> {
    let mut current = url.to_owned();
    for _ in 0..=MAX_REDIRECTS {
        let resp = agent.get(&current).call().map_err(|e| http_error(&current, e))?;
        if !resp.status().is_redirection() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let Some(location) = resp.headers().get("location").and_then(|v| v.to_str().ok()) else {
            return Err(Error::Http {
                url: current,
                status: Some(status),
                problem: format!("HTTP {status}, a redirect without a Location"),
            });
        };
        let next = super::join_url(&current, location);
        if origin(&next) != origin(&current) {
            return Err(Error::Http {
                url: current.clone(),
                status: Some(status),
                problem: format!(
                    "HTTP {status}: redirected to {next}, another host than {}; aerie follows redirects only \
                     within one host (set AERIE_PYPI_URL to the index that serves the files itself)",
                    origin(&current)
                ),
            });
        }
        current = next;
    }
    Err(Error::Http { url: url.to_owned(), status: None, problem: format!("more than {MAX_REDIRECTS} redirects") })
}

#[cfg(test)]
mod tests {
    use super::super::{agent, get_json};
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
    fn downloads_follow_redirects_only_within_one_host() {
        let (elsewhere, hits) = serve(|_| "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".into());
        let away = format!("{elsewhere}/pypi/x/json");
        let (server, _) = serve(move |path| match path {
            "/moved" => {
                "HTTP/1.1 301 Moved\r\nLocation: /pypi/x/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into()
            }
            "/pypi/x/json" => "HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\n{\"ok\": true}".into(),
            _ => format!("HTTP/1.1 302 Found\r\nLocation: {away}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
        });
        let agent = agent();
        // Within the host: followed.
        let v: serde_json::Value = get_json(&agent, &format!("{server}/moved")).unwrap();
        assert_eq!(v["ok"], true);
        // To another port of the same machine: another server, refused, never asked.
        let e = get_json::<serde_json::Value>(&agent, &format!("{server}/index")).unwrap_err().to_string();
        assert!(e.contains("another host") && e.contains(&elsewhere), "{e}");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(origin("HTTPS://PyPI.org/simple"), "https://pypi.org:443");
        assert_ne!(origin("http://127.0.0.1:8000/a"), origin("http://127.0.0.1:8001/a"));
    }
}
