//! L2-SP anchoring (`optim.anchor_weight`): off by default and then bit for bit today's run; on,
//! the drafter ends closer to its warm start; exact under data parallelism and resume; refused
//! without a warm start.

use std::path::{Path, PathBuf};

use aerie_model::checkpoint::{Dtype, SaveOptions, save_drafter, synthetic};
use aerie_train::TrainConfig;
use aerie_train::config::fingerprint::{fingerprint, hash};

use crate::common::*;

/// A drafter directory for the world's target with the world's vocab map (seed 3), so the warm
/// start needs no override.
fn warm_start_dir(w: &World) -> PathBuf {
    let dir = w.path("warm-start");
    if dir.exists() {
        return dir;
    }
    let mut cfg = synthetic::tiny_config();
    (cfg.hidden_size, cfg.target_hidden_size, cfg.intermediate_size) = (H, H, 64);
    (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) = (4, 2, 8);
    (cfg.vocab_size, cfg.draft_vocab_size) = (V, VD);
    cfg.aux_layers.ids = AUX.to_vec();
    let mut ckpt = synthetic::random_drafter(&cfg, Dtype::F32, 11);
    ckpt.tensors.remove("embed_tokens.weight");
    let (d2t, t2d) = synthetic::vocab_map(V, VD, 3);
    ckpt.tensors.insert("d2t".into(), aerie_model::checkpoint::HostTensor::from_i64(vec![VD], &d2t));
    ckpt.tensors.insert("t2d".into(), aerie_model::checkpoint::HostTensor::from_bool(vec![V], &t2d));
    save_drafter(&ckpt, &dir, &SaveOptions::default()).unwrap();
    dir
}

fn anchored_text(w: &World, out: &str, top: &str, optim: &str) -> String {
    let text = config_text(w, out, top, optim);
    let start = text.find("[init]").unwrap();
    let end = text.find("[target]").unwrap();
    let init = format!("[init]\nkind = \"warm_start\"\ndrafter = \"{}\"\n\n", warm_start_dir(w).display());
    format!("{}{init}{}", &text[..start], &text[end..])
}

fn anchored(w: &World, out: &str, top: &str, optim: &str) -> TrainConfig {
    TrainConfig::from_toml_str(&anchored_text(w, out, top, optim), Path::new("anchored.toml"), &[]).unwrap()
}

/// Σ‖θ − θ₀‖² between a checkpoint and the warm start, over the trainable float tensors.
fn distance_to_warm_start(w: &World, ckpt: &Path) -> f64 {
    let warm = tensors(&warm_start_dir(w));
    let now = tensors(ckpt);
    let mut total = 0.0;
    for (name, bytes) in &now {
        if name == "d2t" || name == "t2d" {
            continue;
        }
        let (_, w0) = warm.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not in the warm start"));
        total += f32s(bytes).iter().zip(f32s(w0)).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
    }
    total
}

#[test]
fn a_zero_anchor_weight_is_todays_run_bit_for_bit() {
    let w = world();
    let plain = anchored(&w, "plain", "", "max_steps = 3");
    let zero = anchored(&w, "zero", "", "max_steps = 3\nanchor_weight = 0.0");
    assert_eq!(hash(&fingerprint(&plain)), hash(&fingerprint(&zero)), "an explicit 0 changes the config hash");
    assert!(!zero.to_toml().contains("anchor_weight"), "{}", zero.to_toml());
    let a = run(&plain, 1, None).unwrap();
    let b = run(&zero, 1, None).unwrap();
    assert!(tensors(a.final_checkpoint.as_ref().unwrap()) == tensors(b.final_checkpoint.as_ref().unwrap()));
    assert!(metrics_lines(&zero.output_dir).iter().all(|l| l.get("anchor_penalty").is_none()));
}

#[test]
fn a_large_anchor_weight_keeps_the_drafter_near_its_warm_start() {
    let w = world();
    let (free_cfg, held_cfg) =
        (anchored(&w, "free", "", "max_steps = 8"), anchored(&w, "held", "", "max_steps = 8\nanchor_weight = 1000.0"));
    let free = run(&free_cfg, 1, None).unwrap();
    let held = run(&held_cfg, 1, None).unwrap();
    let d_free = distance_to_warm_start(&w, free.final_checkpoint.as_ref().unwrap());
    let d_held = distance_to_warm_start(&w, held.final_checkpoint.as_ref().unwrap());
    assert!(d_free > 0.0);
    assert!(d_held < 0.5 * d_free, "anchored {d_held} vs free {d_free}");
    // The penalty is logged: 0 at step 1 (θ = θ₀), positive once the weights moved, and equal to
    // λ/2 times the distance the weights had at that step.
    let lines = metrics_lines(&held_cfg.output_dir);
    let penalties: Vec<f64> =
        lines.iter().filter(|l| l["kind"] == "train").map(|l| l["anchor_penalty"].as_f64().unwrap()).collect();
    assert_eq!(penalties.len(), 8);
    assert_eq!(penalties[0], 0.0);
    assert!(penalties[1..].iter().all(|&p| p > 0.0), "{penalties:?}");
    assert!(metrics_lines(&free_cfg.output_dir).iter().all(|l| l.get("anchor_penalty").is_none()));
}

#[test]
fn an_anchor_without_a_warm_start_is_refused_naming_the_file() {
    let w = world();
    let text = config_text(&w, "fresh", "", "anchor_weight = 0.1");
    let e = TrainConfig::from_toml_str(&text, Path::new("fresh.toml"), &[]).unwrap_err().to_string();
    assert!(e.contains("fresh.toml") && e.contains("optim.anchor_weight") && e.contains("warm_start"), "{e}");
    let text = anchored_text(&w, "neg", "", "anchor_weight = -1.0");
    let e = TrainConfig::from_toml_str(&text, Path::new("neg.toml"), &[]).unwrap_err().to_string();
    assert!(e.contains("neg.toml") && e.contains("non-negative"), "{e}");
}

#[test]
fn an_anchored_run_is_exact_across_replicas_and_resume() {
    let w = world();
    let body = "max_steps = 5\nanchor_weight = 10.0";
    // 2 replicas × 1 micro-batch == 1 replica × 2 accumulated, bit for bit: the pull is added once.
    let acc2 = run(&anchored(&w, "acc2", "", &format!("{body}\ngrad_accumulation = 2")), 1, None).unwrap();
    let dp2 = run(&anchored(&w, "dp2", "", body), 2, None).unwrap();
    assert!(tensors(acc2.final_checkpoint.as_ref().unwrap()) == tensors(dp2.final_checkpoint.as_ref().unwrap()));

    // Stopped after step 3 (checkpoint at 2) and resumed: θ₀ is reloaded from the warm start.
    let straight = run(&anchored(&w, "straight", "save_every = 2", body), 1, None).unwrap();
    let broken = anchored(&w, "broken", "save_every = 2", body);
    assert_eq!(run_until(&broken, 3).steps, 3);
    let state = std::fs::read_to_string(broken.output_dir.join("checkpoint-2/training_state/state.json")).unwrap();
    assert!(state.contains("anchor_checksum"), "{state}");
    let resumed = run(&broken, 1, Some(&broken.output_dir)).unwrap();
    assert_eq!(resumed.steps, 5);
    assert!(
        tensors(straight.final_checkpoint.as_ref().unwrap()) == tensors(resumed.final_checkpoint.as_ref().unwrap()),
        "an anchored resume changed the final weights"
    );

    // A warm start whose weights changed on disk is refused on resume.
    let again = anchored(&w, "again", "save_every = 2", body);
    assert_eq!(run_until(&again, 3).steps, 3);
    let mut ckpt = aerie_model::checkpoint::load_drafter(&warm_start_dir(&w), None).unwrap();
    ckpt.tensors.insert(
        "fc.weight".into(),
        synthetic::random_drafter(&ckpt.config, Dtype::F32, 12).tensors.remove("fc.weight").unwrap(),
    );
    let opts = SaveOptions { overwrite: true, ..SaveOptions::default() };
    save_drafter(&ckpt, &warm_start_dir(&w), &opts).unwrap();
    let e = run(&again, 1, Some(&again.output_dir)).unwrap_err().to_string();
    assert!(e.contains("anchor") && e.contains("checksum"), "{e}");
}
