//! A short run learns, logs, evaluates and leaves a loadable drafter.

use aerie_model::checkpoint::load_drafter;

use crate::common::*;

#[test]
fn loss_decreases_over_thirty_steps() {
    let w = world();
    let cfg = config(&w, "run", "eval_every = 15\nsave_every = 10\nkeep_last = 2", "max_steps = 30");
    let t0 = std::time::Instant::now();
    let summary = run(&cfg, 1, None).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(summary.status, aerie_train::Status::Completed);
    assert_eq!(summary.steps, 30);
    let lines = metrics_lines(&cfg.output_dir);
    let train: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "train").collect();
    assert_eq!(train.len(), 30);
    let loss = |i: usize| train[i]["loss"].as_f64().unwrap();
    let first: f64 = (0..5).map(loss).sum::<f64>() / 5.0;
    let last: f64 = (25..30).map(loss).sum::<f64>() / 5.0;
    assert!(last < 0.8 * first, "loss did not decrease enough: first {first:.4}, last {last:.4}");
    for key in ["step", "epoch", "loss", "loss_k", "acc_k", "alpha_k", "accept_length", "lr", "grad_norm", "tokens_per_s", "elapsed_s"] {
        assert!(!train[0][key].is_null(), "metrics line lacks `{key}`");
    }
    assert_eq!(train[0]["acc_k"].as_array().unwrap().len(), 7);
    // Warm-up: 3 steps (10% of 30), then cosine.
    assert!(train[0]["lr"].as_f64().unwrap() < train[2]["lr"].as_f64().unwrap());
    let evals: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "eval").collect();
    assert_eq!(evals.iter().map(|e| e["step"].as_u64().unwrap()).collect::<Vec<_>>(), vec![15, 30]);
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
        "30 steps in {secs:.2} s; {:.0} tokens/s (training time), last loss {last:.3} from {first:.3}",
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
    let e = run(&cfg, 1, None).unwrap_err().to_string();
    assert!(e.contains(&other.display().to_string()) && e.contains("aux layers differ"), "{e}");
}
