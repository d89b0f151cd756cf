//! Regeneration through a running serving engine: a pool of `--concurrency` worker threads, each
//! doing blocking HTTP calls (ureq) with aerie-engine's one retry rule ([`aerie_engine::retry`]:
//! bounded, doubling backoff on connection errors, timeouts, 429 and 5xx), and a clear error
//! naming the request (conversation, turn, URL, status, the server's message) on any other
//! failure. Every engine's request body and answer (SGLang's `/generate` with ids, vLLM's
//! ids-in/ids-out `/v1/completions`, OpenAI-compatible chat) are aerie-engine's
//! ([`aerie_engine::turn`]); `dialect` hands it the job. Detection (`--api auto`), the agent,
//! its response-size cap and error bodies are aerie-engine's too.

mod dialect;

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use aerie_engine::Engine;

use super::engine::{TurnDone, TurnEngine, TurnJob};
use crate::{Error, Result};
use aerie_engine::http::{agent, post_json};
use aerie_engine::retry::{Retry, with_retries};
pub(super) use dialect::detect;
use dialect::{parse_response, request_body};

/// Where the server is and how to talk to it.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Base URL, `http://host:port` (a trailing `/` is ignored).
    pub url: String,
    /// The server's engine (dialect); `None` (`--api auto`) asks the server
    /// ([`aerie_engine::detect`]).
    pub api: Option<Engine>,
    /// `model` of chat and completion requests; `None` = the first id `/v1/models` lists.
    pub model: Option<String>,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Attempts per request beyond the first (connection errors, timeouts, 429, 5xx).
    pub retries: usize,
    /// First backoff; doubled per retry.
    pub backoff: Duration,
    /// Template variables: OpenAI chat requests carry them as `chat_template_kwargs` (vLLM and
    /// SGLang read it); for SGLang `/generate` and vLLM's ids-in completions they go into
    /// aerie's own render.
    pub template_kwargs: BTreeMap<String, Value>,
}

impl ServerOptions {
    /// Defaults: auto-detected engine, 8 requests in flight, 600 s timeout, 3 retries from 1 s.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            api: None,
            model: None,
            concurrency: 8,
            timeout: Duration::from_secs(600),
            retries: 3,
            backoff: Duration::from_secs(1),
            template_kwargs: BTreeMap::new(),
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(Error::Invalid(format!("--server `{}` must be an http:// or https:// URL", self.url)));
        }
        if self.concurrency == 0 {
            return Err(Error::Invalid("--concurrency must be at least 1".into()));
        }
        // One thread per request in flight: bounded before they are spawned (10^8 panicked).
        if self.concurrency > MAX_CONCURRENCY {
            return Err(Error::Invalid(format!(
                "--concurrency {} is past the limit of {MAX_CONCURRENCY} requests in flight (one thread each; \
                 a serving engine batches a few hundred at most)",
                self.concurrency
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::Invalid("--timeout must be more than 0 seconds".into()));
        }
        Ok(())
    }

    fn base(&self) -> &str {
        self.url.trim_end_matches('/')
    }
}

/// Requests in flight at most (`--concurrency`), each a thread.
const MAX_CONCURRENCY: usize = 1024;

/// The server as resolved at the start of a run: dialect and chat model (OpenAI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resolved {
    pub api: Engine,
    pub model: Option<String>,
}

/// What the server side of a run did (the report's `server` object).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerReport {
    /// Base URL.
    pub url: String,
    /// Dialect used (`sglang`, `vllm` or `openai`).
    pub api: String,
    /// How the dialect was chosen: `given` or `detected`.
    pub api_source: String,
    /// The model: `--model`, else the first `/v1/models` id (OpenAI) or SGLang's `model_path`.
    pub model: Option<String>,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Requests that succeeded.
    pub requests: u64,
    /// Attempts retried (each failed attempt that was tried again).
    pub retries: u64,
    /// Retried attempts per cause: the HTTP status (`429`, `503`, ...), `timeout` or
    /// `connection`.
    pub retried: BTreeMap<String, u64>,
    /// Mean seconds per successful request (its last attempt).
    pub mean_request_seconds: f64,
    /// Σ completion tokens / Σ request seconds over the successful requests: one request's
    /// decode rate as the client saw it (prefill and queueing included).
    pub request_tokens_per_second: f64,
}

/// What a worker sends back: the turn, or the run's fatal error; plus the retried causes.
struct Outcome {
    done: Result<TurnDone>,
    retried: Vec<String>,
    seconds: f64,
}

/// Send one turn with aerie-engine's retries; the error names the request.
fn send(agent: &ureq::Agent, ctx: &Worker, job: &TurnJob) -> Outcome {
    let url = format!("{}{}", ctx.base, aerie_engine::turn::path(ctx.resolved.api));
    let body = request_body(&ctx.resolved, job, &ctx.eos, &ctx.kwargs).to_string();
    let what = format!("conversation `{}` (record {}), turn {}: POST {url}", job.conv_id, job.source_index, job.turn);
    let policy = Retry { retries: ctx.retries, backoff: ctx.backoff };
    let tries = with_retries(policy, || {
        let start = Instant::now();
        post_json(agent, &url, &body, ctx.timeout).map(|v| (v, start.elapsed().as_secs_f64()))
    });
    let (done, seconds) = match tries.result {
        Ok((v, seconds)) => (
            parse_response(&ctx.resolved, job, &ctx.eos, &v).map_err(|m| Error::Server(format!("{what}: {m}"))),
            seconds,
        ),
        Err(f) => (Err(Error::Server(format!("{what}: {}", f.explain(tries.attempts)))), 0.0),
    };
    Outcome { done, retried: tries.retried, seconds }
}

/// What every worker shares.
struct Worker {
    base: String,
    resolved: Resolved,
    eos: Vec<u32>,
    kwargs: BTreeMap<String, Value>,
    timeout: Duration,
    retries: usize,
    backoff: Duration,
}

/// The server engine: `concurrency` worker threads taking jobs from one queue.
pub(super) struct ServerEngine {
    jobs: Option<Sender<TurnJob>>,
    done: Receiver<Outcome>,
    capacity: usize,
    report: ServerReport,
    request_seconds: f64,
    request_tokens: u64,
}

impl ServerEngine {
    /// Start the workers. They end when the engine is dropped (after their current request).
    pub(super) fn start(opts: &ServerOptions, resolved: Resolved, api_source: &str, eos: &[u32]) -> Self {
        let (jobs_tx, jobs_rx) = channel::<TurnJob>();
        let (done_tx, done_rx) = channel::<Outcome>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let shared = Arc::new(Worker {
            base: opts.base().to_owned(),
            resolved: resolved.clone(),
            eos: eos.to_vec(),
            kwargs: opts.template_kwargs.clone(),
            timeout: opts.timeout,
            retries: opts.retries,
            backoff: opts.backoff,
        });
        let agent = agent(opts.timeout);
        for _ in 0..opts.concurrency {
            let (rx, tx, ctx, agent) = (Arc::clone(&jobs_rx), done_tx.clone(), Arc::clone(&shared), agent.clone());
            std::thread::spawn(move || {
                loop {
                    let job = match rx.lock().map(|r| r.recv()) {
                        Ok(Ok(job)) => job,
                        _ => break,
                    };
                    if tx.send(send(&agent, &ctx, &job)).is_err() {
                        break;
                    }
                }
            });
        }
        let report = ServerReport {
            url: opts.url.clone(),
            api: resolved.api.name().to_owned(),
            api_source: api_source.to_owned(),
            model: resolved.model,
            concurrency: opts.concurrency,
            ..ServerReport::default()
        };
        Self {
            jobs: Some(jobs_tx),
            done: done_rx,
            capacity: opts.concurrency,
            report,
            request_seconds: 0.0,
            request_tokens: 0,
        }
    }

    /// The counters so far.
    fn report(&self) -> ServerReport {
        let mut r = self.report.clone();
        r.mean_request_seconds = self.request_seconds / (r.requests.max(1) as f64);
        r.request_tokens_per_second = self.request_tokens as f64 / self.request_seconds.max(1e-9);
        r
    }
}

impl Drop for ServerEngine {
    fn drop(&mut self) {
        // Closing the queue ends each worker after its current request.
        self.jobs.take();
    }
}

impl TurnEngine for ServerEngine {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn submit(&mut self, job: TurnJob) -> Result<()> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| Error::Server("the request workers have stopped".into()))
    }

    fn next_done(&mut self, _on_tokens: &mut dyn FnMut(u64)) -> Result<TurnDone> {
        let o = self.done.recv().map_err(|_| Error::Server("the request workers have stopped".into()))?;
        for cause in o.retried {
            self.report.retries += 1;
            *self.report.retried.entry(cause).or_default() += 1;
        }
        let done = o.done?;
        self.report.requests += 1;
        self.request_seconds += o.seconds;
        self.request_tokens += done.tokens;
        Ok(done)
    }

    fn finish_report(&self, report: &mut super::RegenerateReport) {
        report.server = Some(self.report());
    }
}
