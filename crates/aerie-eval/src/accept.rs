//! Acceptance statistics of speculative decoding (eagle3.md §6) as pure functions over arrays,
//! and the report of `aerie eval accept`.
//!
//! Vocabulary, used in every field name:
//! - τ (accept length): tokens emitted per verify pass, the target's bonus token INCLUDED, in
//!   `[1, k+1]` for a chain of k drafts;
//! - unconditional rate `r_i` = P(at least i drafts accepted); τ = 1 + Σ_i r_i (vLLM,
//!   speculators);
//! - conditional rate `α_i` = P(draft i accepted | drafts 1..i-1 accepted); τ = 1 + Σ_k Π_{i≤k}
//!   α_i (EAGLE papers).
//!
//! A verify rule turns each drafted token into an acceptance probability: 0/1 for greedy
//! verification, `Σ min(p, q)` for speculative sampling, `p(x_draft)` for one-hot drafts. A
//! chain's survival `s_i = Π_{j≤i} a_j` is the probability that its first i drafts are all
//! accepted; averaging survivals over positions gives `r_i`. Because the first k drafts of a
//! K-chain are exactly the drafts of a k-chain, τ(k) = 1 + Σ_{i≤k} r_i for every k ≤ K.

use serde::{Deserialize, Serialize};

use crate::cycles::CycleCount;
// The rate arithmetic every profile shares lives with the profile.
use crate::profile::AcceptanceProfile;
pub use crate::profile::{conditional_from_unconditional, tau_from_unconditional};

/// Accepted drafts of one chain under greedy verification: the length of the leading run of hits.
pub fn chain_accept(hits: &[bool]) -> usize {
    hits.iter().take_while(|&&h| h).count()
}

/// Survival of a chain: `s_i = Π_{j≤i} a_j` for per-draft acceptance probabilities `a`.
pub fn chain_survival(accept_probs: &[f64]) -> Vec<f64> {
    let mut prod = 1.0;
    accept_probs
        .iter()
        .map(|&a| {
            prod *= a;
            prod
        })
        .collect()
}

/// Unconditional rates `r_i = P(accepted ≥ i)`, i = 1..=k, from per-position accepted counts.
pub fn unconditional_from_lengths(lengths: &[usize], k: usize) -> Vec<f64> {
    let n = lengths.len();
    (1..=k).map(|i| if n == 0 { 0.0 } else { lengths.iter().filter(|&&a| a >= i).count() as f64 / n as f64 }).collect()
}

/// Unconditional rates from conditional ones: `r_i = Π_{j≤i} α_j`.
pub fn unconditional_from_conditional(alpha: &[f64]) -> Vec<f64> {
    chain_survival(alpha)
}

/// τ = 1 + Σ_k Π_{i≤k} α_i from conditional rates.
pub fn tau_from_conditional(alpha: &[f64]) -> f64 {
    1.0 + chain_survival(alpha).iter().sum::<f64>()
}

/// τ(k) for k = 1..=K from the unconditional rates of a K-chain.
pub fn tau_curve(r: &[f64]) -> Vec<f64> {
    let mut tau = 1.0;
    r.iter()
        .map(|&ri| {
            tau += ri;
            tau
        })
        .collect()
}

/// Greedy verification of a draft tree: from the root, follow the child whose token equals the
/// target's choice at that depth (`target[d-1]`, `None` where it cannot be verified), as long as
/// one exists. `parents[i]` is node i's parent (`None` under the root), parents before children.
/// Returns the number of accepted drafts.
pub fn tree_accept(parents: &[Option<usize>], tokens: &[u32], target: &[Option<u32>]) -> usize {
    let mut at: Option<usize> = None;
    let mut depth = 0;
    while let Some(&Some(want)) = target.get(depth) {
        match (0..parents.len()).find(|&i| parents[i] == at && tokens[i] == want) {
            Some(i) => {
                at = Some(i);
                depth += 1;
            }
            None => break,
        }
    }
    depth
}

/// Sums over positions from which the rates follow (mergeable across batches).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcceptCounter {
    /// Positions counted.
    pub positions: u64,
    /// Σ over positions of the survival s_i, i = 1..=K.
    pub survival: Vec<f64>,
    /// Σ over positions of P(exactly a drafts accepted), a = 0..=K.
    pub histogram: Vec<f64>,
    /// Positions whose chain was cut before K by the end of the turn or sequence.
    pub cut_by_end: u64,
    /// Counted positions where the captured next token is not the target's argmax.
    pub captured_not_argmax: u64,
}

impl AcceptCounter {
    /// A counter for chains (or trees) of `k` drafts.
    pub fn new(k: usize) -> Self {
        Self { survival: vec![0.0; k], histogram: vec![0.0; k + 1], ..Self::default() }
    }

    /// Add one position given its per-draft acceptance probabilities (shorter than K when the
    /// chain was cut: the rest counts as rejected).
    pub fn add_probs(&mut self, accept_probs: &[f64]) {
        let s = chain_survival(accept_probs);
        self.add_survival(&s);
    }

    /// Add one position with exactly `accepted` drafts accepted (greedy verification, trees).
    pub fn add_length(&mut self, accepted: usize) {
        let s = vec![1.0; accepted.min(self.survival.len())];
        self.add_survival(&s);
    }

    fn add_survival(&mut self, s: &[f64]) {
        self.positions += 1;
        let k = self.survival.len();
        for (i, &si) in s.iter().take(k).enumerate() {
            self.survival[i] += si;
        }
        for a in 0..=k {
            let here = if a == 0 { 1.0 } else { s.get(a - 1).copied().unwrap_or(0.0) };
            let next = if a < k { s.get(a).copied().unwrap_or(0.0) } else { 0.0 };
            self.histogram[a] += here - next;
        }
    }

    /// Merge another counter of the same K.
    pub fn merge(&mut self, other: &AcceptCounter) {
        self.positions += other.positions;
        for (a, b) in self.survival.iter_mut().zip(&other.survival) {
            *a += b;
        }
        for (a, b) in self.histogram.iter_mut().zip(&other.histogram) {
            *a += b;
        }
        self.cut_by_end += other.cut_by_end;
        self.captured_not_argmax += other.captured_not_argmax;
    }

    /// Unconditional rates r_i.
    pub fn unconditional(&self) -> Vec<f64> {
        let n = self.positions.max(1) as f64;
        self.survival.iter().map(|s| s / n).collect()
    }
}

/// How drafted tokens are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AcceptRule {
    /// Accept iff the draft equals the target's argmax over the full vocabulary.
    Greedy,
    /// Speculative sampling: accept with probability Σ_v min(p, q) (p over the full vocabulary,
    /// restricted to draft ids, as `pf`).
    Sampling,
    /// One-hot drafts under sampling verification: accept with probability p(x_draft).
    Onehot,
}

impl AcceptRule {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            AcceptRule::Greedy => "greedy",
            AcceptRule::Sampling => "sampling",
            AcceptRule::Onehot => "onehot",
        }
    }
}

impl std::str::FromStr for AcceptRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "greedy" => Ok(Self::Greedy),
            "sampling" => Ok(Self::Sampling),
            "onehot" | "one-hot" => Ok(Self::Onehot),
            _ => Err(format!("`{s}` is not a verify rule: use greedy, sampling or onehot")),
        }
    }
}

/// One point of an acceptance curve: τ for a drafting configuration verified in one pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Draft steps.
    pub k: usize,
    /// Tokens the target verifies per pass (k + 1 for a chain, N for a tree).
    pub verify_tokens: usize,
    /// Accept length, bonus included.
    pub tau: f64,
}

/// The result of `aerie eval accept` (its `--json` output; field names are a stable interface).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcceptReport {
    /// Verify rule.
    pub rule: AcceptRule,
    /// `chain` or `tree`.
    pub drafting: String,
    /// Draft steps K (tree depth for trees).
    pub steps: usize,
    /// Tree expansion width (1 for chains).
    pub topk: usize,
    /// Tokens verified per pass (K + 1 for chains).
    pub verify_tokens: usize,
    /// Draft temperature (0 = argmax drafts).
    pub temperature: f64,
    /// τ at the full configuration, bonus included: over the cycles decoding runs when
    /// `cycles` is given (greedy on shards), else over every position.
    pub tau: f64,
    /// τ over every counted position as if each started a cycle (the per-position rates' τ).
    #[serde(default)]
    pub tau_all_positions: f64,
    /// Greedy on shards: the verify cycles of decoding walked over the answers, one per chain
    /// prefix k = 1..=K (one for a tree); `tau` and `curve` are theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cycles: Vec<CycleCount>,
    /// τ(k) for k = 1..=K (chains; a single point for trees).
    pub curve: Vec<CurvePoint>,
    /// α_i = P(draft i accepted | drafts before it accepted), i = 1..=K.
    pub accept_rate_conditional: Vec<f64>,
    /// r_i = P(at least i drafts accepted), i = 1..=K.
    pub accept_rate_unconditional: Vec<f64>,
    /// Σ over positions of P(exactly a drafts accepted), a = 0..=K (SGLang's histogram).
    pub accept_histogram: Vec<f64>,
    /// Positions counted (each plays one verify pass).
    pub positions: u64,
    /// Drafted tokens proposed (positions × drafts per pass).
    pub drafts: u64,
    /// Expected accepted drafts (Σ r_i × positions).
    pub accepted_drafts: f64,
    /// Positions whose chain the end of the assistant turn cut short.
    pub positions_cut_by_turn_end: u64,
    /// Share of counted positions whose captured next token is not the target's argmax.
    pub captured_not_target_argmax: f64,
    /// Samples evaluated.
    pub samples: usize,
    /// Caveats the numbers come with.
    pub warnings: Vec<String>,
    /// The acceptance profile ([`crate::profile`]): of the cycles decoding runs where they were
    /// walked (greedy on shards), τ by output position included; else of every position, without
    /// buckets (no cycle starts anywhere in particular).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<AcceptanceProfile>,
}

/// Why a profile over every position has no output-position buckets.
pub const NO_WALK_BUCKETS: &str = "every position counted as if it started a cycle (no cycle walk: the verify rule \
is not greedy), so no cycle starts at a particular output position";

impl AcceptReport {
    /// Build the report of a chain (curve k = 1..=K) or a tree (one point) from its counter.
    pub fn from_counter(c: &AcceptCounter, rule: AcceptRule, tree: Option<(usize, usize)>, temperature: f64) -> Self {
        let r = c.unconditional();
        let k = r.len();
        let tau = tau_from_unconditional(&r);
        let (drafting, topk, verify_tokens, curve) = match tree {
            None => {
                let curve = tau_curve(&r)
                    .into_iter()
                    .enumerate()
                    .map(|(i, tau)| CurvePoint { k: i + 1, verify_tokens: i + 2, tau })
                    .collect();
                ("chain".to_string(), 1, k + 1, curve)
            }
            Some((topk, n)) => ("tree".to_string(), topk, n, vec![CurvePoint { k, verify_tokens: n, tau }]),
        };
        let mismatch = if c.positions > 0 { c.captured_not_argmax as f64 / c.positions as f64 } else { 0.0 };
        let mut warnings = Vec::new();
        if mismatch > 0.0 {
            warnings.push(format!(
                "{:.1}% of counted positions have a captured next token that is not the target's argmax: the data are not the target's own greedy outputs, so the verified chains follow a prefix decoding would not have produced and {} τ here does not equal decoding τ",
                100.0 * mismatch,
                rule.name()
            ));
        }
        if c.positions == 0 {
            warnings
                .push("no position was counted (no assistant tokens with two successors under the loss mask)".into());
        }
        AcceptReport {
            rule,
            drafting,
            steps: k,
            topk,
            verify_tokens,
            temperature,
            tau,
            tau_all_positions: tau,
            cycles: Vec::new(),
            curve,
            accept_rate_conditional: conditional_from_unconditional(&r),
            accept_rate_unconditional: r.clone(),
            accept_histogram: c.histogram.clone(),
            positions: c.positions,
            drafts: c.positions * (verify_tokens as u64 - 1),
            accepted_drafts: r.iter().sum::<f64>() * c.positions as f64,
            positions_cut_by_turn_end: c.cut_by_end,
            captured_not_target_argmax: mismatch,
            samples: 0,
            warnings,
            profile: Some(
                AcceptanceProfile::from_histogram(&c.histogram, tree.is_some(), "eval accept", "every position")
                    .without_buckets(NO_WALK_BUCKETS),
            ),
        }
    }

    /// Take τ and the curve from the cycle walks of `walks` (k = 1..=K for a chain, K for a
    /// tree); the per-position rates stay.
    pub fn with_cycles(mut self, walks: Vec<CycleCount>) -> Self {
        if let Some(last) = walks.last() {
            self.tau = last.tau();
            let tree = self.drafting == "tree";
            // The walk's own counts always partition into its buckets.
            self.profile = last.profile(tree, "eval accept", "the cycle walk over the answers").ok();
            self.curve = match self.drafting.as_str() {
                "chain" => walks.iter().map(|w| CurvePoint { k: w.k, verify_tokens: w.k + 1, tau: w.tau() }).collect(),
                _ => vec![CurvePoint { k: last.k, verify_tokens: self.verify_tokens, tau: last.tau() }],
            };
        }
        self.cycles = walks;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn chain_accept_counts_the_leading_run() {
        assert_eq!(chain_accept(&[]), 0);
        assert_eq!(chain_accept(&[false, true, true]), 0);
        assert_eq!(chain_accept(&[true, true, false, true]), 2);
        assert_eq!(chain_accept(&[true, true, true]), 3);
    }

    #[test]
    fn tau_by_hand_from_lengths() {
        // Four positions, K = 3, accepted 0, 1, 3, 2 drafts: emitted 1, 2, 4, 3 tokens → τ = 2.5.
        let lengths = [0, 1, 3, 2];
        let r = unconditional_from_lengths(&lengths, 3);
        assert_eq!(r, vec![0.75, 0.5, 0.25]);
        assert!(close(tau_from_unconditional(&r), 2.5));
        let alpha = conditional_from_unconditional(&r);
        assert!(close(alpha[0], 0.75) && close(alpha[1], 2.0 / 3.0) && close(alpha[2], 0.5));
        assert!(close(tau_from_conditional(&alpha), 2.5));
        assert_eq!(tau_curve(&r), vec![1.75, 2.25, 2.5]);
        // τ(1) by hand: min(a, 1) = 0, 1, 1, 1 → 1 + 3/4.
        assert_eq!(unconditional_from_conditional(&alpha).len(), 3);
    }

    #[test]
    fn iid_acceptance_matches_the_closed_form() {
        // α = 0.6 at every step, k = 4: τ = (1 - α^5) / (1 - α) (eagle3.md §7).
        let alpha = [0.6; 4];
        let want = (1.0 - 0.6f64.powi(5)) / 0.4;
        assert!(close(tau_from_conditional(&alpha), want));
    }

    #[test]
    fn counter_matches_the_pure_functions() {
        let mut c = AcceptCounter::new(3);
        for a in [0, 1, 3, 2] {
            c.add_length(a);
        }
        assert_eq!(c.unconditional(), unconditional_from_lengths(&[0, 1, 3, 2], 3));
        assert_eq!(c.histogram, vec![1.0, 1.0, 1.0, 1.0]);
        // Expected acceptance: one position with probabilities 0.5, 0.5, 1 → s = .5, .25, .25.
        let mut e = AcceptCounter::new(3);
        e.add_probs(&[0.5, 0.5, 1.0]);
        assert_eq!(e.unconditional(), vec![0.5, 0.25, 0.25]);
        assert_eq!(e.histogram, vec![0.5, 0.25, 0.0, 0.25]);
        // A cut chain counts the missing drafts as rejected.
        let mut cut = AcceptCounter::new(3);
        cut.add_probs(&[1.0]);
        assert_eq!(cut.unconditional(), vec![1.0, 0.0, 0.0]);
        let mut m = c.clone();
        m.merge(&e);
        assert_eq!(m.positions, 5);
    }

    #[test]
    fn tree_walk_follows_matching_children() {
        // Root children: 5 (node 0), 7 (node 1); node 1's children: 9 (2), 4 (3); node 3: 8 (4).
        let parents = [None, None, Some(1), Some(1), Some(3)];
        let tokens = [5, 7, 9, 4, 8];
        assert_eq!(tree_accept(&parents, &tokens, &[Some(7), Some(4), Some(8), Some(1)]), 3);
        assert_eq!(tree_accept(&parents, &tokens, &[Some(7), Some(4), None]), 2);
        assert_eq!(tree_accept(&parents, &tokens, &[Some(5), Some(4)]), 1);
        assert_eq!(tree_accept(&parents, &tokens, &[Some(6)]), 0);
    }

    #[test]
    fn report_fields_and_warning() {
        let mut c = AcceptCounter::new(2);
        c.add_length(2);
        c.add_length(0);
        c.captured_not_argmax = 1;
        let rep = AcceptReport::from_counter(&c, AcceptRule::Greedy, None, 0.0);
        assert!(close(rep.tau, 2.0));
        assert_eq!(rep.curve.iter().map(|p| p.tau).collect::<Vec<_>>(), vec![1.5, 2.0]);
        assert_eq!(rep.curve[1].verify_tokens, 3);
        assert_eq!(rep.drafts, 4);
        assert!(rep.warnings[0].contains("does not equal decoding τ"));
        let json = serde_json::to_value(&rep).unwrap();
        assert_eq!(json["rule"], "greedy");
        assert!(json["accept_rate_conditional"].is_array() && json["accept_rate_unconditional"].is_array());
    }
}
