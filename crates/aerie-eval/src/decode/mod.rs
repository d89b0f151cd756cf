//! Real EAGLE-3 speculative decoding on the native target (EAGLE-3, arXiv 2503.01840; trees from
//! EAGLE-2, arXiv 2406.16858; lossless verification from Leviathan et al., arXiv 2211.17192), the
//! way SGLang's EAGLE worker runs a request, batch 1:
//!
//! 1. prefill: the target runs the prompt, keeping its KV cache and the aux features; the first
//!    token comes from its last logits; the drafter extends over the prompt (position t pairs f_t
//!    with x_{t+1});
//! 2. draft: from the last extended position, a chain of k tokens (argmax, or sampled from q), or
//!    an EAGLE-2 tree (top-k children of the best k paths per step, pruned to N−1 nodes by
//!    cumulative log q);
//! 3. verify: one target forward over [last token, drafts] (a tree attends through its ancestor
//!    mask, siblings share a position), then accept:
//!    - greedy (temperature 0): follow the drafts equal to the target argmax, then the argmax;
//!    - onehot (drafts chosen deterministically, as SGLang does): recursive rejection with q one-hot,
//!      child c accepted with probability p(c) of the residual, p(c) zeroed and p renormalised on
//!      rejection, the bonus sampled from the residual;
//!    - sampling (chain drafts sampled from q): accept with min(1, p/q), on rejection sample
//!      from norm(max(0, p − q)).
//!
//!    Both sampling rules leave the output distribution exactly the target's;
//! 4. the target cache keeps the accepted path, the drafter extends over it with the verify
//!    pass's aux features, and the next cycle starts from the bonus token.
//!
//! Every forward is timed: plain decode steps (T_d), verify passes by size (T_v(n)), drafter
//! forwards (extend and steps: T_s), whole cycles; [`DecodeTimings::costs`] turns them into a
//! costs file for `aerie project`.
//!
//! The modules, one concept each: [`DecodeOptions`] (what to decode, with aerie-model's
//! [`DraftShape`](aerie_model::drafter::shape::DraftShape)), the
//! [`SpecDecoder`] (prefill, draft, verify, cache updates of one answer), [`verify_draft`] (the
//! acceptance rules on the target's rows), [`DecodeTimings`] (every timed forward, and the costs
//! file they make), [`decode_prompts`] (a prompt file decoded both ways, reported) and
//! [`DecodeSession`] (a target, its prompt encoder and prompts, loaded once for many drafters).

mod decoder;
mod options;
mod run;
mod session;
mod timing;
mod verdict;

pub use decoder::{PlainAnswer, SpecAnswer, SpecDecoder};
pub use options::DecodeOptions;
pub use run::{
    BatchedPlain, DecodeReport, MeasuredCosts, PlainRun, PromptReport, Throughput, TurnReport, decode_prompts,
};
pub use session::{DecodeSession, SpeculativeTau, measured_costs};
pub use timing::{DecodeTimings, Timer};
pub use verdict::{Verdict, verify_draft};
