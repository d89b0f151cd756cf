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
        match *self {
            DraftShape::Chain { k: 0 } => Err("a chain needs k >= 1".into()),
            DraftShape::Chain { .. } => Ok(()),
            DraftShape::Tree(TreeShape { depth, topk, verify_tokens }) => {
                if depth == 0 || topk == 0 || topk > vd || verify_tokens < 2 {
                    Err(format!(
                        "a tree needs depth >= 1, 1 <= topk <= Vd ({vd}) and at least 2 verified tokens; got depth {depth}, topk {topk}, tokens {verify_tokens}"
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
    }
}
