//! Acceptance over one run in a serving engine, from the engine's own numbers: the difference
//! of vLLM's counters read before and after the run, or SGLang's accepted-drafts histogram summed
//! over its responses ([`aerie_engine::counters`] reads them; this module says what they mean
//! in aerie's acceptance terms).

use aerie_engine::counters::SpecCounters;
use aerie_engine::meta::SpecMeta;
use serde::{Deserialize, Serialize};

use crate::accept::{AcceptCounter, conditional_from_unconditional};
use crate::profile::{AcceptanceProfile, StreamedAnswer, stream_buckets};
use crate::{Error, Result};

/// Acceptance over a run: the difference of the readings before and after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunAcceptance {
    /// Draft+verify cycles in the run.
    pub drafts: u64,
    /// Drafted tokens in the run.
    pub draft_tokens: u64,
    /// Accepted drafted tokens.
    pub accepted: u64,
    /// Accepted at each position.
    pub accepted_per_pos: Vec<u64>,
    /// τ = 1 + accepted / drafts (the bonus token included).
    pub tau: f64,
    /// r_i = P(at least i+1 drafts accepted) = accepted_per_pos[i] / drafts.
    pub accept_rate_unconditional: Vec<f64>,
    /// α_i = P(draft i accepted | drafts before it accepted).
    pub accept_rate_conditional: Vec<f64>,
}

fn count(x: f64, what: &str) -> Result<u64> {
    if x.is_finite() && x >= 0.0 && x.fract() == 0.0 {
        Ok(x as u64)
    } else {
        Err(Error::Incompatible(format!("the engine's {what} counter moved by {x}, not a count: was it restarted?")))
    }
}

impl RunAcceptance {
    /// `after − before`; `k` is the draft steps the engine was started with.
    pub fn between(before: &SpecCounters, after: &SpecCounters, k: usize) -> Result<Self> {
        let drafts = count(after.drafts - before.drafts, "drafts")?;
        if drafts == 0 {
            return Err(Error::Incompatible(
                "the engine counted no speculative cycles over the run: it is not speculating (check its log for the drafter load)".into(),
            ));
        }
        let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
        let per_pos = (0..k)
            .map(|i| count(at(&after.accepted_per_pos, i) - at(&before.accepted_per_pos, i), "accepted-per-position"))
            .collect::<Result<Vec<u64>>>()?;
        let accepted = count(after.accepted - before.accepted, "accepted tokens")?;
        // In a chain, draft i is accepted only with every draft before it.
        let chain = std::iter::once(&drafts).chain(&per_pos).collect::<Vec<_>>();
        if chain.windows(2).any(|w| w[1] > w[0]) {
            return Err(Error::Incompatible(format!(
                "the engine's per-position acceptance ({per_pos:?} of {drafts} cycles) rises with the position: not a chain of drafts (tree speculation?)"
            )));
        }
        if per_pos.iter().sum::<u64>() != accepted {
            return Err(Error::Incompatible(format!(
                "the engine's accepted tokens ({accepted}) differ from the sum over its {k} positions ({}): was it started with another num_speculative_tokens?",
                per_pos.iter().sum::<u64>()
            )));
        }
        let r: Vec<f64> = per_pos.iter().map(|&a| a as f64 / drafts as f64).collect();
        Ok(Self {
            drafts,
            draft_tokens: count(after.draft_tokens - before.draft_tokens, "draft tokens")?,
            accepted,
            tau: 1.0 + accepted as f64 / drafts as f64,
            accept_rate_conditional: conditional_from_unconditional(&r),
            accept_rate_unconditional: r,
            accepted_per_pos: per_pos,
        })
    }

    /// From SGLang's accepted-drafts histogram summed over a run's responses (h[a] = verify
    /// passes that accepted exactly a drafts, k = len − 1): the same numbers vLLM's counters give.
    pub fn from_histogram(hist: &[u64]) -> Result<Self> {
        let k = hist.len().saturating_sub(1);
        let drafts: u64 = hist.iter().sum();
        if k == 0 || drafts == 0 {
            return Err(Error::Incompatible(
                "the engine's responses carried no accepted-drafts histogram: it is not speculating (check its log for the drafter load)".into(),
            ));
        }
        let per_pos: Vec<u64> = (1..=k).map(|i| hist[i..].iter().sum()).collect();
        let zero = SpecCounters::default();
        let after = SpecCounters {
            drafts: drafts as f64,
            draft_tokens: (drafts * k as u64) as f64,
            accepted: per_pos.iter().sum::<u64>() as f64,
            accepted_per_pos: per_pos.iter().map(|&a| a as f64).collect(),
        };
        Self::between(&zero, &after, k)
    }

    /// The run's acceptance profile: rates and τ from these counts, τ by output position from
    /// the streamed `answers` where they map exactly onto the cycles ([`stream_buckets`]), else
    /// the reason they do not.
    pub fn profile(&self, answers: &[StreamedAnswer], source: &str, counted: &str) -> AcceptanceProfile {
        let k = self.accepted_per_pos.len();
        let h: Vec<f64> = self.counter().histogram;
        let p = AcceptanceProfile::from_histogram(&h, false, source, counted);
        match stream_buckets(answers, k, self.drafts, self.accepted).map(|b| p.clone().with_buckets(&b)) {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => p.without_buckets(e.to_string()),
            Err(why) => p.without_buckets(why),
        }
    }

    /// The same counts as aerie's own acceptance counter: h[a] = cycles that accepted exactly a
    /// drafts = a_{a-1} − a_a (with a_{-1} = D), so reports built from it read like `eval decode`'s.
    pub fn counter(&self) -> AcceptCounter {
        let k = self.accepted_per_pos.len();
        let mut c = AcceptCounter::new(k);
        let at_least = |i: usize| if i == 0 { self.drafts } else { self.accepted_per_pos[i - 1] };
        for a in 0..=k {
            let exactly = at_least(a) - if a < k { at_least(a + 1) } else { 0 };
            for _ in 0..exactly {
                c.add_length(a);
            }
        }
        c
    }
}

/// SGLang's accepted-drafts histograms of one run's responses (`metas`, in request order),
/// each checked against the same response's raw counts, then summed: h[a] over the responses,
/// padded to k + 1 entries (SGLang's list ends at the most drafts any of its cycles accepted).
/// `k` is the chain's draft steps when the caller started the engine; otherwise each response's
/// `spec_num_proposed_drafts / spec_verify_ct` (SGLang's verified tokens − 1) bounds it.
///
/// Refused, naming `server`, the response and the field: a histogram whose counts do not sum to
/// the response's `spec_verify_ct`, whose accepted drafts (Σ a·h[a]) differ from its
/// `spec_num_correct_drafts`, or with cycles that accepted more than k drafts (an accept length
/// above k + 1); a histogram without `spec_verify_ct`; and a speculative response (one with
/// `spec_verify_ct`) without a histogram where one is expected: when `required` (an engine aerie
/// started, whose version sends them) or when another response of the run carried one. Nothing is
/// skipped or cut. `Ok(None)` when no response carried a histogram and none was required (an
/// older SGLang: the caller falls back to the accepted-draft counts and says so).
pub fn sglang_histogram(
    metas: &[&SpecMeta],
    k: Option<usize>,
    server: &str,
    required: bool,
) -> Result<Option<Vec<u64>>> {
    const FIELD: &str = "spec_correct_drafts_histogram";
    let refuse = |i: usize, message: String| Error::Server {
        url: server.to_string(),
        status: None,
        message: format!("response {} of {}: {message}", i + 1, metas.len()),
    };
    let expected = required || metas.iter().any(|m| m.histogram.is_some());
    let mut sum: Option<Vec<u64>> = None;
    for (i, m) in metas.iter().enumerate() {
        let (verify, h) = match (m.verify_ct, m.histogram.as_deref()) {
            (None, None) => continue,
            (None, Some(h)) => {
                return Err(refuse(
                    i,
                    format!("carries an accepted-drafts histogram ({FIELD} {h:?}) but no spec_verify_ct"),
                ));
            }
            (Some(v), None) if expected => {
                return Err(refuse(
                    i,
                    format!(
                        "carries spec_verify_ct {v} but no accepted-drafts histogram ({FIELD} in meta_info or \
                         sglext.spec_tokens_details){}: its cycles cannot be counted by accepted drafts",
                        if required { "" } else { ", which other responses of the run carried" }
                    ),
                ));
            }
            (Some(_), None) => continue,
            (Some(v), Some(h)) => (v, h),
        };
        let cycles: u64 = h.iter().sum();
        if cycles != verify {
            return Err(refuse(i, format!("{FIELD} {h:?} counts {cycles} cycles where spec_verify_ct is {verify}")));
        }
        let accepted: u64 = h.iter().enumerate().map(|(a, &n)| a as u64 * n).sum();
        if let Some(raw) = m.accepted_drafts
            && raw != accepted
        {
            return Err(refuse(
                i,
                format!("{FIELD} {h:?} accepts {accepted} drafts where spec_num_correct_drafts is {raw}"),
            ));
        }
        let steps = k.or_else(|| m.proposed_drafts.map(|p| (p / verify) as usize));
        if let Some(k) = steps
            && let Some(a) = (k + 1..h.len()).find(|&a| h[a] > 0)
        {
            return Err(refuse(
                i,
                format!(
                    "{FIELD} {h:?} counts {} cycle(s) that accepted {a} drafts: a chain of k = {k} drafts accepts at most \
                     {k} (an accept length of at most k + 1 = {})",
                    h[a],
                    k + 1
                ),
            ));
        }
        // (entries past k + 1 are zeros, checked above)
        let h = &h[..steps.map_or(h.len(), |k| h.len().min(k + 1))];
        let acc = sum.get_or_insert_with(Vec::new);
        if acc.len() < h.len() {
            acc.resize(h.len(), 0);
        }
        acc.iter_mut().zip(h).for_each(|(a, b)| *a += b);
    }
    if let (Some(acc), Some(k)) = (sum.as_mut(), k)
        && acc.len() < k + 1
    {
        acc.resize(k + 1, 0);
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_acceptance_by_hand() {
        // The hand run of vllm.md: 792 drafts, 187 / 31 / 8 accepted → τ 1.2854,
        // r = 0.2361 / 0.0391 / 0.0101.
        // The counters of aerie_engine::counters' example /metrics page.
        let after = SpecCounters {
            drafts: 792.0,
            draft_tokens: 2376.0,
            accepted: 226.0,
            accepted_per_pos: vec![187.0, 31.0, 8.0],
        };
        let a = RunAcceptance::between(&SpecCounters::default(), &after, 3).unwrap();
        assert!((a.tau - 1.2854).abs() < 5e-5, "{}", a.tau);
        let r = &a.accept_rate_unconditional;
        assert!((r[0] - 0.2361).abs() < 5e-5 && (r[1] - 0.0391).abs() < 5e-5 && (r[2] - 0.0101).abs() < 5e-5);
        assert!((a.accept_rate_conditional[1] - 31.0 / 187.0).abs() < 1e-12);
        // The histogram view gives back the same τ and rates.
        let c = a.counter();
        let u = c.unconditional();
        assert!(u.iter().zip(r).all(|(x, y)| (x - y).abs() < 1e-12), "{u:?}");
        // Differences: a second reading minus the first.
        let mut later = after.clone();
        later.drafts += 10.0;
        later.accepted += 4.0;
        later.accepted_per_pos[0] += 3.0;
        later.accepted_per_pos[1] += 1.0;
        let d = RunAcceptance::between(&after, &later, 3).unwrap();
        assert_eq!((d.drafts, d.accepted, d.accepted_per_pos.clone()), (10, 4, vec![3, 1, 0]));
        assert!((d.tau - 1.4).abs() < 1e-12);
        assert!(RunAcceptance::between(&after, &after, 3).unwrap_err().to_string().contains("no speculative cycles"));
        // SGLang's histogram of the same cycles gives the same numbers: h = [605, 156, 23, 8].
        let h = RunAcceptance::from_histogram(&[605, 156, 23, 8]).unwrap();
        assert_eq!((h.drafts, h.accepted_per_pos.clone()), (792, vec![187, 31, 8]));
        assert!((h.tau - a.tau).abs() < 1e-12);
        assert!(RunAcceptance::from_histogram(&[5]).is_err());
        // SGLang histogram: 2 passes accepted 0, 3 accepted 1, 5 accepted 2 → τ = 1 + (8 + 5)/10.
        let h = RunAcceptance::from_histogram(&[2, 3, 5]).unwrap();
        assert_eq!(h.accept_rate_unconditional, vec![0.8, 0.5]);
        assert!((h.tau - 2.3).abs() < 1e-12);
        let mut bad = later.clone();
        bad.accepted += 1.0;
        assert!(RunAcceptance::between(&after, &bad, 3).unwrap_err().to_string().contains("sum over its 3 positions"));
    }

    /// Issue 44 §2.1, `eval serve`'s side: the engine aerie started (k known, SGLang 0.5.23 sends
    /// histograms) must send one per speculative answer; a histogram reaching past k + 1 is
    /// refused, not cut to k + 1 (it used to be zipped into k + 1 entries).
    #[test]
    fn an_engine_aerie_started_must_send_each_histogram_within_k_plus_one() {
        let meta = |v: u64, h: Option<Vec<u64>>, a: Option<u64>| SpecMeta {
            completion_tokens: Some(v + 5),
            verify_ct: Some(v),
            histogram: h,
            accepted_drafts: a,
            ..SpecMeta::default()
        };
        let (x, y) = (meta(4, Some(vec![2, 1, 1]), Some(3)), meta(3, Some(vec![2, 1]), Some(1)));
        let h = sglang_histogram(&[&x, &y], Some(3), "http://127.0.0.1:1", true).unwrap();
        assert_eq!(h, Some(vec![4, 2, 1, 0]), "summed and padded to k + 1");
        let alone = meta(3, None, Some(1));
        let e = sglang_histogram(&[&x, &alone], Some(3), "http://127.0.0.1:1", true).unwrap_err().to_string();
        assert!(
            e.contains("http://127.0.0.1:1")
                && e.contains("response 2 of 2")
                && e.contains("spec_correct_drafts_histogram"),
            "{e}"
        );
        // Without `required`, no histogram anywhere (an older SGLang) is no histogram: the caller's fallback.
        assert_eq!(sglang_histogram(&[&alone], None, "u", false).unwrap(), None);
        let long = meta(4, Some(vec![1, 1, 1, 0, 1]), Some(7));
        let e = sglang_histogram(&[&long], Some(3), "u", true).unwrap_err().to_string();
        assert!(e.contains("accepted 4 drafts") && e.contains("k = 3"), "{e}");
        let plain = SpecMeta { completion_tokens: Some(9), ..SpecMeta::default() };
        assert_eq!(sglang_histogram(&[&plain], Some(3), "u", true).unwrap(), None, "a plain answer has none");
        let stray = SpecMeta { histogram: Some(vec![1]), ..SpecMeta::default() };
        assert!(sglang_histogram(&[&stray], None, "u", false).unwrap_err().to_string().contains("no spec_verify_ct"));
    }
}
