//! On-policy replay (`optim.replay_weight`): off by default and then bit for bit today's run;
//! on, the objective gains the replay term and `metrics.jsonl` the share of cycle starts; exact
//! under micro-batching and data parallelism; refused with the TV and LK objectives.

use std::path::Path;

use aerie_train::TrainConfig;
use aerie_train::config::fingerprint::{fingerprint, hash};

use crate::common::*;

/// The soft-CE of a `train` line from its per-step losses (weights 0.8^k).
fn soft_ce(line: &serde_json::Value) -> f64 {
    let loss_k = line["loss_k"].as_array().unwrap();
    loss_k.iter().enumerate().map(|(k, l)| 0.8f64.powi(k as i32) * l.as_f64().unwrap()).sum()
}

fn train_lines(cfg: &TrainConfig) -> Vec<serde_json::Value> {
    metrics_lines(&cfg.output_dir).into_iter().filter(|l| l["kind"] == "train").collect()
}

#[test]
fn a_zero_replay_weight_is_todays_run_bit_for_bit() {
    let w = world();
    let plain = config(&w, "plain", "", "max_steps = 3");
    let zero = config(&w, "zero", "", "max_steps = 3\nreplay_weight = 0.0");
    assert_eq!(hash(&fingerprint(&plain)), hash(&fingerprint(&zero)), "an explicit 0 changes the config hash");
    assert!(!zero.to_toml().contains("replay_weight"), "{}", zero.to_toml());
    let a = run(&plain, 1, None).unwrap();
    let b = run(&zero, 1, None).unwrap();
    assert!(tensors(a.final_checkpoint.as_ref().unwrap()) == tensors(b.final_checkpoint.as_ref().unwrap()));
    assert_eq!(a.config_hash, b.config_hash);
    let lines = train_lines(&zero);
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert!(l.get("replay_starts").is_none(), "{l}");
        // Without replay the objective is the soft-CE its per-step losses give.
        let (loss, ce) = (l["loss"].as_f64().unwrap(), soft_ce(l));
        assert!((loss - ce).abs() <= 1e-5 * ce, "{loss} vs {ce}");
    }
}

#[test]
fn a_replay_run_adds_its_term_and_logs_the_cycle_starts() {
    let w = world();
    let cfg = config(&w, "replay", "", "max_steps = 6\nreplay_weight = 1.0");
    assert!(cfg.to_toml().contains("replay_weight = 1.0"), "{}", cfg.to_toml());
    let plain = config(&w, "plain", "", "max_steps = 6");
    assert_ne!(hash(&fingerprint(&cfg)), hash(&fingerprint(&plain)));
    let s = run(&cfg, 1, None).unwrap();
    assert_eq!(s.steps, 6);
    let lines = train_lines(&cfg);
    assert_eq!(lines.len(), 6);
    for l in &lines {
        let starts = l["replay_starts"].as_f64().unwrap();
        // Every start is a pm position; a walk starts at least once per answer, and a drafter
        // that accepts little starts a cycle at most positions.
        assert!(starts > 0.0 && starts <= 1.0, "{l}");
        // `loss` is the soft-CE plus β times the cross-entropy replayed at the cycle starts: no
        // more than the soft-CE again (each position's steps are replayed at most once).
        let (loss, ce) = (l["loss"].as_f64().unwrap(), soft_ce(l));
        assert!(loss > ce * (1.0 + 1e-4) && loss <= 2.0 * ce * (1.0 + 1e-5), "loss {loss} vs soft-CE {ce}");
    }
    // The first step's drafter is the fresh one in both runs: same soft-CE, only the term differs.
    run(&plain, 1, None).unwrap();
    let p0 = &train_lines(&plain)[0];
    assert!((soft_ce(p0) - soft_ce(&lines[0])).abs() <= 1e-6 * soft_ce(p0));
}

#[test]
fn replay_is_exact_across_micro_batches_and_replicas() {
    let w = world();
    let body = "max_steps = 4\nreplay_weight = 0.5";
    // 1 replica × 2 accumulated micro-batches == 2 replicas × 1, bit for bit: each micro-batch
    // walks its own sequences and is normalised by the whole step's positions.
    let acc2 = run(&config(&w, "acc2", "", &format!("{body}\ngrad_accumulation = 2")), 1, None).unwrap();
    let dp2 = run(&config(&w, "dp2", "", body), 2, None).unwrap();
    let (a, d) = (tensors(acc2.final_checkpoint.as_ref().unwrap()), tensors(dp2.final_checkpoint.as_ref().unwrap()));
    assert!(a == d, "2 micro-batches and 2 replicas trained different weights");
    let off = run(&config(&w, "off", "", "max_steps = 4\ngrad_accumulation = 2"), 1, None).unwrap();
    assert!(tensors(off.final_checkpoint.as_ref().unwrap()) != a, "the replay term changed nothing");
}

#[test]
fn replay_outside_the_soft_ce_is_refused_naming_the_key() {
    let w = world();
    for loss in ["tv", "lk"] {
        let text = config_text(&w, "x", &format!("loss = \"{loss}\""), "replay_weight = 0.5");
        let e = TrainConfig::from_toml_str(&text, Path::new("replay.toml"), &[]).unwrap_err().to_string();
        assert!(e.contains("replay.toml") && e.contains("optim.replay_weight") && e.contains("soft_ce"), "{e}");
        // Off, the other objectives are as before.
        let text = config_text(&w, "x", &format!("loss = \"{loss}\""), "replay_weight = 0.0");
        TrainConfig::from_toml_str(&text, Path::new("replay.toml"), &[]).unwrap();
    }
    for bad in ["-1.0", "nan", "inf"] {
        let text = config_text(&w, "x", "", &format!("replay_weight = {bad}"));
        let e = TrainConfig::from_toml_str(&text, Path::new("replay.toml"), &[]).unwrap_err().to_string();
        assert!(e.contains("optim.replay_weight") && e.contains("non-negative"), "{bad}: {e}");
    }
}
