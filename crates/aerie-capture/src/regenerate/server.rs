//! Regeneration through a running serving engine: a pool of `--concurrency` worker threads, each
//! doing blocking HTTP calls (ureq), bounded retries with doubling backoff on connection errors,
//! timeouts, 429 and 5xx, and a clear error naming the request (conversation, turn, URL, status,
//! the server's message) on any other 4xx. Two dialects:
//!
//! - **SGLang** `POST /generate` with `input_ids` (aerie's own render, so the prompt is exactly
//!   the tokens aerie would feed the native target) and `output_ids` back (the tokens the model
//!   produced, decoded by aerie's tokenizer). Shapes from SGLang's source: `GenerateReqInput`
//!   (`python/sglang/srt/managers/io_struct.py`), `SamplingParams`
//!   (`python/sglang/srt/sampling/sampling_params.py`: `max_new_tokens`, `stop_token_ids`,
//!   `temperature`, `top_p`, `skip_special_tokens`, `sampling_seed`), the response
//!   `{"text", "output_ids", "meta_info": {"finish_reason": {"type": "stop", "matched": id} |
//!   {"type": "length", "length": n} | {"type": "abort", "message"}, "prompt_tokens",
//!   "completion_tokens", ...}}` (`tokenizer_manager.py`, `schedule_batch.py` `FINISH_*`).
//! - **OpenAI-compatible** `POST /v1/chat/completions` with `messages` (the server renders its
//!   own chat template), `choices[0].message.content` and `reasoning_content` back.
//!
//! Detection (`--api auto`): `GET /get_model_info` answers 200 only on SGLang (which also serves
//! `/v1/models`, so it is asked first); otherwise `GET /v1/models` answering 200 with a `data`
//! list is an OpenAI-compatible server.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::engine::{Finish, TurnDone, TurnEngine, TurnJob};
use super::sampling::turn_seed;
use crate::{Error, Result};

/// The HTTP dialect of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// SGLang's native `/generate` (token ids in and out).
    Sglang,
    /// `/v1/chat/completions` (vLLM, llama.cpp, SGLang's OpenAI layer, ...).
    Openai,
    /// Ask the server ([`detect`]).
    Auto,
}

impl std::str::FromStr for Api {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "sglang" => Ok(Api::Sglang),
            "openai" => Ok(Api::Openai),
            "auto" => Ok(Api::Auto),
            _ => Err(format!("`{s}` is not an API: use sglang, openai or auto")),
        }
    }
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Sglang => "sglang",
            Api::Openai => "openai",
            Api::Auto => "auto",
        }
    }
}

/// Where the server is and how to talk to it.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Base URL, `http://host:port` (a trailing `/` is ignored).
    pub url: String,
    /// Dialect; `Auto` asks the server.
    pub api: Api,
    /// `model` of chat requests; `None` = the first id `/v1/models` lists.
    pub model: Option<String>,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Attempts per request beyond the first (connection errors, timeouts, 429, 5xx).
    pub retries: usize,
    /// First backoff; doubled per retry.
    pub backoff: Duration,
    /// Template variables: OpenAI requests carry them as `chat_template_kwargs` (vLLM and
    /// SGLang read it); for SGLang `/generate` they go into aerie's own render.
    pub template_kwargs: BTreeMap<String, Value>,
}

impl ServerOptions {
    /// Defaults: auto-detected API, 8 requests in flight, 600 s timeout, 3 retries from 1 s.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            api: Api::Auto,
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
        if self.timeout.is_zero() {
            return Err(Error::Invalid("--timeout must be more than 0 seconds".into()));
        }
        Ok(())
    }

    fn base(&self) -> &str {
        self.url.trim_end_matches('/')
    }
}

/// The server as resolved at the start of a run: dialect and chat model (OpenAI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resolved {
    pub api: Api,
    pub model: Option<String>,
}

/// What the server side of a run did (the report's `server` object).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerReport {
    /// Base URL.
    pub url: String,
    /// Dialect used (`sglang` or `openai`).
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

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .timeout_connect(Some(timeout.min(Duration::from_secs(10))))
        .build()
        .into()
}

/// Answer `GET path` with (status, body), or the transport error's text.
fn get(agent: &ureq::Agent, url: &str) -> std::result::Result<(u16, String), String> {
    let resp = agent.get(url).header("Accept", "application/json").call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp.into_body().read_to_string().unwrap_or_default();
    Ok((status, body))
}

/// Resolve `--api auto` and the model: SGLang answers `GET /get_model_info` (200, with its
/// `model_path`); an OpenAI-compatible server answers `GET /v1/models` with
/// `{"data": [{"id"}, ...]}` (the first id is the chat model unless `--model` names one).
pub(super) fn detect(opts: &ServerOptions) -> Result<(Resolved, &'static str)> {
    let agent = agent(opts.timeout.min(Duration::from_secs(30)));
    let base = opts.base();
    let mut source = "given";
    let info_url = format!("{base}/get_model_info");
    let info = get(&agent, &info_url);
    let api = match (opts.api, &info) {
        (Api::Auto, Ok((200, _))) => {
            source = "detected";
            Api::Sglang
        }
        (Api::Auto, Ok(_)) => {
            source = "detected";
            Api::Openai
        }
        (Api::Auto, Err(e)) => {
            return Err(Error::Invalid(format!(
                "--server {}: GET {info_url} failed ({e}): is the server running and listening there?",
                opts.url
            )));
        }
        (a, _) => a,
    };
    let model = match (api, &opts.model) {
        (_, Some(m)) => Some(m.clone()),
        // SGLang names its model in /get_model_info (`model_path`).
        (Api::Sglang, None) => info
            .ok()
            .filter(|(status, _)| *status == 200)
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v.get("model_path")?.as_str().map(str::to_owned)),
        (_, None) => {
            let url = format!("{base}/v1/models");
            let (status, body) = get(&agent, &url).map_err(|e| {
                Error::Invalid(format!("--server {}: GET {url} failed ({e}): is the server running?", opts.url))
            })?;
            let first = (status == 200)
                .then(|| serde_json::from_str::<Value>(&body).ok())
                .flatten()
                .and_then(|v| v.get("data")?.get(0)?.get("id")?.as_str().map(str::to_owned));
            Some(first.ok_or_else(|| {
                Error::Invalid(format!(
                    "--server {}: GET {url} answered HTTP {status} without a model id ({}); it does not look \
                     like an OpenAI-compatible server (pass --api sglang for SGLang's /generate, or --model NAME)",
                    opts.url,
                    error_message(&body)
                ))
            })?)
        }
    };
    Ok((Resolved { api, model }, source))
}

/// The server's message in an error body: `message`, `error.message`, `detail`, or the text.
fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let pick = |x: &Value| x.as_str().map(str::to_owned).or_else(|| (!x.is_null()).then(|| x.to_string()));
        v.get("message")
            .and_then(pick)
            .or_else(|| v.get("error").and_then(|e| e.get("message").and_then(pick).or_else(|| pick(e))))
            .or_else(|| v.get("detail").and_then(pick))
    });
    let text = from_json.unwrap_or_else(|| body.trim().to_owned());
    match text.char_indices().nth(400) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// The request body of one turn.
pub(super) fn request_body(resolved: &Resolved, job: &TurnJob, eos: &[u32], kwargs: &BTreeMap<String, Value>) -> Value {
    let s = job.sampling;
    let sampled = s.temperature > 0.0;
    let seed = turn_seed(s.seed, job.source_index, job.turn);
    match resolved.api {
        Api::Sglang => {
            let mut params = json!({
                "max_new_tokens": job.max_new_tokens,
                "temperature": s.temperature,
                "stop_token_ids": eos,
                // The text is not used (aerie decodes output_ids); keep it complete for logs.
                "skip_special_tokens": false,
            });
            if sampled {
                params["top_p"] = json!(s.top_p);
                params["sampling_seed"] = json!(seed);
            }
            json!({"input_ids": job.prompt_ids, "sampling_params": params, "stream": false})
        }
        _ => {
            let messages: Vec<Value> =
                job.messages.iter().map(|m| json!({"role": m.role.as_str(), "content": m.content})).collect();
            let mut body = json!({
                "model": resolved.model.as_deref().unwrap_or("default"),
                "messages": messages,
                "max_tokens": job.max_new_tokens,
                "temperature": s.temperature,
                "stream": false,
            });
            if sampled {
                body["top_p"] = json!(s.top_p);
                body["seed"] = json!(seed);
            }
            if !kwargs.is_empty() {
                body["chat_template_kwargs"] = json!(kwargs);
            }
            if let Some(tools) = &job.tools {
                body["tools"] = tools.clone();
            }
            body
        }
    }
}

/// One failed attempt: what to say, and whether trying again may help (with the cause).
struct Failure {
    status: Option<u16>,
    message: String,
    retry_as: Option<String>,
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
fn attempt(agent: &ureq::Agent, url: &str, body: &str, timeout: Duration) -> std::result::Result<Value, Failure> {
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

/// What a worker sends back: the turn, or the run's fatal error; plus the retried causes.
struct Outcome {
    done: Result<TurnDone>,
    retried: Vec<String>,
    seconds: f64,
}

/// Read one successful response.
pub(super) fn parse_response(api: Api, job: &TurnJob, eos: &[u32], v: &Value) -> std::result::Result<TurnDone, String> {
    let mut done = TurnDone {
        key: job.key,
        ids: None,
        text: None,
        reasoning: None,
        finish: Finish::Eos,
        prompt_tokens: job.prompt_ids.len() as u64,
        tokens: 0,
        prefill_seconds: 0.0,
        decode_seconds: 0.0,
        decode_tokens: 0,
    };
    let u = |x: Option<&Value>| x.and_then(Value::as_u64);
    match api {
        Api::Sglang => {
            let meta = v.get("meta_info").ok_or("no `meta_info` in the /generate response")?;
            let mut ids: Vec<u32> = v
                .get("output_ids")
                .and_then(Value::as_array)
                .ok_or("no `output_ids` list in the /generate response (is this SGLang?)")?
                .iter()
                .map(|x| x.as_u64().map(|n| n as u32).ok_or("`output_ids` holds a non-integer"))
                .collect::<std::result::Result<_, _>>()?;
            let reason = meta.get("finish_reason");
            let kind = reason.and_then(|r| r.get("type")).and_then(Value::as_str).unwrap_or("");
            done.finish = match kind {
                "stop" => Finish::Eos,
                "length" => Finish::Budget,
                "abort" => {
                    let m = reason.and_then(|r| r.get("message")).map(Value::to_string).unwrap_or_default();
                    return Err(format!("the server aborted the request: {m}"));
                }
                other => return Err(format!("unknown meta_info.finish_reason.type `{other}`")),
            };
            let completion = u(meta.get("completion_tokens")).unwrap_or(ids.len() as u64);
            // SGLang keeps the matched stop token in output_ids; it is not part of the answer.
            let matched = reason.and_then(|r| r.get("matched")).and_then(Value::as_u64).map(|n| n as u32);
            if done.finish == Finish::Eos && ids.last().is_some_and(|t| Some(*t) == matched || eos.contains(t)) {
                ids.pop();
            }
            done.prompt_tokens = u(meta.get("prompt_tokens")).unwrap_or(done.prompt_tokens);
            done.tokens = completion;
            done.ids = Some(ids);
        }
        _ => {
            let choice = v.get("choices").and_then(|c| c.get(0)).ok_or("no `choices[0]` in the chat response")?;
            let msg = choice.get("message").ok_or("no `choices[0].message` in the chat response")?;
            let text = |k: &str| msg.get(k).and_then(Value::as_str).map(str::to_owned);
            done.text = Some(text("content").unwrap_or_default());
            done.reasoning = text("reasoning_content").or_else(|| text("reasoning")).filter(|r| !r.is_empty());
            done.finish = match choice.get("finish_reason").and_then(Value::as_str) {
                Some("length") => Finish::Budget,
                _ => Finish::Eos,
            };
            let usage = v.get("usage");
            done.prompt_tokens = u(usage.and_then(|x| x.get("prompt_tokens"))).unwrap_or(done.prompt_tokens);
            done.tokens = u(usage.and_then(|x| x.get("completion_tokens"))).unwrap_or(0);
        }
    }
    done.decode_tokens = done.tokens.saturating_sub(1);
    Ok(done)
}

/// Send one turn with bounded retries; the error names the request.
fn send(agent: &ureq::Agent, ctx: &Worker, job: &TurnJob) -> Outcome {
    let (path, api) = match ctx.resolved.api {
        Api::Sglang => ("/generate", Api::Sglang),
        _ => ("/v1/chat/completions", Api::Openai),
    };
    let url = format!("{}{path}", ctx.base);
    let body = request_body(&ctx.resolved, job, &ctx.eos, &ctx.kwargs).to_string();
    let what = format!("conversation `{}` (record {}), turn {}: POST {url}", job.conv_id, job.source_index, job.turn);
    let mut wait = ctx.backoff;
    let mut retried = Vec::new();
    for n in 0..=ctx.retries {
        let start = Instant::now();
        let res = attempt(agent, &url, &body, ctx.timeout);
        let seconds = start.elapsed().as_secs_f64();
        match res {
            Ok(v) => {
                let done = parse_response(api, job, &ctx.eos, &v).map_err(|m| Error::Server(format!("{what}: {m}")));
                return Outcome { done, retried, seconds };
            }
            Err(f) if f.retry_as.is_some() && n < ctx.retries => {
                retried.push(f.retry_as.unwrap_or_default());
                std::thread::sleep(wait);
                wait *= 2;
            }
            Err(f) => {
                let tries = if f.retry_as.is_some() { format!(" (after {} attempts)", n + 1) } else { String::new() };
                let hint = match f.status {
                    Some(s) if (400..500).contains(&s) && s != 429 => {
                        " (the server refused the request; not retried)".to_owned()
                    }
                    _ => String::new(),
                };
                let done = Err(Error::Server(format!("{what}: {}{tries}{hint}", f.message)));
                return Outcome { done, retried, seconds };
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::engine::Sampling;
    use aerie_data::conversation::{Message, Role};

    fn job(temperature: f32) -> TurnJob {
        TurnJob {
            key: 2,
            conv_id: "c".into(),
            source_index: 5,
            turn: 1,
            prompt_ids: vec![1, 2, 3],
            messages: vec![Message::new(Role::User, "hi")],
            tools: None,
            max_new_tokens: 16,
            sampling: Sampling { temperature, top_p: 0.9, seed: 7 },
        }
    }

    #[test]
    fn bodies_carry_the_ids_or_the_messages_and_seed_only_when_sampling() {
        let sg = Resolved { api: Api::Sglang, model: None };
        let b = request_body(&sg, &job(0.0), &[9], &BTreeMap::new());
        assert_eq!(b["input_ids"], json!([1, 2, 3]));
        assert_eq!(b["sampling_params"]["stop_token_ids"], json!([9]));
        assert!(b["sampling_params"].get("sampling_seed").is_none());
        let b = request_body(&sg, &job(0.7), &[9], &BTreeMap::new());
        assert_eq!(b["sampling_params"]["sampling_seed"], json!(turn_seed(7, 5, 1)));
        let oa = Resolved { api: Api::Openai, model: Some("m".into()) };
        let kw = BTreeMap::from([("thinking".to_owned(), json!(false))]);
        let b = request_body(&oa, &job(0.7), &[9], &kw);
        assert_eq!(b["messages"][0], json!({"role": "user", "content": "hi"}));
        assert_eq!((b["model"].as_str(), b["max_tokens"].as_u64()), (Some("m"), Some(16)));
        assert_eq!(b["chat_template_kwargs"]["thinking"], false);
        assert_eq!(b["seed"], json!(turn_seed(7, 5, 1)));
        assert!(b.get("tools").is_none(), "no tools key without tools");
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let b = request_body(&oa, &TurnJob { tools: Some(tools.clone()), ..job(0.0) }, &[9], &kw);
        assert_eq!(b["tools"], tools, "the conversation's tools go to the server");
    }

    #[test]
    fn responses_of_both_dialects() {
        let j = job(0.0);
        let sg = json!({"text": "ab", "output_ids": [5, 6, 9], "meta_info": {"id": "x", "prompt_tokens": 3,
            "completion_tokens": 3, "finish_reason": {"type": "stop", "matched": 9}}});
        let d = parse_response(Api::Sglang, &j, &[9], &sg).unwrap();
        assert_eq!((d.ids.as_deref(), d.finish, d.tokens), (Some(&[5, 6][..]), Finish::Eos, 3));
        let len = json!({"output_ids": [5, 6], "meta_info": {"completion_tokens": 2,
            "finish_reason": {"type": "length", "length": 2}}});
        assert_eq!(parse_response(Api::Sglang, &j, &[9], &len).unwrap().finish, Finish::Budget);
        let abort = json!({"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "oom"}}});
        assert!(parse_response(Api::Sglang, &j, &[9], &abort).unwrap_err().contains("oom"));
        let chat = json!({"choices": [{"message": {"role": "assistant", "content": "hey", "reasoning_content": "r"},
            "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 16}});
        let d = parse_response(Api::Openai, &j, &[9], &chat).unwrap();
        assert_eq!((d.text.as_deref(), d.reasoning.as_deref()), (Some("hey"), Some("r")));
        assert_eq!((d.finish, d.prompt_tokens, d.tokens), (Finish::Budget, 4, 16));
    }

    #[test]
    fn error_bodies() {
        assert_eq!(error_message(r#"{"error": {"message": "boom"}}"#), "boom");
        assert_eq!(error_message(r#"{"detail": "nope"}"#), "nope");
        assert_eq!(error_message("plain"), "plain");
        assert!("x".parse::<Api>().is_err());
        assert_eq!("sglang".parse::<Api>(), Ok(Api::Sglang));
    }
}
