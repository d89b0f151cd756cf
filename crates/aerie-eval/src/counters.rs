//! The speculative-decoding counters a serving engine exposes at `GET /metrics` (Prometheus
//! text format), and what a run's difference of two readings says about acceptance.
//!
//! vLLM's counters are cumulative since the engine started (vllm.md, "EAGLE-3"):
//! `vllm:spec_decode_num_drafts_total` (draft+verify cycles), `..._num_draft_tokens_total`
//! (drafted tokens), `..._num_accepted_tokens_total`, and
//! `..._num_accepted_tokens_per_pos_total{position="i"}` (cycles whose draft i was accepted, which
//! in a chain means drafts 0..=i all were). So over a run, with D cycles and a_i accepted at
//! position i: τ = 1 + Σ a_i / D and the unconditional acceptance r_i = a_i / D. Every series is
//! summed over its other labels (`engine`, `model_name`): one engine serves one model here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::accept::{AcceptCounter, conditional_from_unconditional};
use crate::{Error, Result};

/// One sample line: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with its `_total` suffix for counters).
    pub name: String,
    /// Labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Parse the Prometheus text exposition format (comments and blank lines skipped). A line that
/// does not parse is an error naming it: a silently skipped counter would read as zero.
pub fn parse_prometheus(text: &str) -> std::result::Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).map_err(|m| format!("line {}: {m}: `{line}`", i + 1))?);
    }
    Ok(out)
}

fn parse_line(line: &str) -> std::result::Result<Sample, String> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace()).ok_or("no value")?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        while let Some(&(i, c)) = chars.peek() {
            if c == '}' {
                end = Some(i);
                break;
            }
            if c == ',' || c.is_whitespace() {
                chars.next();
                continue;
            }
            let eq = body[i..].find('=').ok_or("label without `=`")? + i;
            let key = body[i..eq].trim().to_string();
            if !body[eq + 1..].starts_with('"') {
                return Err("label value not quoted".into());
            }
            let mut value = String::new();
            let mut escaped = false;
            let mut close = None;
            for (j, ch) in body[eq + 2..].char_indices() {
                match (escaped, ch) {
                    (true, 'n') => {
                        value.push('\n');
                        escaped = false;
                    }
                    (true, ch) => {
                        value.push(ch);
                        escaped = false;
                    }
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        close = Some(eq + 2 + j);
                        break;
                    }
                    (false, ch) => value.push(ch),
                }
            }
            let close = close.ok_or("unterminated label value")?;
            labels.push((key, value));
            while chars.peek().is_some_and(|&(j, _)| j <= close) {
                chars.next();
            }
        }
        let end = end.ok_or("unterminated `{`")?;
        rest = &body[end + 1..];
    }
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().map_err(|e| format!("value `{v}`: {e}"))?,
    };
    Ok(Sample { name, labels, value })
}

/// The speculative counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecCounters {
    /// Draft+verify cycles.
    pub drafts: f64,
    /// Drafted tokens.
    pub draft_tokens: f64,
    /// Accepted drafted tokens.
    pub accepted: f64,
    /// Accepted at each draft position, 0-based.
    pub accepted_per_pos: Vec<f64>,
}

const DRAFTS: &str = "vllm:spec_decode_num_drafts_total";
const DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
const ACCEPTED: &str = "vllm:spec_decode_num_accepted_tokens_total";
const PER_POS: &str = "vllm:spec_decode_num_accepted_tokens_per_pos_total";

/// Whether a `/metrics` text comes from vLLM (its metrics carry the `vllm:` prefix).
pub fn is_vllm(samples: &[Sample]) -> bool {
    samples.iter().any(|s| s.name.starts_with("vllm:"))
}

/// vLLM's speculative counters, summed over their other labels. A server without speculation
/// exposes none of them: all zero.
pub fn vllm_spec_counters(samples: &[Sample]) -> std::result::Result<SpecCounters, String> {
    let mut c = SpecCounters::default();
    let mut per_pos: BTreeMap<usize, f64> = BTreeMap::new();
    for s in samples {
        match s.name.as_str() {
            DRAFTS => c.drafts += s.value,
            DRAFT_TOKENS => c.draft_tokens += s.value,
            ACCEPTED => c.accepted += s.value,
            PER_POS => {
                let pos = s.label("position").ok_or_else(|| format!("{PER_POS} without a `position` label"))?;
                let pos: usize = pos.parse().map_err(|_| format!("{PER_POS}: position `{pos}` is not an index"))?;
                *per_pos.entry(pos).or_default() += s.value;
            }
            _ => {}
        }
    }
    if let Some((&last, _)) = per_pos.last_key_value() {
        c.accepted_per_pos = (0..=last).map(|i| per_pos.get(&i).copied().unwrap_or(0.0)).collect();
    }
    Ok(c)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    // As vLLM 0.32 prints them (labels abridged from a real /metrics page).
    const PAGE: &str = r#"# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 792.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 2376.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 226.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 187.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 31.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="2"} 8.0
vllm:num_requests_running{engine="0",model_name="target"} 0.0
process_cpu_seconds_total 12.5
weird{a="x\"y,z}",b="2"} +Inf
"#;

    #[test]
    fn a_vllm_page_parses_into_its_counters() {
        let s = parse_prometheus(PAGE).unwrap();
        assert!(is_vllm(&s));
        let w = s.iter().find(|x| x.name == "weird").unwrap();
        assert_eq!(w.label("a"), Some("x\"y,z}"));
        assert_eq!(w.label("b"), Some("2"));
        assert!(w.value.is_infinite());
        let c = vllm_spec_counters(&s).unwrap();
        assert_eq!((c.drafts, c.draft_tokens, c.accepted), (792.0, 2376.0, 226.0));
        assert_eq!(c.accepted_per_pos, vec![187.0, 31.0, 8.0]);
        assert!(parse_prometheus("x{a=1} 2").unwrap_err().contains("line 1"));
        assert!(parse_prometheus("x 2 3\ny abc").unwrap_err().contains("line 2"));
    }

    #[test]
    fn run_acceptance_by_hand() {
        // The hand run of vllm.md: 792 drafts, 187 / 31 / 8 accepted → τ 1.2854,
        // r = 0.2361 / 0.0391 / 0.0101.
        let after = vllm_spec_counters(&parse_prometheus(PAGE).unwrap()).unwrap();
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
        let mut bad = later.clone();
        bad.accepted += 1.0;
        assert!(RunAcceptance::between(&after, &bad, 3).unwrap_err().to_string().contains("sum over its 3 positions"));
    }
}
