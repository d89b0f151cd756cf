//! Bounded retries with doubling backoff, the one rule of every request aerie sends to a serving
//! engine (`regenerate --server`'s turns, `measure`'s and `eval serve`'s timed requests): an
//! attempt that failed for a transient cause ([`Failure::retry_as`]: connection errors,
//! timeouts, 429, 5xx) is tried again after a wait that doubles each time, at most
//! [`Retry::retries`] times; any other failure ends the request at once.

use std::time::Duration;

use crate::http::Failure;

/// How often to try again and how long to wait first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts beyond the first.
    pub retries: usize,
    /// The first wait; doubled after each retry.
    pub backoff: Duration,
}

/// What the attempts of one request came to.
#[derive(Debug)]
pub struct Attempts<T> {
    /// The answer, or the last failure.
    pub result: Result<T, Failure>,
    /// Attempts made (1 when the first one decided).
    pub attempts: usize,
    /// The cause of each attempt that was tried again, in order (a report counts them).
    pub retried: Vec<String>,
}

/// Run `attempt` until it succeeds, fails for good, or has been retried `policy.retries` times.
pub fn with_retries<T>(policy: Retry, mut attempt: impl FnMut() -> Result<T, Failure>) -> Attempts<T> {
    let mut wait = policy.backoff;
    let mut retried = Vec::new();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt() {
            Err(f) if attempts <= policy.retries && f.retry_as.is_some() => {
                retried.push(f.retry_as.unwrap_or_default());
                std::thread::sleep(wait);
                wait = wait.saturating_mul(2);
            }
            result => return Attempts { result, attempts, retried },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{agent, post_json};

    /// A server that answers its n-th request with `replies[n]` (status, body), 404 after.
    fn scripted(replies: &'static [(u16, &'static str)]) -> String {
        let base =
            crate::fake::serve(|n, _| replies.get(n).map_or((404, String::new()), |&(st, b)| (st, b.to_owned())));
        format!("{base}/generate")
    }

    /// What the real engines cannot be made to show on demand: transient errors, then an answer;
    /// a refusal; transient errors to the end.
    #[test]
    fn transient_failures_are_retried_with_their_causes_and_refusals_are_not() {
        let policy = Retry { retries: 2, backoff: Duration::from_millis(5) };
        let a = agent(Duration::from_secs(5));
        let send = |url: &str| with_retries(policy, || post_json(&a, url, "{}", Duration::from_secs(5)));

        let url = scripted(&[(503, r#"{"detail": "busy"}"#), (429, "slow down"), (200, r#"{"ok": 1}"#)]);
        let r = send(&url);
        assert_eq!(r.result.unwrap()["ok"], 1);
        assert_eq!((r.attempts, r.retried), (3, vec!["503".to_owned(), "429".to_owned()]));

        let url = scripted(&[(400, r#"{"object": "error", "message": "too long"}"#), (200, "{}")]);
        let r = send(&url);
        let f = r.result.unwrap_err();
        assert_eq!((r.attempts, f.status), (1, Some(400)));
        assert_eq!(f.explain(r.attempts), "HTTP 400: too long (the server refused the request; not retried)");

        let url = scripted(&[(500, r#"{"error": {"message": "oom"}}"#); 3]);
        let r = send(&url);
        let f = r.result.unwrap_err();
        assert_eq!(r.attempts, 3);
        assert_eq!(f.explain(r.attempts), "HTTP 500: oom (after 3 attempts)");

        let url = scripted(&[(200, "not json")]);
        let r = send(&url);
        assert_eq!(r.attempts, 1, "an unreadable answer is final");
        assert!(r.result.unwrap_err().message.contains("not JSON"));

        // Nobody listening: a connection failure, retried, then said with its count.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let r = send(&format!("http://127.0.0.1:{port}/generate"));
        assert_eq!(r.retried, vec!["connection".to_owned(); 2]);
        let f = r.result.unwrap_err();
        assert!(f.explain(r.attempts).ends_with("listening there? (after 3 attempts)"), "{}", f.explain(3));
    }
}
