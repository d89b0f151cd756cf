//! What a decoding run is asked to do: the draft layout (chain or EAGLE-2 tree), the temperature
//! and verification rule, the answer budget and the seed, with the combinations that have no
//! lossless meaning rejected before any model is loaded.

use serde::Serialize;

use crate::accept::AcceptRule;
use crate::{Error, Result};

/// How drafts are laid out each cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DraftShape {
    /// A chain of `k` drafts (SGLang topk 1, `num_steps` k, k+1 verified tokens).
    Chain {
        /// Drafts per cycle.
        k: usize,
    },
    /// An EAGLE-2 tree: `depth` draft steps, `topk` children per node, `tokens` verified per
    /// pass, root included.
    Tree {
        /// Draft steps.
        depth: usize,
        /// Children per node and paths kept per step.
        topk: usize,
        /// Tokens verified per cycle, root included.
        tokens: usize,
    },
}

impl DraftShape {
    /// Drafter forwards per cycle (one extend plus depth − 1 steps).
    pub fn depth(&self) -> usize {
        match *self {
            DraftShape::Chain { k } => k,
            DraftShape::Tree { depth, .. } => depth,
        }
    }

    /// Tokens the target verifies per cycle, root included.
    pub fn verify_tokens(&self) -> usize {
        match *self {
            DraftShape::Chain { k } => k + 1,
            DraftShape::Tree { tokens, .. } => tokens,
        }
    }
}

/// Options of a decoding run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeOptions {
    /// Draft layout.
    pub shape: DraftShape,
    /// Sampling temperature of the target (0: greedy).
    pub temperature: f64,
    /// Verification rule: greedy at temperature 0; onehot or sampling (chain only) above.
    pub rule: AcceptRule,
    /// New tokens per answer at most.
    pub max_new_tokens: usize,
    /// Seed of every sampler (the same seed gives the same outputs).
    pub seed: u64,
}

impl DecodeOptions {
    /// Reject combinations that have no lossless meaning.
    pub fn validate(&self, draft_vocab: usize) -> Result<()> {
        let bad = |m: String| Err(Error::Incompatible(m));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if self.max_new_tokens == 0 {
            return bad("max new tokens must be at least 1".into());
        }
        match self.shape {
            DraftShape::Chain { k: 0 } => return bad("k must be at least 1".into()),
            DraftShape::Tree { depth, topk, tokens } => {
                if depth == 0 || topk == 0 || topk > draft_vocab || tokens < 2 {
                    return bad(format!(
                        "a draft tree needs depth >= 1, 1 <= topk <= Vd ({draft_vocab}) and >= 2 verified tokens; got depth {depth}, topk {topk}, tokens {tokens}"
                    ));
                }
                if self.rule == AcceptRule::Sampling {
                    return bad(
                        "the sampling rule needs drafts sampled from q: use a chain (topk 1) or --rule onehot".into()
                    );
                }
            }
            DraftShape::Chain { .. } => {}
        }
        match (self.rule, self.temperature == 0.0) {
            (AcceptRule::Greedy, true) | (AcceptRule::Onehot | AcceptRule::Sampling, false) => Ok(()),
            (AcceptRule::Greedy, false) => {
                bad("the greedy rule decodes at temperature 0; use --rule onehot or sampling above it".into())
            }
            (rule, true) => {
                bad(format!("the {} rule samples: give --temperature > 0 (or use --rule greedy)", rule.name()))
            }
        }
    }
}
