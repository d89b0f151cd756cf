//! `aerie measure`: what a running serving engine actually delivers. Sends greedy requests
//! (concurrently, with bounded retries) and reports τ and per-position acceptance, output
//! tokens/s, inter-token latency (from the event stream), and the implied cost of one
//! draft+verify cycle. The engine is asked what it is ([`aerie_engine::detect`]) unless named:
//! - SGLang: each response's `meta_info` ([`aerie_engine::meta`]): τ and per-position acceptance
//!   from the accepted-drafts histogram;
//! - vLLM: its Prometheus counters before and after the run ([`aerie_engine::counters`]);
//! - any other OpenAI-compatible server: timings only (no speculation is visible).
//!
//! Against a server without speculation it measures T_d, the plain decode step, and can start a
//! costs file ([`crate::cost`]); a later speculative run adds its measured cycle to the same file.
//! Token counts come from the stream's cumulative usage when the server sends it (vLLM and SGLang
//! with `continuous_usage_stats`: a speculative chunk carries several tokens), else one per content
//! delta. Tested against vLLM's CPU build (`crates/aerie-cli/tests/serve_vllm.rs`) and SGLang on
//! the CPU (`crates/aerie-cli/tests/serve_sglang.rs`).
//!
//! τ means one thing in every engine and in aerie's decoder (docs/serving.md, "τ"): tokens per
//! verify cycle, 1 + Σ accepted drafts / Σ verify cycles (the bonus token counted once per cycle).
//! SGLang's own `spec_accept_length`, completion tokens / verify cycles, also counts each answer's
//! first token, which no cycle produced, and the drafts cut off at the token limit; it is reported
//! beside τ as `tokens_per_verify`, never as τ.

mod client;
mod pool;

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use client::{RequestResult, agent, send};
pub use pool::run_pool;

use aerie_engine::Engine;
use aerie_engine::counters::{SETTLE_WAIT, settled_vllm_counters, vllm_counters};
use aerie_engine::detect::detect;
use aerie_engine::meta::{Endpoint, Request};

use crate::accept::{CurvePoint, tau_curve};
use crate::cost::{Costs, Provenance, VerifyCost};
use crate::engine_acceptance::RunAcceptance;
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
    /// The server's engine; `None` asks the server ([`aerie_engine::detect`]).
    pub api: Option<Engine>,
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
            api: None,
        }
    }
}

/// The result of `aerie measure` (its `--json` output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasureReport {
    /// Name of this measurement.
    pub label: String,
    /// Server base URL.
    pub server: String,
    /// The server's engine, as detected or named.
    pub api: Engine,
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
    /// τ = 1 + Σ accepted drafts / Σ verify cycles: from the histogram (or vLLM's counters), else
    /// from the accepted-draft counts; completion / verify only when neither came back (warned).
    pub tau: Option<f64>,
    /// Σ completion / Σ verify: SGLang's `spec_accept_length` convention (the prefill token
    /// counted too), for comparison with SGLang's own reports; not τ.
    pub tokens_per_verify: Option<f64>,
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
    prompts: &[Request],
    opts: &MeasureOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<MeasureReport> {
    if prompts.is_empty() || opts.concurrency == 0 || opts.max_new_tokens == 0 {
        return Err(Error::Incompatible("need at least one prompt, concurrency >= 1 and max_new_tokens >= 1".into()));
    }
    if !(opts.server.starts_with("http://") || opts.server.starts_with("https://")) {
        return Err(Error::Incompatible(format!("--server `{}` must be an http:// or https:// URL", opts.server)));
    }
    let api = match opts.api {
        Some(api) => api,
        None => detect(&opts.server, None, Some(&opts.model))?.engine,
    };
    let before = if api == Engine::Vllm { Some(vllm_counters(&opts.server)?) } else { None };
    let agent = agent(opts);
    let start = Instant::now();
    let results = run_pool(prompts, opts.concurrency, &|p| send(&agent, p, opts), &|n| progress(n, prompts.len()))?;
    let mut report = summarize(&results, start.elapsed().as_secs_f64(), opts);
    report.api = api;
    if let Some(before) = before {
        let settled = settled_vllm_counters(&opts.server, SETTLE_WAIT)?;
        report.warnings.extend(settled.warning);
        let after = settled.counters;
        if after.drafts > before.drafts {
            let k = after.accepted_per_pos.len();
            let acceptance = RunAcceptance::between(&before, &after, k).map_err(|e| Error::Server {
                url: opts.server.clone(),
                status: None,
                message: e.to_string(),
            })?;
            apply_counters(&mut report, &acceptance);
        }
    }
    if report.completion_tokens == 0 {
        return Err(Error::Server {
            url: opts.server.clone(),
            status: None,
            message: format!(
                "{} requests answered as {} but no generated token came back: is `--model {}` served there, and is `--endpoint {}` its API?",
                report.requests,
                api,
                opts.model,
                match opts.endpoint {
                    Endpoint::Chat => "chat",
                    Endpoint::Generate => "generate",
                }
            ),
        });
    }
    if opts.expect_speculation && !report.speculative {
        return Err(Error::Server {
            url: opts.server.clone(),
            status: None,
            message: match api {
                Engine::Vllm => "speculation was expected but vLLM's spec_decode counters did not move: is the server started with --speculative-config?".into(),
                _ => "speculation was expected but no response carried `spec_verify_ct` in meta_info: is the server started with --speculative-algorithm EAGLE3 (and, for chat, does it honour return_meta_info)?".into(),
            },
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
    let proposed: u64 = results.iter().filter_map(|r| r.meta.proposed_drafts).sum();
    let spec_verify_with_drafts: u64 =
        results.iter().filter(|r| r.meta.proposed_drafts.is_some()).filter_map(|r| r.meta.verify_ct).sum();
    let verify_tokens =
        (spec_verify_with_drafts > 0).then(|| (proposed as f64 / spec_verify_with_drafts as f64).round() as usize + 1);
    // SGLang's histogram ends at the most drafts any cycle accepted (a run that never accepted
    // all k sends fewer than k + 1 entries): a chain of k drafts has k + 1.
    if let (Some(h), Some(n)) = (hist.as_mut(), verify_tokens)
        && h.len() < n
    {
        h.resize(n, 0);
    }
    // The one histogram-to-τ reduction (`eval serve` reads SGLang's histograms through it too).
    let acc = hist.as_deref().and_then(|h| RunAcceptance::from_histogram(h).ok());
    let r = acc.as_ref().map(|a| a.accept_rate_unconditional.clone());
    let tau_hist = acc.as_ref().map(|a| a.tau);
    let steps = hist.as_ref().map(|h| h.len().saturating_sub(1)).filter(|&k| k > 0);
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
    // τ by the one convention: accepted drafts per verify cycle, plus the bonus token.
    let accepted_counts: Option<u64> = (spec_requests > 0
        && results.iter().all(|r| r.meta.verify_ct.is_none() || r.meta.accepted_drafts.is_some()))
    .then(|| results.iter().filter(|r| r.meta.verify_ct.is_some()).filter_map(|r| r.meta.accepted_drafts).sum());
    let tau = match (tau_hist, accepted_counts) {
        _ if !speculative => None,
        (Some(t), _) => Some(t),
        (None, Some(a)) => Some(1.0 + a as f64 / verify as f64),
        (None, None) => {
            warnings.push(
                "τ from completion tokens / verify cycles: the server returned no accepted-draft counts, so each answer's first token counts too"
                    .into(),
            );
            Some(completion as f64 / verify as f64)
        }
    };
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
        let cycle = match (itl_ms, tau) {
            (Some(itl), Some(t)) => Some(itl * t),
            _ => {
                warnings.push("implied cycle from e2e / verify passes: includes prefill and queueing".into());
                (verify > 0).then(|| 1000.0 * e2e / verify as f64)
            }
        };
        (cycle, None)
    } else {
        let td = itl_ms.or_else(|| {
            warnings.push(
                "T_d from e2e / tokens includes prefill: stream (drop --no-stream) to time the decode step alone"
                    .into(),
            );
            (completion > 0).then(|| 1000.0 * e2e / completion as f64)
        });
        (None, td)
    };
    MeasureReport {
        label: opts.label.clone(),
        server: opts.server.clone(),
        api: opts.api.unwrap_or(Engine::Sglang),
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
        tau,
        tokens_per_verify: (verify > 0).then(|| completion as f64 / verify as f64),
        tau_from_histogram: tau_hist,
        accept_rate_conditional: acc.as_ref().map(|a| a.accept_rate_conditional.clone()),
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

/// A vLLM run's acceptance read from the engine's counters (responses carry none): τ, the rates
/// by position, and the cycle implied by the streamed inter-token time.
fn apply_counters(report: &mut MeasureReport, acc: &RunAcceptance) {
    let k = acc.accepted_per_pos.len();
    report.speculative = true;
    report.spec_verify_ct = acc.drafts;
    report.tau = Some(acc.tau);
    report.tau_from_histogram = Some(acc.tau);
    report.accept_histogram = Some(acc.counter().histogram.iter().map(|&h| h.round() as u64).collect());
    report.accept_rate_unconditional = Some(acc.accept_rate_unconditional.clone());
    report.accept_rate_conditional = Some(acc.accept_rate_conditional.clone());
    report.steps = Some(k);
    report.verify_tokens = Some(k + 1);
    report.curve = tau_curve(&acc.accept_rate_unconditional)
        .into_iter()
        .enumerate()
        .map(|(i, tau)| CurvePoint { k: i + 1, verify_tokens: i + 2, tau })
        .collect();
    report.implied_cycle_ms = report.itl_ms.map(|itl| itl * acc.tau);
    report.t_d_ms = None;
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
        p.derived.push("t_v.table.1 (= t_d_ms: a verify pass over one token is a decode step)".into());
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
    costs.provenance.derived.push(format!(
        "cycle_ms.{k} (the inter-token time × τ of a run {}: {})",
        provenance.when, provenance.measured_where
    ));
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aerie_engine::meta::SpecMeta;

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
            answer: String::new(),
        }
    }

    #[test]
    fn speculative_summary_by_hand() {
        // Two requests, k = 2: histograms [1, 1, 2] and [0, 2, 0] → h = [1, 3, 2], 6 passes,
        // r_1 = 5/6, r_2 = 2/6, τ = τ_hist = 1 + 7/6. Completion 9 + 5 over 4 + 2 passes: 14/6
        // tokens per verify (SGLang's accept length), which is not τ.
        let rs = [spec(9, 4, vec![1, 1, 2], 0.16, 8), spec(5, 2, vec![0, 2, 0], 0.08, 4)];
        let rep = summarize(&rs, 2.0, &MeasureOptions::default());
        assert!(rep.speculative);
        assert_eq!(rep.accept_histogram, Some(vec![1, 3, 2]));
        assert!((rep.tau.unwrap() - (1.0 + 7.0 / 6.0)).abs() < 1e-12);
        assert!((rep.tokens_per_verify.unwrap() - 14.0 / 6.0).abs() < 1e-12);
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
    fn tau_is_accepted_drafts_per_verify_cycle_plus_one_without_a_histogram_too() {
        // The SGLang run: 256 tokens in 185 cycles that accepted 68 drafts: τ 1.3676
        // (aerie's decoder on the same prompts), not 256 / 185 = 1.3838.
        let mut r = spec(256, 185, vec![0, 0], 1.0, 255);
        r.meta.histogram = None;
        r.meta.accepted_drafts = Some(68);
        let rep = summarize(std::slice::from_ref(&r), 1.0, &MeasureOptions::default());
        assert!((rep.tau.unwrap() - (1.0 + 68.0 / 185.0)).abs() < 1e-12, "{:?}", rep.tau);
        assert!((rep.tokens_per_verify.unwrap() - 256.0 / 185.0).abs() < 1e-12);
        // Neither a histogram nor counts: the only figure left, named as such.
        r.meta.accepted_drafts = None;
        let rep = summarize(&[r], 1.0, &MeasureOptions::default());
        assert!((rep.tau.unwrap() - 256.0 / 185.0).abs() < 1e-12);
        assert!(rep.warnings.iter().any(|w| w.contains("first token counts too")), "{:?}", rep.warnings);
    }

    #[test]
    fn a_histogram_shorter_than_the_chain_is_padded_to_k_plus_one() {
        // SGLang 0.5.23, k = 3, no cycle accepted more than one draft: [20, 3], 9 drafts per 3
        // cycles proposed. The steps are 3, not 1, and r_2 = r_3 = 0.
        let mut r = spec(26, 23, vec![20, 3], 1.0, 25);
        r.meta.proposed_drafts = Some(69);
        let rep = summarize(&[r], 1.0, &MeasureOptions::default());
        assert_eq!((rep.steps, rep.verify_tokens), (Some(3), Some(4)));
        assert_eq!(rep.accept_histogram, Some(vec![20, 3, 0, 0]));
        assert_eq!(rep.accept_rate_unconditional.unwrap()[1..], [0.0, 0.0]);
        assert!((rep.tau.unwrap() - (1.0 + 3.0 / 23.0)).abs() < 1e-12);
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
            answer: String::new(),
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
