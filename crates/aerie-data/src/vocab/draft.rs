//! The draft vocabulary as a value: the sorted target ids a drafter's `lm_head` predicts, with
//! their `d2t` offsets and `t2d` membership mask, and the invariants of eagle3.md §4 enforced
//! wherever one is built. One type for every stage: the vocabulary builder, the drafter (whose
//! `lm_head` rows are tied to it), its teacher and checkpoints, and training's warm starts.

use super::TokenCounts;

/// A draft vocabulary over a target vocabulary of V ids: Vd target ids, strictly ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftVocab {
    target_ids: Vec<usize>,
    d2t: Vec<i64>,
    t2d: Vec<bool>,
}

impl DraftVocab {
    /// The identity map (Vd = V), used when a drafter has no reduced vocabulary.
    pub fn identity(vocab_size: usize) -> Self {
        Self { target_ids: (0..vocab_size).collect(), d2t: vec![0; vocab_size], t2d: vec![true; vocab_size] }
    }

    /// From target ids, which must be strictly ascending and below `vocab_size`.
    pub fn from_target_ids(target_ids: Vec<usize>, vocab_size: usize) -> Result<Self, String> {
        if target_ids.is_empty() {
            return Err("the draft vocabulary is empty".into());
        }
        if let Some(w) = target_ids.windows(2).position(|w| w[0] >= w[1]) {
            return Err(format!(
                "target ids are not strictly ascending at draft id {}: {} then {}",
                w + 1,
                target_ids[w],
                target_ids[w + 1]
            ));
        }
        let last = *target_ids.last().expect("non-empty");
        if last >= vocab_size {
            return Err(format!("target id {last} is outside the target vocabulary of {vocab_size}"));
        }
        let mut t2d = vec![false; vocab_size];
        for &t in &target_ids {
            t2d[t] = true;
        }
        let d2t = target_ids.iter().enumerate().map(|(i, &t)| t as i64 - i as i64).collect();
        Ok(Self { target_ids, d2t, t2d })
    }

    /// From `d2t` offsets (`target = i + d2t[i]`), as stored in checkpoints; the `t2d` mask is
    /// derived (SGLang ignores a stored one).
    pub fn from_d2t(d2t: &[i64], vocab_size: usize) -> Result<Self, String> {
        let ids = d2t
            .iter()
            .enumerate()
            .map(|(i, &off)| {
                let t = i as i64 + off;
                usize::try_from(t).map_err(|_| format!("draft id {i}: target id {t} is out of range"))
            })
            .collect::<Result<Vec<usize>, String>>()?;
        Self::from_target_ids(ids, vocab_size)
    }

    /// The `n` most frequent ids of `counts` (ties: lower id first), padded with the lowest
    /// unused ids when fewer than `n` occur, sorted ascending.
    pub fn build(counts: &TokenCounts, n: usize) -> Result<Self, String> {
        let v = counts.counts.len();
        if n == 0 || n > v {
            return Err(format!("draft vocab size {n} must be in 1..={v} (the target vocabulary)"));
        }
        let mut seen: Vec<usize> = (0..v).filter(|&i| counts.counts[i] > 0).collect();
        seen.sort_by(|&a, &b| counts.counts[b].cmp(&counts.counts[a]).then(a.cmp(&b)));
        seen.truncate(n);
        let mut chosen = vec![false; v];
        for &id in &seen {
            chosen[id] = true;
        }
        let mut pad = 0usize;
        while seen.len() < n {
            if !chosen[pad] {
                chosen[pad] = true;
                seen.push(pad);
            }
            pad += 1;
        }
        seen.sort_unstable();
        Self::from_target_ids(seen, v)
    }

    /// Check a stored `t2d` mask against this vocabulary.
    pub fn check_t2d(&self, t2d: &[bool]) -> Result<(), String> {
        if t2d.len() != self.t2d.len() {
            return Err(format!("t2d has {} entries, vocab_size is {}", t2d.len(), self.t2d.len()));
        }
        let count = t2d.iter().filter(|&&b| b).count();
        if count != self.d2t.len() {
            return Err(format!("t2d marks {count} ids but the draft vocab has {}", self.d2t.len()));
        }
        if let Some(t) = (0..t2d.len()).find(|&t| t2d[t] != self.t2d[t]) {
            return Err(format!("t2d[{t}] = {} disagrees with d2t (nonzero(t2d) != d2t + arange)", t2d[t]));
        }
        Ok(())
    }

    /// Vd.
    pub fn draft_vocab_size(&self) -> usize {
        self.target_ids.len()
    }

    /// V.
    pub fn vocab_size(&self) -> usize {
        self.t2d.len()
    }

    /// Target id of each draft id, ascending.
    pub fn target_ids(&self) -> &[usize] {
        &self.target_ids
    }

    /// `d2t[i] = target_ids[i] - i`, as stored in checkpoints.
    pub fn d2t(&self) -> &[i64] {
        &self.d2t
    }

    /// `t2d[t]`: whether target id `t` is in the draft vocabulary.
    pub fn t2d(&self) -> &[bool] {
        &self.t2d
    }

    /// Whether target id `t` is in the draft vocabulary.
    pub fn contains(&self, t: usize) -> bool {
        self.t2d.get(t).copied().unwrap_or(false)
    }

    /// Share of the masked tokens of `counts` whose id is in the vocabulary (0 when none).
    pub fn coverage(&self, counts: &TokenCounts) -> f64 {
        if counts.masked_tokens == 0 {
            return 0.0;
        }
        self.covered(counts) as f64 / counts.masked_tokens as f64
    }

    /// Masked tokens of `counts` whose id is in the vocabulary.
    pub fn covered(&self, counts: &TokenCounts) -> u64 {
        self.target_ids.iter().map(|&t| counts.counts.get(t).copied().unwrap_or(0)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_mask_agree() {
        let m = DraftVocab::from_target_ids(vec![0, 3, 4, 9], 10).unwrap();
        assert_eq!(m.d2t(), &[0, 2, 2, 6]);
        assert_eq!(m.t2d().iter().filter(|&&b| b).count(), 4);
        assert!(m.contains(9) && !m.contains(8));
        let back = DraftVocab::from_d2t(m.d2t(), 10).unwrap();
        assert_eq!(back, m);
        assert!(m.check_t2d(m.t2d()).is_ok());
    }

    #[test]
    fn broken_maps_are_rejected() {
        assert!(DraftVocab::from_d2t(&[0, 0, 5], 6).unwrap_err().contains("outside"));
        assert!(DraftVocab::from_d2t(&[1, 0], 6).unwrap_err().contains("ascending"));
        let m = DraftVocab::from_target_ids(vec![1, 2], 4).unwrap();
        assert!(m.check_t2d(&[true, true, false, false]).unwrap_err().contains("disagrees"));
        assert!(m.check_t2d(&[false, true, true, true]).unwrap_err().contains("marks 3"));
    }
}
