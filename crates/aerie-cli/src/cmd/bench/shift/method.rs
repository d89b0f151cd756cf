//! The fine-tuning methods `aerie bench shift` compares, each a set of training-config switches.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// A fine-tuning method of the benchmark: which switches of the training config it sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Plain EAGLE-3 distillation from the warm start (the reference trainers' recipe).
    Plain,
    /// `optim.anchor_weight`: L2-SP toward the warm start's weights.
    Anchor,
    /// `optim.replay_weight`: the positions greedy decoding drafts from weigh more.
    Replay,
    /// `[select]`: the checkpoint of the best decoded τ on selection prompts of both domains.
    Select,
    /// Anchor, replay and select together.
    Combined,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Plain => "plain",
            Method::Anchor => "anchor",
            Method::Replay => "replay",
            Method::Select => "select",
            Method::Combined => "combined",
        }
    }

    pub fn anchors(self) -> bool {
        matches!(self, Method::Anchor | Method::Combined)
    }

    pub fn replays(self) -> bool {
        matches!(self, Method::Replay | Method::Combined)
    }

    pub fn selects(self) -> bool {
        matches!(self, Method::Select | Method::Combined)
    }
}
