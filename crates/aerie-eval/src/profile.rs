//! The acceptance profile every τ report carries (issue 46 §3): per-position acceptance,
//! marginal and conditional, τ, the cycles' accept-length histogram, and τ by where in the answer
//! each cycle started (output-position buckets 0-256, 256-1k, 1k-4k, 4k+ tokens).
//!
//! Why by output position: published results show EAGLE-3 acceptance falling on long thinking
//! outputs (Kimi K2.5's traffic), which one τ over a whole run hides. Why one type: `eval accept`
//! (the cycle walk), `eval decode`, `eval serve`, `measure` and `compare` all build theirs here,
//! from counts, so the same cycles give the same numbers whichever command counted them.
//!
//! The fields that overlap NVIDIA Model Optimizer's `speculation_profile.json` (specdec_bench,
//! `ar_validate`) take its names and conventions, so tools that read those profiles read aerie's:
//! `marginal_accept_rates[i]` = P(the first i+1 drafts all accepted), `conditional_accept_rates[i]`
//! = P(draft i+1 accepted | the first i accepted), `mean_accept_length` = τ per verify cycle (the
//! bonus token included) = 1 + Σ marginal, and `acceptance_length_histogram` keyed by accept
//! length (accepted drafts + 1, so "1" is a cycle that accepted no draft). The buckets, the
//! counts and where they come from are aerie's own fields.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The output-position buckets `[from, to)` in answer tokens already emitted when a cycle starts
/// (`None`: no upper end).
pub const OUTPUT_POSITION_BUCKETS: [(u64, Option<u64>); 4] =
    [(0, Some(256)), (256, Some(1024)), (1024, Some(4096)), (4096, None)];

/// The file name a profile is written under beside a report (`compare`'s per-drafter files add
/// the drafter's name).
pub const PROFILE_FILE: &str = "speculation_profile.json";

/// Which bucket a cycle that starts after `position` answer tokens falls in.
pub fn bucket_of(position: u64) -> usize {
    OUTPUT_POSITION_BUCKETS.iter().rposition(|&(from, _)| position >= from).unwrap_or(0)
}

/// Cycles and accepted drafts by output-position bucket (mergeable counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketCounts {
    /// Cycles that started in each bucket.
    pub cycles: [u64; 4],
    /// Drafts those cycles accepted.
    pub accepted: [u64; 4],
}

impl BucketCounts {
    /// Count one cycle that started after `position` answer tokens and accepted `accepted` drafts.
    pub fn add(&mut self, position: u64, accepted: u64) {
        let b = bucket_of(position);
        self.cycles[b] += 1;
        self.accepted[b] += accepted;
    }

    /// Add another count.
    pub fn merge(&mut self, other: &BucketCounts) {
        for b in 0..4 {
            self.cycles[b] += other.cycles[b];
            self.accepted[b] += other.accepted[b];
        }
    }

    /// Cycles over every bucket.
    pub fn total_cycles(&self) -> u64 {
        self.cycles.iter().sum()
    }

    /// Accepted drafts over every bucket.
    pub fn total_accepted(&self) -> u64 {
        self.accepted.iter().sum()
    }
}

/// τ over the cycles that started in one output-position bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionBucket {
    /// `0-256`, `256-1k`, `1k-4k` or `4k+`.
    pub bucket: String,
    /// First output position of the bucket (answer tokens emitted before the cycle).
    pub from_tokens: u64,
    /// End of the bucket, exclusive (`None`: open).
    pub to_tokens: Option<u64>,
    /// Verify cycles that started in it.
    pub cycles: u64,
    /// Drafts they accepted.
    pub accepted_drafts: u64,
    /// τ there: 1 + accepted / cycles (`None` without a cycle).
    pub mean_accept_length: Option<f64>,
}

fn bucket_name(b: usize) -> &'static str {
    ["0-256", "256-1k", "1k-4k", "4k+"][b]
}

/// Conditional rates `α_i = r_i / r_{i-1}` (r_0 = 1); 0 once nothing survives.
pub fn conditional_from_unconditional(r: &[f64]) -> Vec<f64> {
    let mut prev = 1.0;
    r.iter()
        .map(|&ri| {
            let a = if prev > 0.0 { ri / prev } else { 0.0 };
            prev = ri;
            a
        })
        .collect()
}

/// τ = 1 + Σ_i r_i from unconditional rates.
pub fn tau_from_unconditional(r: &[f64]) -> f64 {
    1.0 + r.iter().sum::<f64>()
}

/// The acceptance profile of one drafter at one draft depth, as every τ report gives it and as
/// `speculation_profile.json` is written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcceptanceProfile {
    /// Speculation method (`eagle3`).
    pub method: String,
    /// Measured, not a placeholder.
    pub measured: bool,
    /// Draft steps k per cycle (a tree's depth).
    pub num_speculative_tokens: usize,
    /// `longest_prefix` (a chain) or `tree` (the longest accepted path of a draft tree).
    pub verification_method: String,
    /// `chain_analytic` (a chain: the first k' < k drafts are a k'-chain, so τ(k') = 1 + Σ_{i≤k'}
    /// marginal) or `measured_per_k` (a tree: measured at this shape only).
    pub accept_length_model: String,
    /// P(draft i+1 accepted | the first i accepted), i = 0..k.
    pub conditional_accept_rates: Vec<f64>,
    /// P(the first i+1 drafts all accepted), i = 0..k.
    pub marginal_accept_rates: Vec<f64>,
    /// τ: tokens per verify cycle, the bonus token included (1 + Σ marginal).
    pub mean_accept_length: f64,
    /// Cycles by accept length (accepted drafts + 1), "1" ..= "k+1" (expected counts where the
    /// verify rule gives probabilities).
    pub acceptance_length_histogram: BTreeMap<String, f64>,
    /// Verify cycles counted (positions, where every position is counted as a cycle).
    pub cycles: f64,
    /// Drafts accepted over them.
    pub accepted_drafts: f64,
    /// τ by output-position bucket: where in the answer each cycle started (answer tokens already
    /// emitted, the prefill's first token included). Empty where the source cannot tell.
    pub output_position_buckets: Vec<PositionBucket>,
    /// Why the buckets are not given, where they are not (never estimated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_position_buckets_unavailable: Option<String>,
    /// Which aerie command measured it, on what, and where its counts come from.
    pub measurement_conditions: BTreeMap<String, String>,
}

impl AcceptanceProfile {
    /// From the cycles' histogram `h[a]` = cycles that accepted exactly a drafts, a = 0..=k
    /// (counts, or expected counts). `source` names the command, `counted` where the counts come
    /// from. Buckets are added with [`Self::with_buckets`] or refused with
    /// [`Self::without_buckets`]; until then they read as unavailable.
    pub fn from_histogram(histogram: &[f64], tree: bool, source: &str, counted: &str) -> Self {
        let k = histogram.len().saturating_sub(1);
        let cycles: f64 = histogram.iter().sum();
        let marginal: Vec<f64> =
            (1..=k).map(|i| if cycles > 0.0 { histogram[i..].iter().sum::<f64>() / cycles } else { 0.0 }).collect();
        let accepted: f64 = histogram.iter().enumerate().map(|(a, h)| a as f64 * h).sum();
        let conditional = conditional_from_unconditional(&marginal);
        let conditions =
            [("source", source), ("counted", counted)].into_iter().map(|(a, b)| (a.to_string(), b.to_string()));
        Self {
            method: "eagle3".into(),
            measured: true,
            num_speculative_tokens: k,
            verification_method: (if tree { "tree" } else { "longest_prefix" }).into(),
            accept_length_model: (if tree { "measured_per_k" } else { "chain_analytic" }).into(),
            conditional_accept_rates: conditional,
            mean_accept_length: tau_from_unconditional(&marginal),
            marginal_accept_rates: marginal,
            acceptance_length_histogram: histogram.iter().enumerate().map(|(a, &h)| ((a + 1).to_string(), h)).collect(),
            cycles,
            accepted_drafts: accepted,
            output_position_buckets: Vec::new(),
            output_position_buckets_unavailable: Some("not counted".into()),
            measurement_conditions: conditions.collect(),
        }
    }

    /// From integer cycle counts `h[a]`.
    pub fn from_counts(histogram: &[u64], tree: bool, source: &str, counted: &str) -> Self {
        let h: Vec<f64> = histogram.iter().map(|&c| c as f64).collect();
        Self::from_histogram(&h, tree, source, counted)
    }

    /// Attach τ by bucket. The buckets must partition the profile's cycles and accepted drafts
    /// (an error names both counts otherwise: they would describe other cycles).
    pub fn with_buckets(mut self, b: &BucketCounts) -> Result<Self> {
        let (cycles, accepted) = (b.total_cycles(), b.total_accepted());
        if cycles as f64 != self.cycles || accepted as f64 != self.accepted_drafts {
            return Err(Error::Report(format!(
                "the output-position buckets count {cycles} cycles and {accepted} accepted drafts where the profile counts {} and {}: they are not the same cycles",
                self.cycles, self.accepted_drafts
            )));
        }
        self.output_position_buckets = (0..4)
            .map(|i| {
                let (from, to) = OUTPUT_POSITION_BUCKETS[i];
                PositionBucket {
                    bucket: bucket_name(i).into(),
                    from_tokens: from,
                    to_tokens: to,
                    cycles: b.cycles[i],
                    accepted_drafts: b.accepted[i],
                    mean_accept_length: (b.cycles[i] > 0).then(|| 1.0 + b.accepted[i] as f64 / b.cycles[i] as f64),
                }
            })
            .collect();
        self.output_position_buckets_unavailable = None;
        Ok(self)
    }

    /// Say why there are no buckets.
    pub fn without_buckets(mut self, why: impl Into<String>) -> Self {
        self.output_position_buckets.clear();
        self.output_position_buckets_unavailable = Some(why.into());
        self
    }

    /// Record one more measurement condition (engine, prompts, budget, drafter ...).
    pub fn condition(mut self, key: &str, value: impl ToString) -> Self {
        self.measurement_conditions.insert(key.to_string(), value.to_string());
        self
    }

    /// τ of one bucket by its name (`0-256` ...), where measured and not empty.
    pub fn bucket_tau(&self, bucket: &str) -> Option<f64> {
        self.output_position_buckets.iter().find(|b| b.bucket == bucket).and_then(|b| b.mean_accept_length)
    }

    /// One line for the human reports: τ per bucket, or why there is none.
    pub fn bucket_line(&self) -> String {
        match &self.output_position_buckets_unavailable {
            Some(why) => format!("unavailable ({why})"),
            None => self
                .output_position_buckets
                .iter()
                .map(|b| match b.mean_accept_length {
                    Some(t) => format!("{} τ {t:.3} ({} cycles)", b.bucket, b.cycles),
                    None => format!("{} -", b.bucket),
                })
                .collect::<Vec<_>>()
                .join("  "),
        }
    }

    /// Write it as `speculation_profile.json` at `path`, atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(|e| Error::Report(e.to_string()))?;
        aerie_data::atomic::write_bytes(path, format!("{json}\n").as_bytes())
            .map_err(|e| Error::Report(format!("writing the acceptance profile {}: {e}", path.display())))
    }
}

/// One streamed answer of a speculative engine, as the buckets need it: the server's cumulative
/// token count at each chunk that carried new tokens, and the answer's own cycle and
/// accepted-draft counts where the engine sends them (SGLang's `meta_info`; vLLM: none).
#[derive(Debug, Clone, Copy)]
pub struct StreamedAnswer<'a> {
    /// Cumulative completion tokens at each chunk.
    pub chunk_tokens: &'a [u64],
    /// The answer's verify cycles (`spec_verify_ct`).
    pub verify_ct: Option<u64>,
    /// The answer's accepted drafts (`spec_num_correct_drafts`).
    pub accepted_drafts: Option<u64>,
}

/// τ by output position from a speculative engine's stream: exact, or the reason it cannot be.
///
/// A speculative engine streams each cycle's tokens as one chunk: the prefill's first token, then
/// per cycle its kept tokens (accepted drafts + the bonus). So the chunks after the first are the
/// cycles, and the tokens before a chunk are the output position its cycle started at. Only an
/// answer's last cycle can keep fewer tokens than it accepted (cut at the stop token or the
/// budget): the drafts it accepted past the end are the answer's own accepted count less its
/// kept drafts (SGLang), or, where the engine counts for the whole run only (vLLM), the run's
/// accepted count less every kept draft, placed when all the answers' last cycles fall in one
/// bucket. Refused, with the reason, unless it holds exactly: a stream without token counts, a
/// first chunk that already held cycles' tokens, a chunk larger than one cycle (k + 1 tokens),
/// or chunks that are not as many as the engine's cycles (the stream merged cycles).
pub fn stream_buckets(
    answers: &[StreamedAnswer],
    k: usize,
    run_cycles: u64,
    run_accepted: u64,
) -> std::result::Result<BucketCounts, String> {
    let mut b = BucketCounts::default();
    let (mut cycles, mut accepted) = (0u64, 0u64);
    // The bucket of each last cycle whose drafts past the answer's end the run alone counts.
    let mut unplaced_last: Vec<usize> = Vec::new();
    for (i, a) in answers.iter().enumerate() {
        let n = i + 1;
        let Some(&first) = a.chunk_tokens.first() else {
            return Err(format!("answer {n}'s stream carried no cumulative token counts"));
        };
        if first != 1 {
            return Err(format!("answer {n}'s first chunk held {first} tokens: cycles ran before it"));
        }
        let mut own = Vec::new();
        for w in a.chunk_tokens.windows(2) {
            let d = w[1] - w[0];
            if d == 0 || d > k as u64 + 1 {
                return Err(format!(
                    "a chunk of answer {n} carried {d} tokens, more than one cycle's k + 1 = {}: the stream merged cycles",
                    k + 1
                ));
            }
            own.push((w[0], d - 1));
        }
        if let Some(v) = a.verify_ct
            && v != own.len() as u64
        {
            return Err(format!("answer {n} counts {v} cycles in {} chunks after its first", own.len()));
        }
        let kept: u64 = own.iter().map(|c| c.1).sum();
        match (a.accepted_drafts, own.last_mut()) {
            (Some(raw), Some(last)) if raw >= kept && last.1 + raw - kept <= k as u64 => last.1 += raw - kept,
            (Some(0), None) => {}
            (Some(raw), _) => {
                return Err(format!("answer {n} counts {raw} accepted drafts where its chunks keep {kept}"));
            }
            (None, Some(last)) => unplaced_last.push(bucket_of(last.0)),
            (None, None) => {}
        }
        for (pos, acc) in own {
            b.add(pos, acc);
            cycles += 1;
            accepted += acc;
        }
    }
    if cycles != run_cycles {
        return Err(format!(
            "the stream's {cycles} chunks after the answers' first are not the engine's {run_cycles} cycles: the stream merged cycles"
        ));
    }
    let past = run_accepted
        .checked_sub(accepted)
        .ok_or_else(|| format!("the stream keeps {accepted} accepted drafts, more than the engine's {run_accepted}"))?;
    if past > 0 {
        unplaced_last.sort_unstable();
        unplaced_last.dedup();
        match unplaced_last.as_slice() {
            [one] => b.accepted[*one] += past,
            _ => {
                return Err(format!(
                    "{past} drafts accepted past the answers' ends, counted for the run only, cannot be placed: the answers' last cycles lie in several buckets"
                ));
            }
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn rates_and_tau_by_hand() {
        // 10 cycles at k = 3: 2 accepted 0, 3 accepted 1, 4 accepted 2, 1 accepted 3.
        let p = AcceptanceProfile::from_counts(&[2, 3, 4, 1], false, "test", "by hand");
        // marginal: P(≥1) = 8/10, P(≥2) = 5/10, P(≥3) = 1/10.
        assert_eq!(p.marginal_accept_rates, vec![0.8, 0.5, 0.1]);
        // conditional_i = marginal_i / marginal_{i-1}: 0.8, 0.5/0.8, 0.1/0.5.
        let c = &p.conditional_accept_rates;
        assert!(close(c[0], 0.8) && close(c[1], 0.625) && close(c[2], 0.2), "{c:?}");
        // τ = 1 + Σ marginal = 2.4 = 1 + (3 + 8 + 3) / 10.
        assert!(close(p.mean_accept_length, 2.4));
        assert!(close(p.accepted_drafts, 14.0) && close(p.cycles, 10.0));
        assert_eq!(p.acceptance_length_histogram["1"], 2.0);
        assert_eq!(p.acceptance_length_histogram["4"], 1.0);
        assert_eq!((p.num_speculative_tokens, p.accept_length_model.as_str()), (3, "chain_analytic"));
        assert!(p.output_position_buckets_unavailable.is_some());
        // Nothing survives past a rejected position: conditional 0, not NaN.
        let dead = AcceptanceProfile::from_counts(&[5, 0, 0], true, "test", "by hand");
        assert_eq!(dead.conditional_accept_rates, vec![0.0, 0.0]);
        assert_eq!(dead.verification_method, "tree");
        assert!(close(dead.mean_accept_length, 1.0));
    }

    #[test]
    fn buckets_partition_the_cycles() {
        assert_eq!([0, 255, 256, 1023, 1024, 4095, 4096, 100_000].map(bucket_of), [0, 0, 1, 1, 2, 2, 3, 3]);
        let mut b = BucketCounts::default();
        // Cycles at positions 1, 3 (2 and 1 accepted), 300 (0), 5000 (3).
        for (pos, a) in [(1, 2), (3, 1), (300, 0), (5000, 3)] {
            b.add(pos, a);
        }
        let p = AcceptanceProfile::from_counts(&[1, 1, 1, 1], false, "test", "by hand").with_buckets(&b).unwrap();
        let taus: Vec<Option<f64>> = p.output_position_buckets.iter().map(|b| b.mean_accept_length).collect();
        assert_eq!(taus, vec![Some(2.5), Some(1.0), None, Some(4.0)]);
        assert_eq!(p.bucket_tau("0-256"), Some(2.5));
        assert!(p.output_position_buckets_unavailable.is_none());
        assert_eq!(p.output_position_buckets.iter().map(|b| b.cycles).sum::<u64>(), 4);
        // Buckets of other cycles are refused.
        let mut other = b;
        other.add(10, 1);
        let e = AcceptanceProfile::from_counts(&[1, 1, 1, 1], false, "t", "c").with_buckets(&other).unwrap_err();
        assert!(e.to_string().contains("not the same cycles"), "{e}");
        let mut m = BucketCounts::default();
        m.merge(&b);
        m.merge(&b);
        assert_eq!((m.total_cycles(), m.total_accepted()), (8, 12));
        let none = p.clone().without_buckets("global counters");
        assert!(none.output_position_buckets.is_empty() && none.bucket_line().contains("global counters"));
    }

    #[test]
    fn stream_chunks_are_the_cycles() {
        // k = 3. Answer 1: first token, then cycles keeping 3, 1 and 2 tokens (the last cut: the
        // engine counted 2 more accepted drafts than kept).
        let one = [1, 4, 5, 7];
        let sg = StreamedAnswer { chunk_tokens: &one, verify_ct: Some(3), accepted_drafts: Some(5) };
        let b = stream_buckets(&[sg], 3, 3, 5).unwrap();
        assert_eq!((b.cycles[0], b.accepted[0]), (3, 5));
        // The same stream, counted for the run only (vLLM): the 2 past the end go to the last
        // cycle's bucket.
        let vl = StreamedAnswer { chunk_tokens: &one, verify_ct: None, accepted_drafts: None };
        assert_eq!(stream_buckets(&[vl], 3, 3, 5).unwrap(), b);
        // An answer reaching past 256 tokens: 63 cycles of 4 tokens from 1 to 253, one of 3
        // (from 253, in 0-256), one of 2 (from 256, in 256-1k).
        let mut long: Vec<u64> = (0..64).map(|i| 1 + 4 * i).collect();
        long.extend([256, 258]);
        let l = StreamedAnswer { chunk_tokens: &long, verify_ct: None, accepted_drafts: None };
        let lb = stream_buckets(&[l], 3, 65, 192).unwrap();
        assert_eq!((lb.cycles, lb.accepted), ([64, 1, 0, 0], [191, 1, 0, 0]));
        // Two answers whose last cycles lie in two buckets: drafts past the ends cannot be placed.
        let e = stream_buckets(&[vl, l], 3, 68, 197).unwrap_err();
        assert!(e.contains("several buckets"), "{e}");
        // Merged cycles, or fewer chunks than cycles, are refused.
        let merged = [1, 9];
        let m = StreamedAnswer { chunk_tokens: &merged, verify_ct: None, accepted_drafts: None };
        assert!(stream_buckets(&[m], 3, 1, 7).unwrap_err().contains("merged"));
        assert!(stream_buckets(&[vl], 3, 4, 5).unwrap_err().contains("not the engine's 4 cycles"));
        let late = [3, 4];
        let f = StreamedAnswer { chunk_tokens: &late, verify_ct: None, accepted_drafts: None };
        assert!(stream_buckets(&[f], 3, 1, 0).unwrap_err().contains("first chunk"));
        let none = StreamedAnswer { chunk_tokens: &[], verify_ct: None, accepted_drafts: None };
        assert!(stream_buckets(&[none], 3, 0, 0).unwrap_err().contains("no cumulative token counts"));
    }

    #[test]
    fn json_takes_model_optimizer_names_and_writes_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PROFILE_FILE);
        let p = AcceptanceProfile::from_counts(&[1, 3], false, "eval decode", "verdicts").condition("engine", "native");
        p.write(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for key in [
            "conditional_accept_rates",
            "marginal_accept_rates",
            "mean_accept_length",
            "num_speculative_tokens",
            "acceptance_length_histogram",
            "accept_length_model",
            "verification_method",
            "measurement_conditions",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(v["measurement_conditions"]["engine"], "native");
        let back: AcceptanceProfile = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }
}
