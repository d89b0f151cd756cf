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
    /// A draft vocabulary for both domains (`aerie vocab build CHAT --mix CODE`, each weighted
    /// alike) switched to at the warm start (`init.allow_vocab_override`: rows of ids in both
    /// maps kept, the new ones fresh), then plain distillation: the new domain's ids outside the
    /// old map can never be drafted otherwise.
    Vocab,
    /// The vocab method with replay (the first `--replay-weight`).
    #[serde(rename = "vocab-replay")]
    VocabReplay,
    /// The reference row: SpecForge 0.2.0's own trainer (`scripts/specforge_finetune.py`, the
    /// wheel's code) on the same shards and recipe; needs `--specforge-wheel` and a Python with
    /// torch (`--python`, default `$AERIE_PYTHON`).
    Specforge,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Plain => "plain",
            Method::Anchor => "anchor",
            Method::Replay => "replay",
            Method::Select => "select",
            Method::Combined => "combined",
            Method::Vocab => "vocab",
            Method::VocabReplay => "vocab-replay",
            Method::Specforge => "specforge",
        }
    }

    pub fn selects(self) -> bool {
        matches!(self, Method::Select | Method::Combined)
    }

    /// Whether it switches the warm start to the map of both domains.
    pub fn mixes_vocab(self) -> bool {
        matches!(self, Method::Vocab | Method::VocabReplay)
    }
}

/// One method at one setting of its weights: a row of the table, a run directory per seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Variant {
    pub method: Method,
    /// λ of `optim.anchor_weight` (anchor, combined).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchor_weight: Option<f64>,
    /// β of `optim.replay_weight` (replay, combined).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_weight: Option<f64>,
}

impl Variant {
    /// Every method at each of its weights: anchor once per λ, replay once per β, combined at
    /// the first λ and the first β (list the setting to combine first).
    pub fn all(methods: &[Method], anchors: &[f64], replays: &[f64]) -> Vec<Variant> {
        let v = |method, anchor_weight, replay_weight| Variant { method, anchor_weight, replay_weight };
        let mut out = Vec::new();
        for &m in methods {
            match m {
                Method::Plain | Method::Select | Method::Vocab | Method::Specforge => out.push(v(m, None, None)),
                Method::Anchor => out.extend(anchors.iter().map(|&l| v(m, Some(l), None))),
                Method::Replay => out.extend(replays.iter().map(|&b| v(m, None, Some(b)))),
                Method::Combined => out.push(v(m, anchors.first().copied(), replays.first().copied())),
                Method::VocabReplay => out.push(v(m, None, replays.first().copied())),
            }
        }
        out
    }

    /// The table's name for it, e.g. `anchor λ=0.1`.
    pub fn label(&self) -> String {
        let mut s = self.method.name().to_string();
        if let Some(l) = self.anchor_weight {
            s += &format!(" λ={l}");
        }
        if let Some(b) = self.replay_weight {
            s += &format!(" β={b}");
        }
        s
    }

    /// Its run directory's name for `seed`, e.g. `anchor-l0.1-s0`.
    pub fn run_name(&self, seed: u64) -> String {
        let mut s = self.method.name().to_string();
        if let Some(l) = self.anchor_weight {
            s += &format!("-l{l}");
        }
        if let Some(b) = self.replay_weight {
            s += &format!("-b{b}");
        }
        format!("{s}-s{seed}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_weight_is_its_own_variant_and_combined_takes_the_first() {
        let methods = [Method::Plain, Method::Anchor, Method::Combined, Method::VocabReplay];
        let all = Variant::all(&methods, &[0.01, 0.1], &[1.0]);
        let names: Vec<String> = all.iter().map(|v| v.run_name(0)).collect();
        assert_eq!(
            names,
            ["plain-s0", "anchor-l0.01-s0", "anchor-l0.1-s0", "combined-l0.01-b1-s0", "vocab-replay-b1-s0"]
        );
        assert_eq!(all[3].label(), "combined λ=0.01 β=1");
    }
}
