//! The verify cycles of greedy speculative decoding, walked over captured answers.
//!
//! Decoding does not draft at every position of an answer: the prefill emits the first answer
//! token, and each cycle drafts from the last emitted token, the target accepts a prefix of the
//! drafts and adds its bonus token, and the next cycle starts after that bonus. At temperature 0
//! the target's answer is fixed by its own argmax, so a cycle that starts after answer token c
//! accepts exactly the drafts that equal the next answer tokens: the drafts a position-by-position
//! evaluation already checks at position c. Walking c → c + accepted + 1 from the first answer
//! token therefore visits the positions decoding starts its cycles at, and counts its cycles and
//! accepted drafts one for one (docs/decoding.md, "The offline prediction walks the cycles").
//!
//! What an answer is. The loss mask of a prepared sample covers each assistant turn's content and
//! the end-of-turn token the template adds. When the target ended the answer itself, that token
//! is the stop token it generated and is an answer token; when the answer was cut at the token
//! budget, the template still adds it, but decoding never produced it. [`answer_tokens`] drops
//! it: exactly, when the budget the answers were generated with is known (an answer is then at
//! most that long), otherwise when the rest of the turn is the target's own greedy output and
//! the final token is not what the target would have generated there.

use serde::{Deserialize, Serialize};

use crate::profile::{AcceptanceProfile, BucketCounts};

/// Which tokens of a sample are answer tokens the target generated: the loss-masked turns, each
/// cut to `budget` tokens when it is given, otherwise without a final token the target would not
/// have generated after an otherwise greedy turn (the template's end-of-turn after a cut answer).
/// `argmax[r]` is the target's greedy choice after row r (the token it predicts at r + 1).
pub fn answer_tokens(ids: &[i32], loss_mask: &[u8], argmax: &[u32], budget: Option<usize>) -> Vec<bool> {
    let mut out: Vec<bool> = loss_mask.iter().map(|&m| m == 1).collect();
    for (start, end) in spans(&out) {
        match budget {
            Some(n) => out[(start + n).min(end)..end].iter_mut().for_each(|a| *a = false),
            None => {
                let last = end - 1;
                // The first token of a turn follows the prompt, which the target may not have
                // predicted; the others must be its own choices for the turn to count as greedy.
                let greedy = (start + 1..last).all(|r| ids[r] as u32 == argmax[r - 1]);
                if last > start && greedy && ids[last] as u32 != argmax[last - 1] {
                    out[last] = false;
                }
            }
        }
    }
    out
}

/// Maximal runs `[start, end)` of true values: the answers of a sample.
pub fn spans(tokens: &[bool]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &a) in tokens.iter().chain(std::iter::once(&false)).enumerate() {
        match (a, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Cycles and accepted drafts of one draft depth over a set of answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleCount {
    /// Draft steps per cycle.
    pub k: usize,
    /// Verify cycles (the first answer token comes from the prefill and is no cycle's).
    pub cycles: u64,
    /// Drafts accepted over those cycles that are answer tokens.
    pub accepted_drafts: u64,
    /// Cycles by accepted drafts (h[a], a = 0..=k; for the profile, not serialized).
    #[serde(skip)]
    pub histogram: Vec<u64>,
    /// Cycles and accepted drafts by the output position each cycle started at.
    #[serde(skip)]
    pub buckets: BucketCounts,
}

impl CycleCount {
    /// τ = tokens per cycle, bonus included: 1 + accepted / cycles (1 when no cycle ran).
    pub fn tau(&self) -> f64 {
        if self.cycles == 0 { 1.0 } else { 1.0 + self.accepted_drafts as f64 / self.cycles as f64 }
    }

    /// Count one cycle that started after `position` answer tokens (the prefill's first token
    /// included) and accepted `accepted` drafts.
    pub fn add(&mut self, position: u64, accepted: usize) {
        self.cycles += 1;
        self.accepted_drafts += accepted as u64;
        if self.histogram.len() <= accepted.max(self.k) {
            self.histogram.resize(accepted.max(self.k) + 1, 0);
        }
        self.histogram[accepted] += 1;
        self.buckets.add(position, accepted as u64);
    }

    /// The profile of these cycles, buckets included (`source` names the command, `counted` what
    /// the counts are).
    pub fn profile(&self, tree: bool, source: &str, counted: &str) -> crate::Result<AcceptanceProfile> {
        let mut h = self.histogram.clone();
        h.resize(h.len().max(self.k + 1), 0);
        AcceptanceProfile::from_counts(&h, tree, source, counted).with_buckets(&self.buckets)
    }

    /// Walk the cycles of one answer `[start, end)`: `accepted(c)` is the number of drafts a cycle
    /// starting after answer token c accepts (at most `end - 1 - c`: the drafts past the answer
    /// cannot be verified). Adds the cycles and accepted drafts to `self`.
    pub fn walk(&mut self, start: usize, end: usize, accepted: impl Fn(usize) -> usize) {
        let mut c = start;
        while c + 1 < end {
            let a = accepted(c).min(end - 1 - c);
            // The cycle after answer token c starts with c - start + 1 answer tokens emitted.
            self.add((c - start + 1) as u64, a);
            c += a + 1;
        }
    }

    /// Add another count of the same k.
    pub fn merge(&mut self, other: &CycleCount) {
        self.cycles += other.cycles;
        self.accepted_drafts += other.accepted_drafts;
        if self.histogram.len() < other.histogram.len() {
            self.histogram.resize(other.histogram.len(), 0);
        }
        self.histogram.iter_mut().zip(&other.histogram).for_each(|(a, b)| *a += b);
        self.buckets.merge(&other.buckets);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_the_maximal_runs() {
        assert_eq!(spans(&[false, true, true, false, true]), vec![(1, 3), (4, 5)]);
        assert_eq!(spans(&[]), vec![]);
        assert_eq!(spans(&[true, true]), vec![(0, 2)]);
    }

    #[test]
    fn the_walk_starts_each_cycle_after_the_last_bonus() {
        // An answer of 10 tokens at [2, 12); accepted drafts by start position.
        let acc = |c: usize| [0, 0, 2, 0, 0, 1, 0, 3, 0, 0, 0, 3][c];
        let mut n = CycleCount { k: 3, ..CycleCount::default() };
        n.walk(2, 12, acc);
        // c = 2 → 2 accepted, c = 5 → 1, c = 7 → 3, c = 11 = last token: done.
        assert_eq!((n.cycles, n.accepted_drafts), (3, 6));
        assert_eq!(n.tau(), 3.0);
        // Their profile: accept lengths 3, 2, 4; all three start within the first 256 tokens.
        assert_eq!(n.histogram, vec![0, 1, 1, 1]);
        let p = n.profile(false, "test", "walk").unwrap();
        assert!((p.mean_accept_length - 3.0).abs() < 1e-12, "{}", p.mean_accept_length);
        assert_eq!((p.output_position_buckets[0].cycles, p.bucket_tau("0-256")), (3, Some(3.0)));
        // The drafts past the answer's end are not counted: from c = 9, at most 2 remain.
        let mut cut = CycleCount::default();
        cut.walk(9, 12, |_| 3);
        assert_eq!((cut.cycles, cut.accepted_drafts), (1, 2));
        // A one-token answer has no cycle.
        let mut one = CycleCount::default();
        one.walk(4, 5, |_| 3);
        assert_eq!((one.cycles, one.tau()), (0, 1.0));
    }

    #[test]
    fn the_template_end_after_a_cut_answer_is_not_an_answer_token() {
        // Prompt of 2, answer 5 6 7, end-of-turn 9; the target predicts 6 after 5, 7 after 6 and
        // 8 (not 9) after 7: the answer was cut and 9 is the template's.
        let ids = [1, 2, 5, 6, 7, 9];
        let mask = [0, 0, 1, 1, 1, 1];
        let argmax = [4, 5, 6, 7, 8, 0];
        assert_eq!(answer_tokens(&ids, &mask, &argmax, None), vec![false, false, true, true, true, false]);
        // The target generated the end itself: kept.
        let argmax_stop = [4, 5, 6, 7, 9, 0];
        assert_eq!(answer_tokens(&ids, &mask, &argmax_stop, None), vec![false, false, true, true, true, true]);
        // Not the target's own answer (6 is not its choice after 5): the end is kept, as in any
        // teacher-forced data.
        let other = [4, 5, 3, 7, 8, 0];
        assert_eq!(answer_tokens(&ids, &mask, &other, None), vec![false, false, true, true, true, true]);
        // A known budget decides alone: 3 tokens.
        assert_eq!(answer_tokens(&ids, &mask, &argmax_stop, Some(3)), vec![false, false, true, true, true, false]);
        assert_eq!(answer_tokens(&ids, &mask, &argmax, Some(8)), vec![false, false, true, true, true, true]);
    }
}
