//! The JSON reports one subcommand writes and the quickstart reads back, as types: where both
//! sides are this crate (`eval loss --json`) they share [`EvalLossReport`], so a renamed field
//! is a compile error; where the quickstart reads a library's report from a file (`eval
//! decode`'s, `regenerate`'s), it reads the fields it needs through a type here, and a renamed
//! or missing field is an error naming the file and the field, never a NaN in the summary.

use std::collections::BTreeMap;
use std::path::Path;

use aerie_model::ttt::TttMetrics;
use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `aerie eval loss --json`: the held-out metrics and how they were computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalLossReport {
    /// The teacher-forced metrics.
    #[serde(flatten)]
    pub metrics: TttMetrics,
    /// Samples evaluated.
    pub samples: usize,
    /// Draft steps (`--ttt-length`).
    pub ttt_length: usize,
    /// `final-hidden` or `topk`.
    pub teacher: String,
}

/// What the quickstart reads of `aerie eval decode`'s report (`aerie_eval::decode::DecodeReport`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DecodeBrief {
    /// Accept length.
    pub tau: f64,
    /// Speculative over plain decode tokens/s.
    pub speedup: f64,
    /// Greedy: every speculative answer equals the plain one.
    #[serde(default)]
    pub greedy_identical: Option<bool>,
    /// Plain decoding.
    pub plain: ThroughputBrief,
    /// Speculative decoding.
    pub speculative: ThroughputBrief,
    /// The measured costs.
    pub costs: CostsBrief,
    /// `--plain-batch` runs only.
    #[serde(default)]
    pub plain_batched: Option<BatchedBrief>,
}

/// Of `aerie_eval::decode::Throughput`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ThroughputBrief {
    /// Tokens after the first, per decode second.
    pub decode_tokens_per_s: f64,
}

/// Of `aerie_eval::decode::MeasuredCosts`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CostsBrief {
    /// T_d: one plain decode step.
    pub t_d_ms: Option<f64>,
    /// T_v(n) by verified tokens n.
    pub t_v_ms: BTreeMap<usize, f64>,
}

/// Of `aerie_eval::decode::BatchedPlain`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BatchedBrief {
    /// All tokens per wall second.
    pub tokens_per_s: f64,
}

/// What the quickstart reads of `aerie regenerate`'s report
/// (`aerie_capture::regenerate::RegenerateReport`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RegenerateBrief {
    /// Records in the output file.
    pub records: u64,
    /// Tokens generated.
    pub tokens_generated: u64,
    /// `tokens_generated / seconds`.
    pub tokens_per_second: f64,
    /// Sequences decoded at once.
    pub batch_size: usize,
}

/// Parse `text`, the report read from `path`, as a `T`; an error names the file and the field.
pub fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    serde_json::from_str(text)
        .with_context(|| format!("{}: not the report aerie expects ({})", path.display(), std::any::type_name::<T>()))
}

/// Read the report at `path` as a `T` ([`parse`]).
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_field_is_an_error_naming_the_file_and_the_field() {
        let good = r#"{"tau": 1.5, "speedup": 1.2, "greedy_identical": true, "plain": {"decode_tokens_per_s": 10.0},
            "speculative": {"decode_tokens_per_s": 12.0}, "costs": {"t_d_ms": 8.0, "t_v_ms": {"2": 9.5}, "cycle_ms": 20.0},
            "answers": 3}"#;
        let d: DecodeBrief = parse(Path::new("decode-k1.json"), good).unwrap();
        assert_eq!((d.costs.t_v_ms[&2], d.plain_batched), (9.5, None));
        let renamed = good.replace("\"speedup\"", "\"speed_up\"");
        let e = format!("{:#}", parse::<DecodeBrief>(Path::new("decode-k1.json"), &renamed).unwrap_err());
        assert!(e.contains("decode-k1.json") && e.contains("speedup"), "{e}");
    }
}
