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
mod summary;
mod sweep;

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use client::{RequestResult, agent, send};
pub use pool::run_pool;
pub use summary::{COUNTED_BY_DIFFERENCE, COUNTED_PER_RESPONSE, TimedCycles, summarize, timed_cycles};
pub use sweep::costs_from_sweep;

use summary::apply_counters;

use aerie_engine::Engine;
use aerie_engine::counters::{SETTLE_WAIT, settled_vllm_counters, vllm_counters};
use aerie_engine::detect::detect;
use aerie_engine::meta::{Endpoint, Request};

use crate::accept::CurvePoint;
use crate::cost::{Costs, Provenance, VerifyCost};
use crate::engine_acceptance::RunAcceptance;
use crate::surface::Context;
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
    /// The prompt length measured at (`--context`; short before surfaces).
    #[serde(default)]
    pub context: Context,
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
    /// Σ spec_verify_ct (vLLM: its cycle counter over the run).
    pub spec_verify_ct: u64,
    /// Σ accepted drafts as the server counts them, raw: SGLang's `spec_num_correct_drafts` of
    /// each response (checked equal to its histogram's), vLLM's accepted-tokens counter over the
    /// run. With `spec_verify_ct`, τ = 1 + this / spec_verify_ct.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_drafts: Option<u64>,
    /// Where the acceptance figures come from, and that they are this run's alone: each
    /// response's own `meta_info` (SGLang; never its server-lifetime `avg_spec_accept_length`), or
    /// vLLM's cumulative counters read before and after the run (their difference).
    #[serde(default)]
    pub counted: String,
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
    /// One draft+verify cycle, ms, measured on a stream: Σ decode time / Σ verify cycles of the
    /// same responses ([`timed_cycles`]: a response whose time or cycles are missing, or whose
    /// first chunk already held cycles' tokens, is left out of both); without a stream e2e /
    /// verify (prefill included, warned).
    pub implied_cycle_ms: Option<f64>,
    /// Responses whose decode time and cycles the cycle sets against each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle_responses: Option<usize>,
    /// Plain decode step (no speculation): the ITL, or e2e / tokens without a stream.
    pub t_d_ms: Option<f64>,
    /// The acceptance profile ([`crate::profile`]) of a speculative run: the rates above, and τ by
    /// output position from the stream's chunks where they are exactly the engine's cycles (the
    /// reason where not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::profile::AcceptanceProfile>,
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
    let mut report = summarize(&results, start.elapsed().as_secs_f64(), opts)?;
    report.api = api;
    report.profile = report.profile.take().map(|p| p.condition("engine", api));
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
            apply_counters(&mut report, &acceptance, &results);
            report.profile = report.profile.take().map(|p| p.condition("engine", api));
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
    costs.provenance.measured.push(format!(
        "cycle_ms.{k} (the decode time over the server's verify cycles, of the same responses, of a run {}: {})",
        provenance.when, provenance.measured_where
    ));
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aerie_engine::meta::SpecMeta;

    /// A vLLM server for [`measure`]: its counters cumulative over its life (1000 cycles before
    /// the test), each chat answer 7 tokens in 4 cycles accepting 2 drafts (k = 2), streamed with
    /// the cumulative usage in every chunk.
    fn fake_vllm() -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut drafts, mut accepted) = (1000u64, 500u64);
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { break };
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                loop {
                    let n = s.read(&mut tmp).unwrap_or(0);
                    buf.extend_from_slice(&tmp[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some(end) = text.find("\r\n\r\n") else { if n == 0 { break } else { continue } };
                    let len = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if n == 0 || buf.len() >= end + 4 + len {
                        break;
                    }
                }
                let text = String::from_utf8_lossy(&buf).to_string();
                let body = if text.split_whitespace().nth(1) == Some("/metrics") {
                    format!(
                        "vllm:spec_decode_num_drafts_total{{engine=\"0\"}} {drafts}.0\n\
                         vllm:spec_decode_num_draft_tokens_total{{engine=\"0\"}} {}.0\n\
                         vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\"}} {accepted}.0\n\
                         vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",position=\"0\"}} {accepted}.0\n\
                         vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",position=\"1\"}} 0.0\n",
                        2 * drafts
                    )
                } else {
                    drafts += 4;
                    accepted += 2;
                    let mut sse = String::from(
                        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":{\"completion_tokens\":0}}\n\n",
                    );
                    for n in [1, 3, 5, 6, 7] {
                        sse += &format!(
                            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{n}\"}}}}],\"usage\":{{\"completion_tokens\":{n}}}}}\n\n"
                        );
                    }
                    sse + "data: {\"choices\":[],\"usage\":{\"completion_tokens\":7}}\n\ndata: [DONE]\n\n"
                };
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                let _ = s.write_all(head.as_bytes());
                let _ = s.write_all(body.as_bytes());
            }
        });
        url
    }

    /// Issue 44 §2.5: counters scoped to each run. vLLM's counters accumulate over the server's
    /// life (1000 cycles before the first run here): two consecutive runs against the same server
    /// each report their own difference (8 cycles, 4 accepted drafts, τ 1.5), not the server's
    /// totals, and say so; SGLang's figures are each response's own (`counted`).
    #[test]
    fn consecutive_runs_against_one_server_each_count_their_own() {
        let url = fake_vllm();
        let opts = MeasureOptions {
            server: url.clone(),
            api: Some(Engine::Vllm),
            max_new_tokens: 7,
            timeout: Duration::from_secs(30),
            ..MeasureOptions::default()
        };
        let prompts = [Request::Text("a".into()), Request::Text("b".into())];
        for run in 0..2 {
            let rep = measure(&prompts, &opts, &|_, _| {}).unwrap();
            assert_eq!((rep.spec_verify_ct, rep.accepted_drafts), (8, Some(4)), "run {run}: {rep:?}");
            assert!((rep.tau.unwrap() - 1.5).abs() < 1e-12, "run {run}: {:?}", rep.tau);
            assert_eq!(rep.counted, COUNTED_BY_DIFFERENCE);
            assert_eq!((rep.completion_tokens, rep.cycle_responses), (14, Some(2)), "run {run}");
        }
        let one = RequestResult {
            meta: SpecMeta {
                completion_tokens: Some(9),
                verify_ct: Some(4),
                histogram: Some(vec![1, 1, 2]),
                ..SpecMeta::default()
            },
            decode_s: Some(0.16),
            ..RequestResult::default()
        };
        let sglang = summarize(&[one], 1.0, &MeasureOptions::default()).unwrap();
        assert!(
            sglang.counted.contains("each response's own") && sglang.counted.contains("never"),
            "{}",
            sglang.counted
        );
    }
}
