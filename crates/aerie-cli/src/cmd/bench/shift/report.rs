//! What `aerie bench shift` reports: each fine-tune's held-out τ on both domains, each method's
//! mean over seeds against plain's, and the markdown table the docs quote.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::method::{Method, Variant};
use crate::cmd::common::stages::StageTime;

/// Held-out τ of one drafter on both domains.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scores {
    /// Decoded τ on the chat domain's held-out answers (the quickstart's held-out samples).
    pub chat: f64,
    /// Decoded τ on held-out HumanEval answers.
    pub code: f64,
}

impl Scores {
    pub(super) fn mean(&self) -> f64 {
        (self.chat + self.code) / 2.0
    }
}

/// One fine-tune.
#[derive(Debug, Serialize)]
pub(super) struct Row {
    pub(super) variant: Variant,
    pub(super) seed: u64,
    pub(super) tau: Scores,
    /// Wall time of `aerie train` (with `[select]`, its decoding included).
    pub(super) train_seconds: f64,
    /// Optimizer steps and token positions of the run (the same for every method).
    pub(super) steps: u64,
    pub(super) tokens: f64,
    /// The drafter scored: the final checkpoint, or `best/` with `[select]`.
    pub(super) drafter: PathBuf,
}

/// A variant over its seeds.
#[derive(Debug, Serialize)]
pub(super) struct MethodSummary {
    pub(super) variant: Variant,
    pub(super) seeds: usize,
    pub(super) tau: Scores,
    /// Mean over seeds of each domain's τ relative to plain's (percent), and of their mean.
    pub(super) vs_plain_percent: Option<Scores>,
    pub(super) vs_plain_mean_percent: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) workdir: PathBuf,
    pub(super) k: usize,
    pub(super) warm_start: PathBuf,
    /// The warm start scored before any fine-tune.
    pub(super) warm_start_tau: Scores,
    /// Held-out answer tokens that are not the target's f32 argmax (0: the walk is exact).
    pub(super) captured_not_target_argmax: Scores,
    pub(super) code_train_samples: usize,
    pub(super) rows: Vec<Row>,
    pub(super) methods: Vec<MethodSummary>,
    pub(super) stages: Vec<StageTime>,
    pub(super) total_seconds: f64,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Each variant's mean over seeds, and its gain over plain's mean (percent).
pub(super) fn summarise(rows: &[Row], variants: &[Variant]) -> Vec<MethodSummary> {
    let of = |v: Variant| rows.iter().filter(move |r| r.variant == v);
    let avg = |v: Variant| Scores { chat: mean(of(v).map(|r| r.tau.chat)), code: mean(of(v).map(|r| r.tau.code)) };
    let plain = variants.iter().find(|v| v.method == Method::Plain).map(|&v| avg(v));
    variants
        .iter()
        .map(|&v| {
            let tau = avg(v);
            let pct = |x: f64, base: f64| 100.0 * (x / base - 1.0);
            MethodSummary {
                variant: v,
                seeds: of(v).count(),
                vs_plain_percent: plain
                    .as_ref()
                    .map(|p| Scores { chat: pct(tau.chat, p.chat), code: pct(tau.code, p.code) }),
                vs_plain_mean_percent: plain.as_ref().map(|p| pct(tau.mean(), p.mean())),
                tau,
            }
        })
        .collect()
}

/// The report as a markdown table (what docs/training.md quotes).
pub(super) fn table(r: &Report) -> String {
    let mut s = format!(
        "Decoded τ at k = {} (greedy verify cycles over the target's own held-out answers), warm start: chat {:.3}, code {:.3}\n\n\
         | method | seeds | τ chat | τ code | τ mean | vs plain (chat / code / mean) | per seed (chat / code) |\n|---|---:|---:|---:|---:|---|---|\n",
        r.k, r.warm_start_tau.chat, r.warm_start_tau.code
    );
    for m in &r.methods {
        let per: Vec<String> = r
            .rows
            .iter()
            .filter(|x| x.variant == m.variant)
            .map(|x| format!("s{}: {:.3} / {:.3}", x.seed, x.tau.chat, x.tau.code))
            .collect();
        let vs = match (&m.vs_plain_percent, m.vs_plain_mean_percent) {
            (Some(v), Some(mean)) => format!("{:+.1}% / {:+.1}% / {:+.1}%", v.chat, v.code, mean),
            _ => "-".into(),
        };
        s += &format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {} | {} |\n",
            m.variant.label(),
            m.seeds,
            m.tau.chat,
            m.tau.code,
            m.tau.mean(),
            vs,
            per.join("; ")
        );
    }
    s
}
