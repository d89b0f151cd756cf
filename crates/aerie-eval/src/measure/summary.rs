//! The reduction of one measurement's responses ([`summarize`]): SGLang's per-response
//! statistics checked against each other ([`sglang_histogram`]) and summed, τ by the one
//! convention, and the cycle time over the same responses' decode time and cycles
//! ([`timed_cycles`]); vLLM's counters over the run ([`apply_counters`]).

use aerie_engine::Engine;
use aerie_engine::meta::SpecMeta;

use super::{MeasureOptions, MeasureReport, RequestResult};
use crate::Result;
use crate::accept::{CurvePoint, tau_curve};
use crate::engine_acceptance::{RunAcceptance, sglang_histogram};
use crate::profile::{AcceptanceProfile, StreamedAnswer};
use crate::surface::Context;

/// What [`MeasureReport::counted`] says of SGLang's per-response statistics.
pub const COUNTED_PER_RESPONSE: &str = "each response's own meta_info (spec_verify_ct, accepted-drafts histogram, \
spec_num_correct_drafts) summed over this run's responses; never the server-lifetime avg_spec_accept_length";
/// What [`MeasureReport::counted`] says of vLLM's counters.
pub const COUNTED_BY_DIFFERENCE: &str = "vLLM's /metrics counters (cumulative since the server started) read \
before and after this run: their difference";

/// The decode time and the verify cycles of the same responses, set against each other for the
/// cycle time (issue 44 §2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedCycles {
    /// Σ decode time (first to last generated chunk) of the responses counted, s.
    pub decode_s: f64,
    /// Σ verify cycles of the same responses.
    pub cycles: u64,
    /// Responses counted.
    pub responses: usize,
    /// Responses left out of both: their decode time or cycles are missing, or their first chunk
    /// held more than the prefill's token (cycles that ran before the decode time started).
    pub left_out: usize,
}

impl TimedCycles {
    /// One cycle, ms; `None` when no cycle or no time was counted.
    pub fn cycle_ms(&self) -> Option<f64> {
        (self.cycles > 0 && self.decode_s > 0.0).then(|| 1000.0 * self.decode_s / self.cycles as f64)
    }
}

/// The decode time of `results` and the verify cycles of the same responses. With each
/// response's own count (`run_cycles` `None`: SGLang's `spec_verify_ct`) a response is counted
/// when it has both a decode time and a cycle count and its first chunk carried the prefill's
/// token alone (the decode time starts at the first chunk: cycles before it would count without
/// their time); others are left out of both. With one count for the whole run (`Some(D)`: vLLM's
/// counters, which cannot leave a response out) every response must qualify: `Err` says which
/// does not. Responses without tokens after their first carry no cycle and no time either way.
pub fn timed_cycles(results: &[&RequestResult], run_cycles: Option<u64>) -> std::result::Result<TimedCycles, String> {
    let mut t = TimedCycles { decode_s: 0.0, cycles: 0, responses: 0, left_out: 0 };
    let later_tokens = |r: &RequestResult| r.meta.completion_tokens.is_none_or(|n| n > 1);
    for (i, r) in results.iter().enumerate() {
        let early = r.first_chunk_tokens.is_some_and(|n| n > 1);
        match (run_cycles, r.decode_s, r.meta.verify_ct) {
            (None, Some(d), Some(v)) if !early => {
                t.decode_s += d;
                t.cycles += v;
                t.responses += 1;
            }
            (None, _, _) => t.left_out += usize::from(later_tokens(r) || r.meta.verify_ct.is_some()),
            (Some(_), Some(d), _) if !early => {
                t.decode_s += d;
                t.responses += 1;
            }
            (Some(_), _, _) if !later_tokens(r) && !early => {}
            (Some(_), d, _) => {
                return Err(format!(
                    "response {} of {} {}: the engine's one cycle count for the run cannot leave its cycles out",
                    i + 1,
                    results.len(),
                    if d.is_none() {
                        "has no decode time (not streamed)".to_string()
                    } else {
                        format!(
                            "carried {} tokens in its first chunk (cycles ran before its decode time started)",
                            r.first_chunk_tokens.unwrap_or(0)
                        )
                    }
                ));
            }
        }
    }
    if let Some(d) = run_cycles {
        t.cycles = d;
    }
    Ok(t)
}

/// Reduce per-request results (pure; `wall_s` is the run's wall time). SGLang's per-response
/// histograms are checked against the same responses' raw counts ([`sglang_histogram`]): an
/// inconsistent or missing one is an error naming the server and the field.
pub fn summarize(results: &[RequestResult], wall_s: f64, opts: &MeasureOptions) -> Result<MeasureReport> {
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
    let metas: Vec<&SpecMeta> = results.iter().map(|r| &r.meta).collect();
    let mut hist = sglang_histogram(&metas, None, &opts.server, false)?;
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
    let answers: Vec<StreamedAnswer> = results.iter().map(RequestResult::streamed).collect();
    let profile = acc.as_ref().map(|a| {
        conditions(
            a.profile(&answers, "measure", COUNTED_PER_RESPONSE),
            &opts.server,
            opts.concurrency,
            opts.max_new_tokens,
        )
    });
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
    let mut cycle_responses = None;
    let (implied_cycle_ms, t_d_ms) = if speculative {
        let cycle = if opts.stream {
            let all: Vec<&RequestResult> = results.iter().collect();
            let timed = timed_cycles(&all, None).expect("per-response cycles leave responses out, never fail");
            if timed.left_out > 0 {
                warnings.push(format!(
                    "cycle time over {} of {} responses: {} left out of both its time and its cycles (no decode time \
                     or spec_verify_ct, or cycles before the first chunk)",
                    timed.responses,
                    results.len(),
                    timed.left_out
                ));
            }
            cycle_responses = Some(timed.responses);
            timed.cycle_ms()
        } else {
            warnings.push("cycle from e2e / verify passes: includes prefill and queueing".into());
            (verify > 0).then(|| 1000.0 * e2e / verify as f64)
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
    Ok(MeasureReport {
        label: opts.label.clone(),
        server: opts.server.clone(),
        api: opts.api.unwrap_or(Engine::Sglang),
        endpoint: opts.endpoint,
        concurrency: opts.concurrency,
        context: Context::Short,
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
        accepted_drafts: speculative.then_some(accepted_counts).flatten(),
        counted: COUNTED_PER_RESPONSE.into(),
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
        cycle_responses,
        t_d_ms,
        profile,
        warnings,
    })
}

/// A measurement's conditions on its profile.
fn conditions(p: AcceptanceProfile, server: &str, concurrency: usize, max_new_tokens: usize) -> AcceptanceProfile {
    p.condition("server", server).condition("concurrency", concurrency).condition("max_new_tokens", max_new_tokens)
}

/// A vLLM run's acceptance read from the engine's counters (responses carry none): τ, the rates
/// by position, and the cycle: the run's decode time over the counters' cycles, when every
/// response's decode time is timed ([`timed_cycles`]; the counters cannot leave one out).
pub(super) fn apply_counters(report: &mut MeasureReport, acc: &RunAcceptance, results: &[RequestResult]) {
    let k = acc.accepted_per_pos.len();
    report.speculative = true;
    report.spec_verify_ct = acc.drafts;
    report.accepted_drafts = Some(acc.accepted);
    report.counted = COUNTED_BY_DIFFERENCE.into();
    report.tau = Some(acc.tau);
    report.tau_from_histogram = Some(acc.tau);
    report.accept_histogram = Some(acc.counter().histogram.iter().map(|&h| h.round() as u64).collect());
    let answers: Vec<StreamedAnswer> = results.iter().map(RequestResult::streamed).collect();
    let p = acc.profile(&answers, "measure", COUNTED_BY_DIFFERENCE);
    report.profile = Some(conditions(p, &report.server, report.concurrency, report.max_new_tokens));
    report.accept_rate_unconditional = Some(acc.accept_rate_unconditional.clone());
    report.accept_rate_conditional = Some(acc.accept_rate_conditional.clone());
    report.steps = Some(k);
    report.verify_tokens = Some(k + 1);
    report.curve = tau_curve(&acc.accept_rate_unconditional)
        .into_iter()
        .enumerate()
        .map(|(i, tau)| CurvePoint { k: i + 1, verify_tokens: i + 2, tau })
        .collect();
    report.implied_cycle_ms = None;
    report.cycle_responses = None;
    if report.stream {
        let all: Vec<&RequestResult> = results.iter().collect();
        match timed_cycles(&all, Some(acc.drafts)) {
            Ok(t) => {
                report.implied_cycle_ms = t.cycle_ms();
                report.cycle_responses = Some(t.responses);
            }
            Err(why) => report.warnings.push(format!("no cycle time: {why}")),
        }
    } else {
        report.implied_cycle_ms =
            (acc.drafts > 0).then(|| 1000.0 * results.iter().map(|r| r.e2e_s).sum::<f64>() / acc.drafts as f64);
        report.warnings.push("cycle from e2e / verify passes: includes prefill and queueing".into());
    }
    report.t_d_ms = None;
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Provenance;
    use crate::measure::costs_from_report;
    use serde_json::json;

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
            first_chunk_tokens: Some(1),
            chunk_tokens: Vec::new(),
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
        let rep = summarize(&rs, 2.0, &MeasureOptions::default()).unwrap();
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
        // ITL = 0.24 s / 12 tokens = 20 ms; cycle = the same responses' 0.24 s over their 6 cycles.
        assert!((rep.itl_ms.unwrap() - 20.0).abs() < 1e-9);
        assert!((rep.implied_cycle_ms.unwrap() - 40.0).abs() < 1e-9);
        assert_eq!(rep.cycle_responses, Some(2));
        assert_eq!(rep.accepted_drafts, None, "no raw count came back");
        assert_eq!(rep.counted, COUNTED_PER_RESPONSE);
        assert_eq!(rep.output_tokens_per_s, 7.0);
    }

    #[test]
    fn tau_is_accepted_drafts_per_verify_cycle_plus_one_without_a_histogram_too() {
        // The issue's SGLang run: 256 tokens in 185 cycles that accepted 68 drafts: τ 1.3676
        // (aerie's decoder on the same prompts), not 256 / 185 = 1.3838.
        let mut r = spec(256, 185, vec![0, 0], 1.0, 255);
        r.meta.histogram = None;
        r.meta.accepted_drafts = Some(68);
        let rep = summarize(std::slice::from_ref(&r), 1.0, &MeasureOptions::default()).unwrap();
        assert!((rep.tau.unwrap() - (1.0 + 68.0 / 185.0)).abs() < 1e-12, "{:?}", rep.tau);
        assert!((rep.tokens_per_verify.unwrap() - 256.0 / 185.0).abs() < 1e-12);
        // Neither a histogram nor counts: the only figure left, named as such.
        r.meta.accepted_drafts = None;
        let rep = summarize(&[r], 1.0, &MeasureOptions::default()).unwrap();
        assert!((rep.tau.unwrap() - 256.0 / 185.0).abs() < 1e-12);
        assert!(rep.warnings.iter().any(|w| w.contains("first token counts too")), "{:?}", rep.warnings);
    }

    #[test]
    fn a_histogram_shorter_than_the_chain_is_padded_to_k_plus_one() {
        // SGLang 0.5.23, k = 3, no cycle accepted more than one draft: [20, 3], 9 drafts per 3
        // cycles proposed. The steps are 3, not 1, and r_2 = r_3 = 0.
        let mut r = spec(26, 23, vec![20, 3], 1.0, 25);
        r.meta.proposed_drafts = Some(69);
        let rep = summarize(&[r], 1.0, &MeasureOptions::default()).unwrap();
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
            first_chunk_tokens: Some(1),
            chunk_tokens: Vec::new(),
            attempts: 1,
            answer: String::new(),
        };
        let rep = summarize(&[plain], 0.2, &MeasureOptions::default()).unwrap();
        assert!(!rep.speculative);
        assert!((rep.t_d_ms.unwrap() - 12.1).abs() < 1e-9);
        let prov =
            Provenance { measured_where: "mock".into(), when: "now".into(), by: "test".into(), ..Default::default() };
        let costs = costs_from_report(&rep, None, prov.clone()).unwrap();
        assert!(costs.validate().is_ok());
        assert_eq!(costs.verify_ms(1), Some(costs.t_d_ms));
        let srep = summarize(&[spec(9, 4, vec![1, 1, 2], 0.16, 8)], 1.0, &MeasureOptions::default()).unwrap();
        assert!(costs_from_report(&srep, None, prov.clone()).unwrap_err().to_string().contains("plain server first"));
        let both = costs_from_report(&srep, Some(costs), prov).unwrap();
        assert!(both.cycle_ms.contains_key("2"));
        assert!(both.validate().is_ok());
    }

    /// One SGLang 0.5.23 chat response as `aerie measure` reads it: the `sglext` chunk of a stream
    /// (the shape SGLang's tokenizer manager writes: `spec_num_proposed_drafts` = verify passes ×
    /// (num_draft_tokens − 1)) merged with its usage chunk, and its timings.
    fn recorded(details: serde_json::Value, completion: u64, decode_s: f64, first: u64) -> RequestResult {
        let mut meta = aerie_engine::meta::parse_meta(
            &serde_json::json!({"choices": [], "sglext": {"spec_tokens_details": details}}),
        );
        meta.update(aerie_engine::meta::parse_meta(
            &serde_json::json!({"choices": [], "usage": {"completion_tokens": completion}}),
        ));
        RequestResult {
            meta,
            e2e_s: decode_s + 0.1,
            ttft_s: Some(0.1),
            decode_s: Some(decode_s),
            decode_tokens: Some(completion - first),
            first_chunk_tokens: Some(first),
            chunk_tokens: Vec::new(),
            attempts: 1,
            answer: String::new(),
        }
    }

    /// Issue 44 §2.1: τ is SGLang's raw counts' (1 + Σ spec_num_correct_drafts / Σ
    /// spec_verify_ct), and a histogram that disagrees with them, is missing where the run's other
    /// responses carry one, or counts a cycle accepting more than k drafts is refused, naming the
    /// server and the field (it used to be summed as is, skipped, or cut).
    #[test]
    fn sglang_histograms_are_checked_against_the_raw_counts() {
        let opts = MeasureOptions { server: "http://node:30000".into(), ..MeasureOptions::default() };
        // k = 2 (3 draft tokens): 21 cycles accepting 5·1 + 2·2 = 9 drafts; 11 cycles accepting 4.
        let a = json!({"spec_accept_length": 1.5, "spec_num_correct_drafts": 9, "spec_num_proposed_drafts": 42,
            "spec_verify_ct": 21, "spec_correct_drafts_histogram": [14, 5, 2]});
        let b = json!({"spec_accept_length": 1.4545, "spec_num_correct_drafts": 4, "spec_num_proposed_drafts": 22,
            "spec_verify_ct": 11, "spec_correct_drafts_histogram": [7, 4]});
        let ok = [recorded(a.clone(), 31, 2.1, 1), recorded(b.clone(), 16, 1.1, 1)];
        let rep = summarize(&ok, 4.0, &opts).unwrap();
        assert_eq!((rep.spec_verify_ct, rep.accepted_drafts), (32, Some(13)));
        assert_eq!(rep.accept_histogram, Some(vec![21, 9, 2]));
        let raw = 1.0 + 13.0 / 32.0;
        assert!((rep.tau.unwrap() - raw).abs() < 1e-12, "{:?} vs the raw counts' {raw}", rep.tau);
        // The cycle: the same two responses' 3.2 s over their 32 cycles.
        assert!((rep.implied_cycle_ms.unwrap() - 100.0).abs() < 1e-9);

        let refused = |bodies: &[RequestResult]| summarize(bodies, 4.0, &opts).unwrap_err().to_string();
        // A response without the histogram the others carry.
        let mut no_hist = b.clone();
        no_hist.as_object_mut().unwrap().remove("spec_correct_drafts_histogram");
        let e = refused(&[recorded(a.clone(), 31, 2.1, 1), recorded(no_hist, 16, 1.1, 1)]);
        assert!(e.contains("http://node:30000") && e.contains("response 2 of 2"), "{e}");
        assert!(e.contains("spec_correct_drafts_histogram") && e.contains("spec_verify_ct 11"), "{e}");
        // An entry past k + 1: a cycle that accepted 3 of k = 2 drafts.
        let mut long = a.clone();
        long["spec_correct_drafts_histogram"] = json!([14, 5, 1, 1]);
        long["spec_num_correct_drafts"] = json!(10);
        let e = refused(&[recorded(long, 31, 2.1, 1)]);
        assert!(e.contains("http://node:30000") && e.contains("spec_correct_drafts_histogram"), "{e}");
        assert!(e.contains("accepted 3 drafts") && e.contains("k = 2"), "{e}");
        // Counts that disagree with spec_verify_ct or spec_num_correct_drafts.
        let mut cycles = a.clone();
        cycles["spec_verify_ct"] = json!(22);
        let e = refused(&[recorded(cycles, 31, 2.1, 1)]);
        assert!(e.contains("counts 21 cycles where spec_verify_ct is 22"), "{e}");
        let mut drafts = a.clone();
        drafts["spec_num_correct_drafts"] = json!(8);
        let e = refused(&[recorded(drafts, 31, 2.1, 1)]);
        assert!(e.contains("accepts 9 drafts where spec_num_correct_drafts is 8"), "{e}");
        // Trailing zeros past k + 1 count nothing and pass.
        let mut zeros = a.clone();
        zeros["spec_correct_drafts_histogram"] = json!([14, 5, 2, 0]);
        assert_eq!(
            summarize(&[recorded(zeros, 31, 2.1, 1)], 1.0, &opts).unwrap().accept_histogram,
            Some(vec![14, 5, 2])
        );
    }

    /// Issue 44 §2.2: the cycle's time and its cycles count the same responses. A response whose
    /// first chunk already held a cycle's tokens (its decode time starts after them) or that carried
    /// no cycle count is left out of both; with vLLM's one count for the run none can be, so such a
    /// run gives no cycle time rather than a wrong one.
    #[test]
    fn the_cycle_sets_each_responses_time_against_its_own_cycles() {
        let d = |v: u64, h: serde_json::Value, a: u64| {
            json!({"spec_verify_ct": v, "spec_correct_drafts_histogram": h, "spec_num_correct_drafts": a,
                "spec_num_proposed_drafts": 2 * v})
        };
        let clean = recorded(d(10, json!([6, 2, 2]), 6), 17, 1.0, 1);
        // 3 tokens in the first chunk: one cycle ran before the decode time started.
        let early = recorded(d(10, json!([6, 2, 2]), 6), 17, 0.9, 3);
        // Time but no cycle count (a response the server sent without its statistics).
        let mut bare = recorded(d(10, json!([6, 2, 2]), 6), 17, 5.0, 1);
        bare.meta = SpecMeta { completion_tokens: Some(17), ..SpecMeta::default() };
        let rep = summarize(&[clean.clone(), early.clone(), bare.clone()], 9.0, &MeasureOptions::default()).unwrap();
        // 1.0 s over 10 cycles: not (1.0 + 0.9 + 5.0) s over 20 cycles, nor over 30.
        assert!((rep.implied_cycle_ms.unwrap() - 100.0).abs() < 1e-9, "{:?}", rep.implied_cycle_ms);
        assert_eq!(rep.cycle_responses, Some(1));
        assert!(rep.warnings.iter().any(|w| w.contains("over 1 of 3 responses: 2 left out")), "{:?}", rep.warnings);
        // One count for the run (vLLM): every response counts, or there is no cycle time.
        let t = timed_cycles(&[&clean, &clean], Some(20)).unwrap();
        assert_eq!((t.responses, t.cycles, t.cycle_ms()), (2, 20, Some(100.0)));
        let e = timed_cycles(&[&clean, &early], Some(20)).unwrap_err();
        assert!(e.contains("response 2 of 2") && e.contains("3 tokens in its first chunk"), "{e}");
        let mut one_token = bare.clone();
        one_token.meta.completion_tokens = Some(1);
        one_token.decode_s = None;
        assert_eq!(
            timed_cycles(&[&clean, &one_token], Some(10)).unwrap().responses,
            1,
            "a one-token answer has no cycle"
        );
    }

    /// SGLang 0.5.23's `choices[0].meta_info` for the four MT-Bench first turns of
    /// `serve_sglang.rs` (SmolLM2-135M and the fixture drafter, k = 2, 32 new tokens, f32; recorded
    /// 2026-12-05 from the test's own unstreamed requests; ids, timings and cache details left out).
    const RECORDED_SGLANG_META: [&str; 4] = [
        r#"{"finish_reason": {"type": "length", "length": 32}, "prompt_tokens": 53, "completion_tokens": 32, "spec_accept_rate": 0.11538461538461539, "spec_accept_length": 1.2307692307692308, "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 52, "spec_verify_ct": 26, "spec_correct_drafts_histogram": [21, 4, 1]}"#,
        r#"{"finish_reason": {"type": "length", "length": 32}, "prompt_tokens": 78, "completion_tokens": 32, "spec_accept_rate": 0.17391304347826086, "spec_accept_length": 1.391304347826087, "spec_num_correct_drafts": 8, "spec_num_proposed_drafts": 46, "spec_verify_ct": 23, "spec_correct_drafts_histogram": [16, 6, 1]}"#,
        r#"{"finish_reason": {"type": "length", "length": 32}, "prompt_tokens": 87, "completion_tokens": 32, "spec_accept_rate": 0.14, "spec_accept_length": 1.28, "spec_num_correct_drafts": 7, "spec_num_proposed_drafts": 50, "spec_verify_ct": 25, "spec_correct_drafts_histogram": [19, 5, 1]}"#,
        r#"{"finish_reason": {"type": "length", "length": 32}, "prompt_tokens": 70, "completion_tokens": 32, "spec_accept_rate": 0.275, "spec_accept_length": 1.6, "spec_num_correct_drafts": 11, "spec_num_proposed_drafts": 40, "spec_verify_ct": 20, "spec_correct_drafts_histogram": [11, 7, 2]}"#,
    ];

    /// Issue 44 §2.1 on SGLang's own bodies: τ is 1 + Σ spec_num_correct_drafts / Σ
    /// spec_verify_ct = 1 + 32 / 94 (eval serve's τ 1.3404 on the same prompts), the histogram
    /// counts the same cycles, and SGLang's accept length (completion / cycles) is not τ.
    #[test]
    fn recorded_sglang_bodies_give_tau_from_their_raw_counts() {
        let results: Vec<RequestResult> = RECORDED_SGLANG_META
            .iter()
            .map(|m| {
                let meta: serde_json::Value = serde_json::from_str(m).unwrap();
                let body = json!({"choices": [{"message": {"content": "..."}, "meta_info": meta}],
                    "usage": {"completion_tokens": meta["completion_tokens"]}});
                RequestResult {
                    meta: aerie_engine::meta::parse_meta(&body),
                    e2e_s: 3.0,
                    attempts: 1,
                    ..RequestResult::default()
                }
            })
            .collect();
        let opts = MeasureOptions { stream: false, ..MeasureOptions::default() };
        let rep = summarize(&results, 12.0, &opts).unwrap();
        assert_eq!((rep.spec_verify_ct, rep.accepted_drafts, rep.completion_tokens), (94, Some(32), 128));
        assert_eq!(rep.accept_histogram, Some(vec![67, 22, 5]));
        assert_eq!((rep.steps, rep.verify_tokens), (Some(2), Some(3)));
        assert!((rep.tau.unwrap() - (1.0 + 32.0 / 94.0)).abs() < 1e-12, "{:?}", rep.tau);
        assert!((rep.tau.unwrap() - 1.3404).abs() < 1e-4);
        assert!((rep.tokens_per_verify.unwrap() - 128.0 / 94.0).abs() < 1e-12);
        // One body altered past k + 1 (a cycle accepting 3 of 2 drafts) is refused, not cut.
        let mut bad = results.clone();
        bad[1].meta.histogram = Some(vec![16, 5, 1, 1]);
        bad[1].meta.accepted_drafts = Some(10);
        let e = summarize(&bad, 12.0, &opts).unwrap_err().to_string();
        assert!(e.contains("response 2 of 4") && e.contains("accepted 3 drafts"), "{e}");
    }
}
