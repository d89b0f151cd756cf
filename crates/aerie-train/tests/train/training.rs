//! A short run learns, logs, evaluates and leaves a loadable drafter.

use aerie_model::checkpoint::load_drafter;

use crate::common::*;

#[test]
fn loss_decreases_over_thirty_steps() {
    let w = world();
    let mut cfg = config(&w, "run", "eval_every = 15\nsave_every = 10\nkeep_last = 2", "max_steps = 30");
    cfg.optim.lr = 5e-3;

    let t0 = std::time::Instant::now();
    let summary = run(&cfg, 1, None).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(summary.status, aerie_train::Status::Completed);
    assert_eq!(summary.steps, 30);
    let lines = metrics_lines(&cfg.output_dir);
    let train: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "train").collect();
    assert_eq!(train.len(), 30);
    // Per-step losses are noisy (3-sample batches); the held-out loss is not.
    let before = initial_held_out(&w, &cfg);
    let evals: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "eval").collect();
    assert_eq!(evals.iter().map(|e| e["step"].as_u64().unwrap()).collect::<Vec<_>>(), vec![15, 30]);
    let after = evals[1]["metrics"]["loss"].as_f64().unwrap();
    let (first, last) = (before.loss, after);
    assert!(last < 0.8 * first, "held-out loss did not decrease enough: {first:.4} before, {last:.4} after");
    let acc0 = evals[1]["metrics"]["acc_per_step"][0].as_f64().unwrap();
    assert!(acc0 > before.acc_per_step[0], "acc_0 {acc0} vs {} before", before.acc_per_step[0]);
    for key in [
        "step",
        "epoch",
        "loss",
        "loss_k",
        "acc_k",
        "alpha_k",
        "accept_length",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "elapsed_s",
    ] {
        assert!(!train[0][key].is_null(), "metrics line lacks `{key}`");
    }
    assert_eq!(train[0]["acc_k"].as_array().unwrap().len(), 7);
    // Warm-up: 3 steps (10% of 30), then cosine.
    assert!(train[0]["lr"].as_f64().unwrap() < train[2]["lr"].as_f64().unwrap());
    // Checkpoints 20 and 30 kept (keep_last = 2), each a drafter aerie loads.
    let names: Vec<String> =
        summary.checkpoints.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["checkpoint-20", "checkpoint-30"]);
    let ckpt = load_drafter(summary.final_checkpoint.as_ref().unwrap(), Some(&w.target_file)).unwrap();
    assert_eq!(ckpt.config.draft_vocab_size, VD);
    assert_eq!(ckpt.config.aux_layers.output_of_layer(), AUX.to_vec());
    let summary_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cfg.output_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary_json["status"], "completed");
    assert!(summary.tokens_per_s > 0.0);
    eprintln!(
        "30 steps in {secs:.2} s; {:.0} tokens/s (training time); held-out loss {first:.3} -> {last:.3}",
        summary.tokens_per_s
    );
}

#[test]
fn output_dir_of_an_existing_run_is_refused_and_incompatible_shards_are_named() {
    let w = world();
    let cfg = config(&w, "run", "", "max_steps = 2");
    run(&cfg, 1, None).unwrap();
    let e = run(&cfg, 1, None).unwrap_err().to_string();
    assert!(e.contains("already holds a run") && e.contains("--resume"), "{e}");

    // Shards from another aux layout.
    let other = w.path("other");
    let mut meta = metadata();
    meta.aux_layer_ids = vec![2, 4, 5];
    let mut wr = aerie_data::shard::ShardWriter::create(&other, meta, Default::default()).unwrap();
    let aux = vec![0.1f32; 4 * 3 * H];
    let fin = vec![0.1f32; 4 * H];
    wr.push(aerie_data::shard::SampleRef::new(&[1, 2, 3, 4], &[1, 1, 1, 1], &aux).with_final_hidden(&fin)).unwrap();
    wr.finish().unwrap();
    let mut cfg = config(&w, "run2", "", "max_steps = 2");
    cfg.data.train = vec![other.clone()];
    // With the world's eval set, the two datasets would not mix (another check, tested with
    // the CLI); alone, the data does not fit the drafter.
    cfg.data.eval.clear();
    let e = run(&cfg, 1, None).unwrap_err().to_string();
    assert!(e.contains(&other.display().to_string()) && e.contains("aux layers differ"), "{e}");
}

/// `precision = "bf16"`: the same run in bf16 activations starts at the f32 run's loss (same
/// weights and batch, only the arithmetic differs: bf16 keeps 8 bits of mantissa, so a few
/// tenths of a percent per op, 2% allowed), learns as much (held-out loss within 5% of f32's after
/// 30 steps) and saves float32 weights.
#[test]
fn bf16_compute_learns_over_f32_master_weights() {
    let w = world();
    let run_with = |precision: &str, steps: u64| {
        let out = format!("{precision}-{steps}");
        let mut cfg = config(&w, &out, &format!("precision = \"{precision}\""), &format!("max_steps = {steps}"));
        cfg.optim.lr = 5e-3;
        let summary = run(&cfg, 1, None).unwrap();
        assert_eq!(summary.status, aerie_train::Status::Completed);
        let lines = metrics_lines(&cfg.output_dir);
        let first = lines.iter().find(|l| l["kind"] == "train").map(|l| l["loss"].as_f64().unwrap());
        let eval = lines.iter().rfind(|l| l["kind"] == "eval").unwrap()["metrics"]["loss"].as_f64().unwrap();
        (first, eval, summary.final_checkpoint.unwrap())
    };
    let (_, eval0, _) = run_with("f32", 0);
    let (first32, eval32, _) = run_with("f32", 30);
    let (first16, eval16, ckpt) = run_with("bf16", 30);
    let (first32, first16) = (first32.unwrap(), first16.unwrap());
    assert!((first16 - first32).abs() <= 0.02 * first32, "first-step loss: bf16 {first16} vs f32 {first32}");
    assert!(eval16 <= 1.05 * eval32, "held-out loss after 30 steps: bf16 {eval16} vs f32 {eval32}");
    assert!(eval16 < 0.8 * eval0, "bf16 did not learn: held-out loss {eval0} -> {eval16}");
    let saved = load_drafter(&ckpt, Some(&w.target_file)).unwrap();
    assert_eq!(saved.tensors["fc.weight"].dtype, aerie_model::checkpoint::Dtype::F32);
}
