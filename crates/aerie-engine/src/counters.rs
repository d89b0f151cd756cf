//! The speculative-decoding counters a serving engine exposes at `GET /metrics` (Prometheus
//! text format), read from a running vLLM server; what a run's difference of two readings says about
//! acceptance is `aerie_eval`'s (`engine_acceptance`).
//!
//! vLLM's counters are cumulative since the engine started (vllm.md, "EAGLE-3"):
//! `vllm:spec_decode_num_drafts_total` (draft+verify cycles), `..._num_draft_tokens_total`
//! (drafted tokens), `..._num_accepted_tokens_total`, and
//! `..._num_accepted_tokens_per_pos_total{position="i"}` (cycles whose draft i was accepted, which
//! in a chain means drafts 0..=i all were). So over a run, with D cycles and a_i accepted at
//! position i: τ = 1 + Σ a_i / D and the unconditional acceptance r_i = a_i / D. Every series is
//! summed over its other labels (`engine`, `model_name`): one engine serves one model here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::http::{agent, error_message, get};
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

/// The largest counter value read: 2^53, past which an f64 no longer holds every integer (and a
/// sum or a conversion to an integer would be wrong or overflow). SGLang's per-answer counts
/// (`meta::parse_meta`) are bounded by it too.
pub(crate) const MAX_COUNT: f64 = 9_007_199_254_740_992.0;
/// Draft positions at most in `accepted_per_pos` (drafts are at most 64 deep; a tree verifies at
/// most 1024 tokens).
const MAX_POSITIONS: usize = 1024;

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
        let ours = [DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS].contains(&s.name.as_str());
        if ours && !(s.value.is_finite() && (0.0..=MAX_COUNT).contains(&s.value)) {
            return Err(format!(
                "{} = {:?}: not a count (a counter lies between 0 and 2^53, where every integer is exact)",
                s.name, s.value
            ));
        }
        match s.name.as_str() {
            DRAFTS => c.drafts += s.value,
            DRAFT_TOKENS => c.draft_tokens += s.value,
            ACCEPTED => c.accepted += s.value,
            PER_POS => {
                let pos = s.label("position").ok_or_else(|| format!("{PER_POS} without a `position` label"))?;
                let pos: usize = pos.parse().map_err(|_| format!("{PER_POS}: position `{pos}` is not an index"))?;
                // Bounded before `accepted_per_pos` is sized by it (4e9 aborted on allocation).
                if pos >= MAX_POSITIONS {
                    return Err(format!(
                        "{PER_POS}: position {pos} is past the limit of {MAX_POSITIONS} draft positions"
                    ));
                }
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

/// vLLM's speculative counters now, read from `GET /metrics` (all zero on a server without
/// speculation; an error on a server that is not vLLM).
pub fn vllm_counters(base_url: &str) -> Result<SpecCounters> {
    let url = format!("{}/metrics", base_url.trim_end_matches('/'));
    let server = |message: String, status: Option<u16>| Error::Server { url: url.clone(), status, message };
    let (status, body) = get(&agent(Duration::from_secs(30)), &url).map_err(|e| server(e, None))?;
    if status != 200 {
        return Err(server(format!("HTTP {status}: {}", error_message(&body)), Some(status)));
    }
    let samples = parse_prometheus(&body).map_err(|m| server(format!("not Prometheus text: {m}"), Some(status)))?;
    if !is_vllm(&samples) {
        return Err(server("no vllm: metrics: is this a vLLM server?".into(), Some(status)));
    }
    vllm_spec_counters(&samples).map_err(|m| server(m, Some(status)))
}

/// Counters read after a run, and whether they settled.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// The last reading.
    pub counters: SpecCounters,
    /// `Some` when no two readings agreed within the wait: the run's acceptance may miss its last
    /// steps (a report carries this as a warning).
    pub warning: Option<String>,
}

/// How long [`settled_vllm_counters`] waits for two readings to agree, by default.
pub const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// vLLM's counters once two readings half a second apart agree: the engine records a step's
/// statistics as it streams that step's outputs, so the last step's may land just after the
/// last answer arrived. After `wait` without agreement, the last reading with a warning.
pub fn settled_vllm_counters(base_url: &str, wait: Duration) -> Result<Settled> {
    let start = Instant::now();
    let mut last = vllm_counters(base_url)?;
    while start.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(500));
        let now = vllm_counters(base_url)?;
        if now == last {
            return Ok(Settled { counters: now, warning: None });
        }
        last = now;
    }
    let warning = format!(
        "vLLM's speculative counters at {base_url}/metrics still moved {:.1} s after the last answer: \
         the acceptance read may miss the last steps (another client on the server?)",
        wait.as_secs_f64()
    );
    Ok(Settled { counters: last, warning: Some(warning) })
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
    fn a_counter_that_is_no_count_is_refused_before_use() {
        for (line, words) in [
            ("vllm:spec_decode_num_drafts_total 1e300", "= 1e300: not a count"),
            ("vllm:spec_decode_num_accepted_tokens_total -3", "not a count"),
            ("vllm:spec_decode_num_draft_tokens_total NaN", "not a count"),
            ("vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"4000000000\"} 1", "limit of 1024"),
        ] {
            let e = vllm_spec_counters(&parse_prometheus(line).unwrap()).unwrap_err();
            assert!(e.contains(words), "{line}: {e}");
        }
        // Other series are not counted, whatever their values.
        assert!(vllm_spec_counters(&parse_prometheus("vllm:gpu_cache_usage_perc 1e300").unwrap()).is_ok());
    }

    #[test]
    fn counters_that_never_settle_come_with_a_warning() {
        // A /metrics page whose draft counter grows with every reading.
        let url =
            crate::fake::serve(|n, _| (200, format!("vllm:spec_decode_num_drafts_total{{engine=\"0\"}} {n}.0\n")));
        let s = settled_vllm_counters(&url, Duration::from_millis(1200)).unwrap();
        assert!(s.counters.drafts >= 2.0, "{s:?}");
        assert!(s.warning.as_deref().is_some_and(|w| w.contains("still moved")), "{s:?}");
    }
}
