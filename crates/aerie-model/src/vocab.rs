//! The draft-vocabulary map (eagle3.md §4): `d2t` offsets from draft ids to target ids and the
//! `t2d` membership mask. A drafter's lm_head rows are tied to its map, so the map travels with
//! the drafter and is checked wherever it is built.

/// Draft ↔ target vocabulary mapping with the invariants of eagle3.md §4 enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VocabMap {
    d2t: Vec<i64>,
    t2d: Vec<bool>,
    target_ids: Vec<usize>,
}

impl VocabMap {
    /// The identity map (Vd = V), used when a drafter has no reduced vocabulary.
    pub fn identity(vocab_size: usize) -> Self {
        Self { d2t: vec![0; vocab_size], t2d: vec![true; vocab_size], target_ids: (0..vocab_size).collect() }
    }

    /// Build from the target ids of the draft vocabulary; they must be strictly ascending and
    /// `< vocab_size`.
    pub fn from_target_ids(target_ids: Vec<usize>, vocab_size: usize) -> Result<Self, String> {
        if let Some(w) = target_ids.windows(2).find(|w| w[0] >= w[1]) {
            return Err(format!("draft target ids not strictly ascending at {} >= {}", w[0], w[1]));
        }
        if let Some(&last) = target_ids.last()
            && last >= vocab_size
        {
            return Err(format!("draft target id {last} out of range for vocab {vocab_size}"));
        }
        let mut t2d = vec![false; vocab_size];
        for &t in &target_ids {
            t2d[t] = true;
        }
        let d2t = target_ids.iter().enumerate().map(|(i, &t)| t as i64 - i as i64).collect();
        Ok(Self { d2t, t2d, target_ids })
    }

    /// Build from stored `d2t` offsets, checking `0 <= i + d2t[i] < V` and strict ascent; the
    /// `t2d` mask is derived (SGLang ignores stored t2d).
    pub fn from_d2t(d2t: &[i64], vocab_size: usize) -> Result<Self, String> {
        let mut ids = Vec::with_capacity(d2t.len());
        for (i, &off) in d2t.iter().enumerate() {
            let t = i as i64 + off;
            if t < 0 || t >= vocab_size as i64 {
                return Err(format!("d2t[{i}] = {off} maps draft id {i} to target id {t}, outside 0..{vocab_size}"));
            }
            ids.push(t as usize);
        }
        Self::from_target_ids(ids, vocab_size)
    }

    /// Check a stored `t2d` mask against this map.
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
        self.d2t.len()
    }

    /// V.
    pub fn vocab_size(&self) -> usize {
        self.t2d.len()
    }

    /// Offsets, as stored in checkpoints.
    pub fn d2t(&self) -> &[i64] {
        &self.d2t
    }

    /// Membership mask over target ids.
    pub fn t2d(&self) -> &[bool] {
        &self.t2d
    }

    /// Target id of each draft id, ascending.
    pub fn target_ids(&self) -> &[usize] {
        &self.target_ids
    }

    /// Whether target id `t` is in the draft vocabulary.
    pub fn contains(&self, t: usize) -> bool {
        self.t2d.get(t).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_mask_agree() {
        let m = VocabMap::from_target_ids(vec![0, 3, 4, 9], 10).unwrap();
        assert_eq!(m.d2t(), &[0, 2, 2, 6]);
        assert_eq!(m.t2d().iter().filter(|&&b| b).count(), 4);
        assert!(m.contains(9) && !m.contains(8));
        let back = VocabMap::from_d2t(m.d2t(), 10).unwrap();
        assert_eq!(back, m);
        assert!(m.check_t2d(m.t2d()).is_ok());
    }

    #[test]
    fn broken_maps_are_rejected() {
        assert!(VocabMap::from_d2t(&[0, 0, 5], 6).unwrap_err().contains("outside"));
        assert!(VocabMap::from_d2t(&[1, 0], 6).unwrap_err().contains("ascending"));
        let m = VocabMap::from_target_ids(vec![1, 2], 4).unwrap();
        assert!(m.check_t2d(&[true, true, false, false]).unwrap_err().contains("disagrees"));
        assert!(m.check_t2d(&[false, true, true, true]).unwrap_err().contains("marks 3"));
    }
}
