//! `aerie bench ttt`: one tiny step per precision, checking the JSON report a script reads.

mod common;
use common::{aerie, ok_json};

#[test]
fn bench_ttt_reports_each_precision() {
    let mut tokens_per_s = Vec::new();
    for precision in ["f32", "bf16"] {
        let args = [
            "bench",
            "ttt",
            "--seq-len",
            "16",
            "--ttt-length",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--precision",
            precision,
            "--json",
        ];
        let rep = ok_json(aerie(&args));
        assert_eq!(rep["precision"], precision);
        assert_eq!(rep["shape"], "smollm2-135m");
        assert_eq!((rep["seq_len"].as_u64(), rep["ttt_length"].as_u64()), (Some(16), Some(2)));
        assert_eq!(rep["backward"], true);
        assert_eq!(rep["step_seconds"].as_array().map(Vec::len), Some(1));
        // fwd+bwd = 3 × the forward's matmul FLOPs, whatever the dtype.
        assert!(rep["flops_per_token"].as_f64().unwrap() > 3.0 * 2.0 * 135e6 * 0.1);
        tokens_per_s.push(rep["tokens_per_second"].as_f64().unwrap());
    }
    assert!(tokens_per_s.iter().all(|t| t.is_finite() && *t > 0.0), "{tokens_per_s:?}");
}

/// `aerie bench train`: the drafter, K, loss and L a training config describes, from only its
/// target `config.json` and vocab file (no weights, no shards on disk).
#[test]
fn bench_train_measures_the_configs_drafter() {
    use aerie_model::checkpoint::HostTensor;
    use aerie_model::checkpoint::io::write_safetensors;
    use aerie_model::checkpoint::synthetic::vocab_map;

    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 8,
        "vocab_size": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512
    });
    std::fs::write(target.join("config.json"), cfg.to_string()).unwrap();
    let (d2t, t2d) = vocab_map(128, 32, 3);
    let vocab = dir.path().join("vocab.safetensors");
    let (d, t) = (HostTensor::from_i64(vec![32], &d2t), HostTensor::from_bool(vec![128], &t2d));
    write_safetensors(&vocab, [("d2t", &d), ("t2d", &t)]).unwrap();
    let config = dir.path().join("tiny-recipe.toml");
    let text = format!(
        "output_dir = \"{}\"\nloss = \"tv\"\nttt_length = 3\n\n[data]\ntrain = [\"{}\"]\nmax_length = 24\n\n[init]\nkind = \"fresh\"\ntarget_config = \"{}\"\nvocab = \"{}\"\n",
        common::s(&dir.path().join("run")),
        common::s(&dir.path().join("shards")),
        common::s(&target.join("config.json")),
        common::s(&vocab),
    );
    std::fs::write(&config, text).unwrap();
    let args = ["bench", "train", common::s(&config), "--steps", "1", "--warmup", "0", "--json"];
    let rep = ok_json(aerie(&args));
    assert_eq!(rep["shape"], "tiny-recipe");
    assert_eq!((rep["seq_len"].as_u64(), rep["ttt_length"].as_u64()), (Some(24), Some(3)));
    assert_eq!((rep["loss"].as_str(), rep["precision"].as_str()), (Some("tv"), Some("f32")));
    assert_eq!(rep["embed_rows"], 128);
    let k = |key: &str| rep.as_object().unwrap().contains_key(key);
    for key in ["backend", "batch", "threads", "trainable_params", "median_step_seconds", "median_step_cpu_seconds"] {
        assert!(k(key), "{key} missing: {rep}");
    }
    assert!(rep["tokens_per_second"].as_f64().unwrap() > 0.0 && rep["achieved_gflops"].as_f64().unwrap() > 0.0);
    assert_eq!(rep["replay_weight"], 0.0);
    // A recipe with on-policy replay times the step with its walk and term, as training runs it
    // (the replay term needs the soft-CE).
    let rep = ok_json(aerie(&[
        "bench",
        "train",
        common::s(&config),
        "--set",
        "loss=soft_ce",
        "--set",
        "optim.replay_weight=1",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--json",
    ]));
    assert_eq!((rep["replay_weight"].as_f64(), rep["loss"].as_str()), (Some(1.0), Some("soft_ce")));
    assert!(rep["tokens_per_second"].as_f64().unwrap() > 0.0);
    // `--seq-len` overrides the config's `data.max_length`; a bad key is named with its file.
    let rep = ok_json(aerie(&[
        "bench",
        "train",
        common::s(&config),
        "--seq-len",
        "8",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--json",
    ]));
    assert_eq!(rep["seq_len"], 8);
    let out = aerie(&["bench", "train", common::s(&config), "--set", "ttt_lenght=2", "--json"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ttt_lenght"), "{err}");
}
