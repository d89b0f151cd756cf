//! `aerie measure`: what a running SGLang server actually delivers. Sends greedy requests
//! (concurrently, with bounded retries), reads each response's `meta_info`
//! ([`crate::sglang`]), and reports τ = Σ completion_tokens / Σ spec_verify_ct, per-position
//! acceptance from the accepted-drafts histogram, output tokens/s, inter-token latency (from the
//! event stream with `stream`), and the implied cost of one draft+verify cycle. Against a server
//! without speculation it measures T_d, the plain decode step, and can start a costs file
//! ([`crate::cost`]); a later speculative run adds its measured cycle to the same file.
//!
//! Any OpenAI-compatible server measures T_d the same way through its chat stream (no
//! `meta_info`: one token per content delta). Tested against llama.cpp's server
//! (`crates/aerie-cli/tests/regenerate_server.rs`), where the stream's count equals the server's
//! own `usage.completion_tokens` of the same requests unstreamed.

use std::io::{BufRead, BufReader};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::accept::{CurvePoint, conditional_from_unconditional, tau_curve, unconditional_from_histogram};
use crate::cost::{Costs, Provenance, VerifyCost};
use crate::sglang::{
    ChunkProgress, Endpoint, Prompt, SpecMeta, chunk_progress, error_message, parse_meta, request_body, sse_data,
};
use crate::{Error, Result};

/// What to measure and how.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasureOptions {
    /// Server base URL (`http://host:port`).
    pub server: String,
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Tokens per request.
    pub max_new_tokens: usize,
    /// Stream (server-sent events) to time tokens.
    pub stream: bool,
    /// Fail when the server does not speculate.
    pub expect_speculation: bool,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Attempts per request beyond the first (connection errors, timeouts, 429, 5xx).
    pub retries: usize,
    /// First backoff; doubled per retry.
    pub backoff: Duration,
    /// Name of this measurement.
    pub label: String,
    /// `model` of chat requests.
    pub model: String,
}

impl Default for MeasureOptions {
    fn default() -> Self {
        Self {
            server: "http://127.0.0.1:30000".into(),
            endpoint: Endpoint::Chat,
            concurrency: 1,
            max_new_tokens: 256,
            stream: true,
            expect_speculation: false,
            timeout: Duration::from_secs(600),
            retries: 2,
            backoff: Duration::from_millis(500),
            label: String::new(),
            model: "default".into(),
        }
    }
}

/// One request's outcome.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestResult {
    /// What `meta_info` said.
    pub meta: SpecMeta,
    /// Wall time, seconds.
    pub e2e_s: f64,
    /// Time to the first generated chunk (streams).
    pub ttft_s: Option<f64>,
    /// First to last generated chunk (streams).
    pub decode_s: Option<f64>,
    /// Tokens generated after the first chunk (streams).
    pub decode_tokens: Option<u64>,
    /// Attempts made.
    pub attempts: usize,
}

/// An HTTP failure: the message and whether trying again may help.
struct Failure {
    status: Option<u16>,
    message: String,
    retry: bool,
}

fn transport_failure(e: &ureq::Error, timeout: Duration) -> Failure {
    let (message, retry) = match e {
        ureq::Error::Timeout(_) => {
            (format!("no complete answer within {:.1} s (timeout)", timeout.as_secs_f64()), true)
        }
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            ("connection refused: is the server running and listening there?".to_string(), true)
        }
        ureq::Error::ConnectionFailed => {
            ("connection failed: is the server running and listening there?".to_string(), true)
        }
        ureq::Error::HostNotFound => ("host not found".to_string(), false),
        ureq::Error::BadUri(u) => (format!("bad URL `{u}`"), false),
        other => (other.to_string(), true),
    };
    Failure { status: None, message, retry }
}

/// One attempt: POST `body` and return the final response JSON plus stream timings.
fn attempt(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    opts: &MeasureOptions,
) -> std::result::Result<RequestResult, Failure> {
    let start = Instant::now();
    let resp = agent
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", if opts.stream { "text/event-stream" } else { "application/json" })
        .send(body)
        .map_err(|e| transport_failure(&e, opts.timeout))?;
    let status = resp.status().as_u16();
    let mut resp_body = resp.into_body();
    if !(200..300).contains(&status) {
        let text = resp_body.read_to_string().unwrap_or_default();
        let retry = status == 429 || status >= 500;
        return Err(Failure {
            status: Some(status),
            message: format!("HTTP {status}: {}", error_message(&text)),
            retry,
        });
    }
    let bad = |m: String| Failure { status: Some(status), message: m, retry: false };
    if !opts.stream {
        let text = resp_body.read_to_string().map_err(|e| transport_failure(&e, opts.timeout))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| bad(format!("response is not JSON ({e}): {}", error_message(&text))))?;
        return Ok(RequestResult {
            meta: parse_meta(&v),
            e2e_s: start.elapsed().as_secs_f64(),
            attempts: 1,
            ..Default::default()
        });
    }
    let reader = BufReader::new(resp_body.into_reader());
    // (time, tokens so far) of the first and the latest chunk that carried generated text.
    let mut first: Option<(Instant, u64)> = None;
    let mut last: Option<(Instant, u64)> = None;
    let mut final_meta = SpecMeta::default();
    let mut chat_tokens = 0u64;
    for line in reader.lines() {
        let line =
            line.map_err(|e| Failure { status: Some(status), message: format!("stream broke: {e}"), retry: true })?;
        let Some(data) = sse_data(&line) else { continue };
        let v: Value =
            serde_json::from_str(data).map_err(|e| bad(format!("stream event is not JSON ({e}): {data}")))?;
        if v.get("error").is_some() || v.get("object").and_then(Value::as_str) == Some("error") {
            return Err(bad(format!("error inside the stream: {}", error_message(data))));
        }
        let now = Instant::now();
        let count = match chunk_progress(opts.endpoint, &v) {
            ChunkProgress::None => None,
            ChunkProgress::Delta => {
                chat_tokens += 1;
                Some(chat_tokens)
            }
            ChunkProgress::Cumulative(n) => Some(n),
        };
        if let Some(n) = count.filter(|&n| last.is_none_or(|(_, m)| n > m)) {
            first.get_or_insert((now, n));
            last = Some((now, n));
        }
        let meta = parse_meta(&v);
        if meta.completion_tokens.is_some() || meta.verify_ct.is_some() {
            final_meta = meta;
        }
    }
    if final_meta.completion_tokens.is_none() {
        final_meta.completion_tokens = last.map(|(_, n)| n);
    }
    let (ttft_s, decode_s, decode_tokens) = match (first, last) {
        (Some((t0, n0)), Some((t1, n1))) => {
            // Chat deltas are counted per chunk; rescale to the server's token count when known.
            let total = final_meta.completion_tokens.unwrap_or(n1);
            let after_first =
                if opts.endpoint == Endpoint::Chat && n1 > 0 { total.saturating_sub(total * n0 / n1) } else { n1 - n0 };
            (Some((t0 - start).as_secs_f64()), Some((t1 - t0).as_secs_f64()), Some(after_first))
        }
        _ => (None, None, None),
    };
    Ok(RequestResult {
        meta: final_meta,
        e2e_s: start.elapsed().as_secs_f64(),
        ttft_s,
        decode_s,
        decode_tokens,
        attempts: 1,
    })
}

/// Send one prompt with bounded retries and exponential backoff.
fn send(agent: &ureq::Agent, prompt: &Prompt, opts: &MeasureOptions) -> Result<RequestResult> {
    let url = format!("{}{}", opts.server.trim_end_matches('/'), opts.endpoint.path());
    let body = request_body(opts.endpoint, prompt, opts.max_new_tokens, opts.stream, &opts.model)?.to_string();
    let mut wait = opts.backoff;
    for n in 0..=opts.retries {
        match attempt(agent, &url, &body, opts) {
            Ok(mut r) => {
                r.attempts = n + 1;
                return Ok(r);
            }
            Err(f) if f.retry && n < opts.retries => {
                std::thread::sleep(wait);
                wait *= 2;
            }
            Err(f) => {
                let tries = if f.retry { format!(" (after {} attempts)", n + 1) } else { String::new() };
                return Err(Error::Server { url, status: f.status, message: format!("{}{tries}", f.message) });
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}

/// The result of `aerie measure` (its `--json` output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasureReport {
    /// Name of this measurement.
    pub label: String,
    /// Server base URL.
    pub server: String,
    /// Endpoint used.
    pub endpoint: Endpoint,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Tokens asked per request.
    pub max_new_tokens: usize,
    /// Whether tokens were timed from the stream.
    pub stream: bool,
    /// Requests completed.
    pub requests: usize,
    /// Σ completion_tokens.
    pub completion_tokens: u64,
    /// Wall time of the whole run, s.
    pub wall_s: f64,
    /// Σ completion_tokens / wall time: server output throughput.
    pub output_tokens_per_s: f64,
    /// Mean over requests of completion / e2e.
    pub request_tokens_per_s: f64,
    /// Mean time to first token (streams), ms.
    pub ttft_ms: Option<f64>,
    /// Inter-token latency: Σ decode time / Σ decode tokens (streams), ms.
    pub itl_ms: Option<f64>,
    /// Whether the server speculated (`spec_verify_ct` present).
    pub speculative: bool,
    /// Σ spec_verify_ct.
    pub spec_verify_ct: u64,
    /// τ = Σ completion / Σ verify (SGLang's accept length; counts the prefill token too).
    pub tau: Option<f64>,
    /// τ from the histogram: 1 + Σ a·h[a] / Σ h (verify passes only).
    pub tau_from_histogram: Option<f64>,
    /// Σ h[a] over requests.
    pub accept_histogram: Option<Vec<u64>>,
    /// P(at least i drafts accepted), from the histogram.
    pub accept_rate_unconditional: Option<Vec<f64>>,
    /// P(draft i accepted | drafts before it accepted), from the histogram.
    pub accept_rate_conditional: Option<Vec<f64>>,
    /// Draft steps k (histogram length − 1).
    pub steps: Option<usize>,
    /// Tokens verified per pass (drafts per pass + 1, from the server's draft counts).
    pub verify_tokens: Option<usize>,
    /// τ(k') for k' ≤ k from the histogram (a chain whose first k' drafts are the same drafts).
    pub curve: Vec<CurvePoint>,
    /// One draft+verify cycle implied by the timings: ITL × τ_hist (streams) or e2e / verify.
    pub implied_cycle_ms: Option<f64>,
    /// Plain decode step (no speculation): the ITL, or e2e / tokens without a stream.
    pub t_d_ms: Option<f64>,
    /// Caveats.
    pub warnings: Vec<String>,
}

/// Measure `prompts` against the server. `progress(done, total)` may be called from worker
/// threads.
pub fn measure(
    prompts: &[Prompt],
    opts: &MeasureOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<MeasureReport> {
    if prompts.is_empty() || opts.concurrency == 0 || opts.max_new_tokens == 0 {
        return Err(Error::Incompatible("need at least one prompt, concurrency >= 1 and max_new_tokens >= 1".into()));
    }
    if !(opts.server.starts_with("http://") || opts.server.starts_with("https://")) {
        return Err(Error::Incompatible(format!("--server `{}` must be an http:// or https:// URL", opts.server)));
    }
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(opts.timeout))
        .timeout_connect(Some(opts.timeout.min(Duration::from_secs(10))))
        .build();
    let agent: ureq::Agent = config.into();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let results: Mutex<Vec<RequestResult>> = Mutex::new(Vec::with_capacity(prompts.len()));
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..opts.concurrency.min(prompts.len()) {
            s.spawn(|| {
                while !abort.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = prompts.get(i) else { break };
                    match send(&agent, p, opts) {
                        Ok(r) => results.lock().expect("no poisoned lock").push(r),
                        Err(e) => {
                            abort.store(true, Ordering::Relaxed);
                            failure.lock().expect("no poisoned lock").get_or_insert(e);
                        }
                    }
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, prompts.len());
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().expect("no poisoned lock") {
        return Err(e);
    }
    let report = summarize(&results.into_inner().expect("no poisoned lock"), start.elapsed().as_secs_f64(), opts);
    if opts.expect_speculation && !report.speculative {
        return Err(Error::Server {
            url: opts.server.clone(),
            status: None,
            message: "speculation was expected but no response carried `spec_verify_ct` in meta_info: is the server started with --speculative-algorithm EAGLE3 (and, for chat, does it honour return_meta_info)?".into(),
        });
    }
    Ok(report)
}

/// Reduce per-request results (pure; `wall_s` is the run's wall time).
pub fn summarize(results: &[RequestResult], wall_s: f64, opts: &MeasureOptions) -> MeasureReport {
    let mut warnings = Vec::new();
    let completion: u64 = results.iter().filter_map(|r| r.meta.completion_tokens).sum();
    let verify: u64 = results.iter().filter_map(|r| r.meta.verify_ct).sum();
    let speculative = verify > 0;
    let spec_requests = results.iter().filter(|r| r.meta.verify_ct.is_some()).count();
    if speculative && spec_requests < results.len() {
        warnings.push(format!(
            "{} of {} responses carried no spec_verify_ct",
            results.len() - spec_requests,
            results.len()
        ));
    }
    let mut hist: Option<Vec<u64>> = None;
    for h in results.iter().filter_map(|r| r.meta.histogram.as_ref()) {
        let acc = hist.get_or_insert_with(Vec::new);
        if acc.len() < h.len() {
            acc.resize(h.len(), 0);
        }
        acc.iter_mut().zip(h).for_each(|(a, b)| *a += b);
    }
    let hist_f: Option<Vec<f64>> = hist.as_ref().map(|h| h.iter().map(|&x| x as f64).collect());
    let r = hist_f.as_deref().map(unconditional_from_histogram);
    let tau_hist = r.as_ref().map(|r| 1.0 + r.iter().sum::<f64>());
    let steps = hist.as_ref().map(|h| h.len().saturating_sub(1)).filter(|&k| k > 0);
    let proposed: u64 = results.iter().filter_map(|r| r.meta.proposed_drafts).sum();
    let spec_verify_with_drafts: u64 =
        results.iter().filter(|r| r.meta.proposed_drafts.is_some()).filter_map(|r| r.meta.verify_ct).sum();
    let verify_tokens =
        (spec_verify_with_drafts > 0).then(|| (proposed as f64 / spec_verify_with_drafts as f64).round() as usize + 1);
    let mut curve: Vec<CurvePoint> = Vec::new();
    if let (Some(r), Some(k)) = (&r, steps) {
        let is_chain = verify_tokens.is_none_or(|n| n == k + 1);
        if is_chain {
            curve = tau_curve(r)
                .into_iter()
                .enumerate()
                .map(|(i, tau)| CurvePoint { k: i + 1, verify_tokens: i + 2, tau })
                .collect();
        } else if let (Some(n), Some(t)) = (verify_tokens, tau_hist) {
            warnings.push(format!(
                "tree drafting ({n} verified tokens for {k} steps): only the full configuration is a curve point"
            ));
            curve.push(CurvePoint { k, verify_tokens: n, tau: t });
        }
    }
    if speculative && hist.is_none() {
        warnings.push(
            "no accepted-drafts histogram in meta_info: per-position rates are unavailable (older SGLang?)".into(),
        );
    }
    let streamed: Vec<&RequestResult> = results.iter().filter(|r| r.decode_s.is_some()).collect();
    let decode_s: f64 = streamed.iter().filter_map(|r| r.decode_s).sum();
    let decode_tokens: u64 = streamed.iter().filter_map(|r| r.decode_tokens).sum();
    let itl_ms = (decode_tokens > 0).then(|| 1000.0 * decode_s / decode_tokens as f64);
    let ttft: Vec<f64> = results.iter().filter_map(|r| r.ttft_s).collect();
    let e2e: f64 = results.iter().map(|r| r.e2e_s).sum();
    if opts.stream && itl_ms.is_none() && !results.is_empty() {
        warnings.push(
            "the stream carried no timed tokens: ITL unavailable, costs fall back to e2e / tokens (prefill included)"
                .into(),
        );
    }
    if opts.concurrency > 1 {
        warnings.push(format!(
            "concurrency {}: step times are those of a batch of up to {} sequences",
            opts.concurrency, opts.concurrency
        ));
    }
    let (implied_cycle_ms, t_d_ms) = if speculative {
        let cycle = match (itl_ms, tau_hist.or((verify > 0).then(|| completion as f64 / verify as f64))) {
            (Some(itl), Some(t)) => Some(itl * t),
            _ => {
                warnings.push("implied cycle from e2e / verify passes: includes prefill and queueing".into());
                (verify > 0).then(|| 1000.0 * e2e / verify as f64)
            }
        };
        (cycle, None)
    } else {
        let td = itl_ms.or_else(|| {
            warnings.push("T_d from e2e / tokens includes prefill: use --stream for the decode step alone".into());
            (completion > 0).then(|| 1000.0 * e2e / completion as f64)
        });
        (None, td)
    };
    MeasureReport {
        label: opts.label.clone(),
        server: opts.server.clone(),
        endpoint: opts.endpoint,
        concurrency: opts.concurrency,
        max_new_tokens: opts.max_new_tokens,
        stream: opts.stream,
        requests: results.len(),
        completion_tokens: completion,
        wall_s,
        output_tokens_per_s: if wall_s > 0.0 { completion as f64 / wall_s } else { 0.0 },
        request_tokens_per_s: mean(
            results.iter().filter(|r| r.e2e_s > 0.0).map(|r| r.meta.completion_tokens.unwrap_or(0) as f64 / r.e2e_s),
        ),
        ttft_ms: (!ttft.is_empty()).then(|| 1000.0 * ttft.iter().sum::<f64>() / ttft.len() as f64),
        itl_ms,
        speculative,
        spec_verify_ct: verify,
        tau: (verify > 0).then(|| completion as f64 / verify as f64),
        tau_from_histogram: tau_hist,
        accept_rate_conditional: r.as_deref().map(conditional_from_unconditional),
        accept_rate_unconditional: r,
        accept_histogram: hist,
        steps,
        verify_tokens,
        curve,
        implied_cycle_ms,
        t_d_ms,
        warnings,
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// The costs file a measurement writes: a plain run starts one (T_d, and T_v(1) = T_d by
/// definition); a speculative run adds its measured cycle `cycle_ms.k` to `existing`, which must
/// hold T_d from a plain run of the same server.
pub fn costs_from_report(report: &MeasureReport, existing: Option<Costs>, provenance: Provenance) -> Result<Costs> {
    let err = |m: &str| Error::Incompatible(m.to_string());
    if !report.speculative {
        let t_d = report.t_d_ms.ok_or_else(|| err("no decode time measured: no tokens came back"))?;
        let mut p = provenance;
        p.measured.push("t_d_ms".into());
        p.measured.push("t_v.table.1 (= t_d_ms: a verify pass over one token is a decode step)".into());
        return Ok(Costs {
            name: if report.label.is_empty() { "measured".into() } else { report.label.clone() },
            t_d_ms: t_d,
            t_v: Some(VerifyCost { table: [("1".to_string(), t_d)].into(), ..Default::default() }),
            provenance: p,
            ..Default::default()
        });
    }
    let mut costs = existing.ok_or_else(|| {
        err("a speculative run adds its cycle to a costs file holding T_d: run `aerie measure --out FILE` against the plain server first")
    })?;
    let cycle = report.implied_cycle_ms.ok_or_else(|| err("no cycle cost could be derived from this run"))?;
    let k = report
        .steps
        .ok_or_else(|| err("the server sent no accepted-drafts histogram: the draft steps k are unknown"))?;
    if report.verify_tokens.is_some_and(|n| n != k + 1) {
        return Err(err("tree drafting: cycle_ms holds chain cycles (k drafts, k+1 verified tokens) only"));
    }
    costs.cycle_ms.insert(k.to_string(), cycle);
    costs.provenance.measured.push(format!("cycle_ms.{k} ({}: {})", provenance.when, provenance.measured_where));
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(completion: u64, verify: u64, hist: Vec<u64>, decode_s: f64, decode_tokens: u64) -> RequestResult {
        RequestResult {
            meta: SpecMeta {
                completion_tokens: Some(completion),
                verify_ct: Some(verify),
                proposed_drafts: Some(verify * (hist.len() as u64 - 1)),
                histogram: Some(hist),
                ..Default::default()
            },
            e2e_s: 1.0,
            ttft_s: Some(0.1),
            decode_s: Some(decode_s),
            decode_tokens: Some(decode_tokens),
            attempts: 1,
        }
    }

    #[test]
    fn speculative_summary_by_hand() {
        // Two requests, k = 2: histograms [1, 1, 2] and [0, 2, 0] → h = [1, 3, 2], 6 passes,
        // r_1 = 5/6, r_2 = 2/6, τ_hist = 1 + 7/6. Completion 9 + 5 over 4 + 2 passes → τ = 14/6.
        let rs = [spec(9, 4, vec![1, 1, 2], 0.16, 8), spec(5, 2, vec![0, 2, 0], 0.08, 4)];
        let rep = summarize(&rs, 2.0, &MeasureOptions::default());
        assert!(rep.speculative);
        assert_eq!(rep.accept_histogram, Some(vec![1, 3, 2]));
        assert!((rep.tau.unwrap() - 14.0 / 6.0).abs() < 1e-12);
        assert!((rep.tau_from_histogram.unwrap() - (1.0 + 7.0 / 6.0)).abs() < 1e-12);
        let r = rep.accept_rate_unconditional.clone().unwrap();
        assert!((r[0] - 5.0 / 6.0).abs() < 1e-12 && (r[1] - 2.0 / 6.0).abs() < 1e-12);
        assert!((rep.accept_rate_conditional.as_ref().unwrap()[1] - 0.4).abs() < 1e-12);
        assert_eq!((rep.steps, rep.verify_tokens), (Some(2), Some(3)));
        assert_eq!(rep.curve.len(), 2);
        // ITL = 0.24 s / 12 tokens = 20 ms; cycle = 20 ms × τ_hist.
        assert!((rep.itl_ms.unwrap() - 20.0).abs() < 1e-9);
        assert!((rep.implied_cycle_ms.unwrap() - 20.0 * (13.0 / 6.0)).abs() < 1e-9);
        assert_eq!(rep.output_tokens_per_s, 7.0);
    }

    #[test]
    fn plain_then_speculative_costs_file() {
        let plain = RequestResult {
            meta: SpecMeta { completion_tokens: Some(11), ..Default::default() },
            e2e_s: 0.2,
            ttft_s: Some(0.05),
            decode_s: Some(0.121),
            decode_tokens: Some(10),
            attempts: 1,
        };
        let rep = summarize(&[plain], 0.2, &MeasureOptions::default());
        assert!(!rep.speculative);
        assert!((rep.t_d_ms.unwrap() - 12.1).abs() < 1e-9);
        let prov =
            Provenance { measured_where: "mock".into(), when: "now".into(), by: "test".into(), ..Default::default() };
        let costs = costs_from_report(&rep, None, prov.clone()).unwrap();
        assert!(costs.validate().is_ok());
        assert_eq!(costs.verify_ms(1), Some(costs.t_d_ms));
        let srep = summarize(&[spec(9, 4, vec![1, 1, 2], 0.16, 8)], 1.0, &MeasureOptions::default());
        assert!(costs_from_report(&srep, None, prov.clone()).unwrap_err().to_string().contains("plain server first"));
        let both = costs_from_report(&srep, Some(costs), prov).unwrap();
        assert!(both.cycle_ms.contains_key("2"));
        assert!(both.validate().is_ok());
    }
}
