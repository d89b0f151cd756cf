//! The draft layout of one speculation cycle, in SGLang's terms (`--speculative-num-steps`,
//! `--speculative-eagle-topk`, `--speculative-num-draft-tokens`): one type that offline
//! acceptance (`eval accept`), real decoding (`eval decode`) and `compare` all take, so a
//! layout means the same thing in every report.

use serde::Serialize;

/// An EAGLE-2 tree: `depth` draft steps, `topk` children per node and paths kept per step,
/// `verify_tokens` verified per cycle, the root included (drafts = `verify_tokens` − 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TreeShape {
    /// Draft steps (tree depth).
    pub depth: usize,
    /// Children expanded per node and paths kept per step.
    pub topk: usize,
    /// Tokens the target verifies per cycle, root included (`tokens` in reports).
    #[serde(rename = "tokens")]
    pub verify_tokens: usize,
}

impl TreeShape {
    /// Tokens a tree of this depth and topk can put before the target, the root included: topk
    /// nodes at the first step, then topk kept paths × topk children at each later one, as SGLang
    /// grows it. More `verify_tokens` than this would be nodes that do not exist.
    pub fn capacity(&self) -> usize {
        let later = self.depth.saturating_sub(1).saturating_mul(self.topk.saturating_mul(self.topk));
        1usize.saturating_add(self.topk).saturating_add(later)
    }
}

/// Draft steps per cycle at most (`--k`): SGLang serves 3 to 8, EAGLE-3 trains 7 steps ahead,
/// and a chain's acceptance past a few dozen steps is zero for any drafter, while its cost (KV
/// cache, draft forwards) grows with every step: a larger K is a typo, not an experiment.
pub const MAX_DEPTH: usize = 64;
/// Children per tree node at most (SGLang's `--speculative-eagle-topk` runs 1 to 10).
pub const MAX_TOPK: usize = 64;
/// Tokens verified per tree cycle at most (SGLang's `--speculative-num-draft-tokens` runs up
/// to a few hundred; the target's attention mask over them is quadratic).
pub const MAX_VERIFY_TOKENS: usize = 1024;

/// How drafts are laid out each cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DraftShape {
    /// A chain of `k` drafts (SGLang topk 1, `num_steps` k, k + 1 verified tokens).
    Chain {
        /// Drafts per cycle.
        k: usize,
    },
    /// An EAGLE-2 tree.
    Tree(TreeShape),
}

impl DraftShape {
    /// Drafter forwards per cycle (the chain length, or the tree depth).
    pub fn depth(&self) -> usize {
        match *self {
            DraftShape::Chain { k } => k,
            DraftShape::Tree(t) => t.depth,
        }
    }

    /// Tokens the target verifies per cycle, root included.
    pub fn verify_tokens(&self) -> usize {
        match *self {
            DraftShape::Chain { k } => k + 1,
            DraftShape::Tree(t) => t.verify_tokens,
        }
    }

    /// The tree, if this is one.
    pub fn tree(&self) -> Option<TreeShape> {
        match *self {
            DraftShape::Chain { .. } => None,
            DraftShape::Tree(t) => Some(t),
        }
    }

    /// Why this layout cannot be drafted with a draft vocabulary of `vd` ids, if it cannot
    /// (`usize::MAX` when the vocabulary is not known yet).
    pub fn check(&self, vd: usize) -> std::result::Result<(), String> {
        let depth = self.depth();
        if depth > MAX_DEPTH {
            return Err(format!(
                "--k {depth} is above the limit of {MAX_DEPTH} draft steps (acceptance decays geometrically with depth; \
                 deeper drafts only cost memory and time)"
            ));
        }
        if let DraftShape::Tree(t) = *self
            && (t.topk > MAX_TOPK || t.verify_tokens > MAX_VERIFY_TOKENS)
        {
            return Err(format!(
                "a tree of topk {} and {} verified tokens is above the limits of topk {MAX_TOPK} and \
                 {MAX_VERIFY_TOKENS} verified tokens per cycle",
                t.topk, t.verify_tokens
            ));
        }
        if let DraftShape::Tree(t) = *self
            && t.depth > 0
            && t.topk > 0
            && t.verify_tokens > t.capacity()
        {
            return Err(format!(
                "--tree-tokens {}: a tree of depth {} (--k) and topk {} holds at most {} tokens (the root, topk at \
                 the first step and topk² at each later one, as SGLang builds it): give --tree-tokens {} or less, or \
                 a deeper or wider tree",
                t.verify_tokens,
                t.depth,
                t.topk,
                t.capacity(),
                t.capacity()
            ));
        }
        match *self {
            DraftShape::Chain { k: 0 } => Err("--k 0: a chain needs 1 draft step or more".into()),
            DraftShape::Chain { .. } => Ok(()),
            DraftShape::Tree(TreeShape { depth, topk, verify_tokens }) => {
                if depth == 0 || topk == 0 || topk > vd || verify_tokens < 2 {
                    // `usize::MAX` stands for a vocabulary not known yet: not a number to print.
                    let vd = if vd == usize::MAX { "Vd".to_owned() } else { format!("Vd ({vd})") };
                    Err(format!(
                        "a tree needs depth >= 1, 1 <= topk <= {vd} and at least 2 verified tokens; got depth {depth}, topk {topk}, tokens {verify_tokens}"
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_spell_shapes_as_before() {
        let chain = serde_json::to_string(&DraftShape::Chain { k: 3 }).unwrap();
        assert_eq!(chain, r#"{"kind":"chain","k":3}"#);
        let tree = DraftShape::Tree(TreeShape { depth: 3, topk: 2, verify_tokens: 6 });
        assert_eq!(serde_json::to_string(&tree).unwrap(), r#"{"kind":"tree","depth":3,"topk":2,"tokens":6}"#);
        assert_eq!((tree.depth(), tree.verify_tokens(), DraftShape::Chain { k: 3 }.verify_tokens()), (3, 6, 4));
        assert!(DraftShape::Chain { k: 0 }.check(10).is_err());
        assert!(tree.check(1).unwrap_err().contains("topk <= Vd (1)"));
        assert!(tree.check(10).is_ok());
        // More verified tokens than the tree holds: 1 + 4 + 16 at depth 2, topk 4.
        let wide = |tokens| DraftShape::Tree(TreeShape { depth: 2, topk: 4, verify_tokens: tokens });
        assert!(wide(21).check(10).is_ok());
        let e = wide(22).check(10).unwrap_err();
        assert!(e.contains("--tree-tokens 22") && e.contains("holds at most 21"), "{e}");
        assert_eq!(TreeShape { depth: 3, topk: 1, verify_tokens: 4 }.capacity(), 4);
        assert_eq!(TreeShape { depth: usize::MAX, topk: usize::MAX, verify_tokens: 4 }.capacity(), usize::MAX);
        assert!(DraftShape::Chain { k: 0 }.check(10).unwrap_err().contains("--k 0"));
    }

    #[test]
    fn sizes_past_the_limits_are_refused_with_the_limit() {
        assert!(DraftShape::Chain { k: MAX_DEPTH }.check(10).is_ok());
        let err = DraftShape::Chain { k: 100_000 }.check(10).unwrap_err();
        assert!(err.contains("--k 100000") && err.contains("limit of 64"), "{err}");
        let wide = DraftShape::Tree(TreeShape { depth: 3, topk: 65, verify_tokens: 6 });
        assert!(wide.check(usize::MAX).unwrap_err().contains("topk 64"));
        let none = DraftShape::Tree(TreeShape { depth: 3, topk: 0, verify_tokens: 4 }).check(usize::MAX).unwrap_err();
        assert!(none.contains("1 <= topk <= Vd and") && !none.contains(&usize::MAX.to_string()), "{none}");
        let many = DraftShape::Tree(TreeShape { depth: 3, topk: 2, verify_tokens: 5000 });
        assert!(many.check(usize::MAX).unwrap_err().contains("1024 verified tokens"));
    }
}
