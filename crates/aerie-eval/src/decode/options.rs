//! What a decoding run is asked to do: the draft layout (chain or EAGLE-2 tree), the temperature
//! and verification rule, the answer budget and the seed, with the combinations that have no
//! lossless meaning rejected before any model is loaded.

use serde::Serialize;

use aerie_model::drafter::shape::DraftShape;

use crate::accept::AcceptRule;
use crate::{Error, Result};

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
        if let Err(m) = self.shape.check(draft_vocab) {
            return bad(m);
        }
        if self.shape.tree().is_some() && self.rule == AcceptRule::Sampling {
            return bad("the sampling rule needs drafts sampled from q: use a chain (topk 1) or --rule onehot".into());
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
