//! End-to-end tests of the `aerie` binary on data it can check exactly: a tiny drafter and
//! capture shards written here, evaluated by `aerie eval loss` and compared with the
//! straightforward f64 reference implementation; inspect/export round trips on the same drafter.
//!
//! Tolerance: 1e-5 relative (the burn forward runs in f32; see crates/aerie-model/tests/ttt.rs).

#[path = "../crates/aerie-model/tests/reference/mod.rs"]
mod reference;

use std::path::Path;
use std::process::Command;

use aerie_data::shard::{
    AuxConvention, HiddenDtype, SampleRef, ShardMetadata, ShardWriter, ShardWriterOptions, Teacher,
};
use aerie_model::checkpoint::io::write_safetensors;
use aerie_model::checkpoint::{Dialect, DrafterCheckpoint, Dtype, HostTensor, SaveOptions, save_drafter};
use reference::{
    RefSequence, random_sequence, random_tiny_checkpoint, ref_metrics, ref_teacher_from_hidden, ref_ttt, tiny_config,
};
use serde_json::Value;

fn aerie(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_aerie")).args(args).output().expect("run aerie");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

struct Fixture {
    _dir: tempfile::TempDir,
    drafter: String,
    shards: String,
    head: String,
    seqs: Vec<RefSequence>,
    root: std::path::PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let cfg = tiny_config();
    let weights = random_tiny_checkpoint(&cfg, 11);
    let drafter = root.join("drafter");
    let ckpt = DrafterCheckpoint {
        config: cfg.clone(),
        dialect: Dialect::Sglang,
        weight_dtype: Dtype::F32,
        tensors: weights,
        dir: Default::default(),
        source: None,
    };
    save_drafter(&ckpt, &drafter, &SaveOptions { include_embedding: true, ..Default::default() }).unwrap();

    // Three sequences of different lengths: eval batches them with right padding.
    let seqs: Vec<RefSequence> =
        [9, 5, 7].iter().enumerate().map(|(i, &n)| random_sequence(&cfg, n, 100 + i as u64)).collect();
    let head = &seqs[0].target_lm_head;
    let head_values: Vec<f32> = head.iter().flatten().map(|&x| x as f32).collect();
    let head_path = root.join("head.safetensors");
    let head_tensor = HostTensor::from_f32(vec![cfg.vocab_size, cfg.target_hidden_size], &head_values, Dtype::F32);
    write_safetensors(&head_path, [("lm_head.weight", &head_tensor)]).unwrap();

    let meta = ShardMetadata {
        target: "tiny-target".into(),
        target_num_layers: 8,
        target_vocab_size: cfg.vocab_size,
        aux_layer_ids: cfg.aux_layers.ids.clone(),
        aux_convention: AuxConvention::OutputOfLayer,
        hidden_size: cfg.target_hidden_size,
        dtype: HiddenDtype::F32,
        tokenizer_digest: "0".repeat(64),
        chat_template: "none".into(),
        teacher: Teacher::FinalHidden,
        created_by: "aerie e2e test".into(),
        extra: Default::default(),
    };
    let shards = root.join("shards");
    let mut w = ShardWriter::create(&shards, meta, ShardWriterOptions { shard_tokens: 12, checksums: true }).unwrap();
    for (i, s) in seqs.iter().enumerate() {
        let ids: Vec<i32> = s.ids.iter().map(|&t| t as i32).collect();
        let mask: Vec<u8> = s.loss_mask.iter().map(|&m| m as u8).collect();
        let aux: Vec<f32> = s.aux.iter().flatten().map(|&x| x as f32).collect();
        let fin: Vec<f32> = s.final_hidden.iter().flatten().map(|&x| x as f32).collect();
        let mut r = SampleRef::new(&ids, &mask, aux.as_slice()).with_final_hidden(fin.as_slice());
        r.sample_id = Some(i as i64);
        w.push(r).unwrap();
    }
    w.finish().unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    Fixture { drafter: s(&drafter), shards: s(&shards), head: s(&head_path), seqs, root, _dir: dir }
}

#[test]
fn eval_loss_matches_the_reference_with_padding_gqa_and_k7() {
    let f = fixture();
    let cfg = tiny_config();
    let weights = random_tiny_checkpoint(&cfg, 11);
    let head = &f.seqs[0].target_lm_head;
    let refs: Vec<_> = f
        .seqs
        .iter()
        .map(|s| {
            ref_ttt(&cfg, &weights, &s.ids, &s.loss_mask, &s.aux, &ref_teacher_from_hidden(&s.final_hidden, head), 7)
        })
        .collect();
    let want = ref_metrics(&refs, 21);
    for batch in ["3", "1"] {
        let (code, out, err) = aerie(&[
            "eval",
            "loss",
            "--drafter",
            &f.drafter,
            "--data",
            &f.shards,
            "--target-head",
            &f.head,
            "--ttt-length",
            "7",
            "--batch-size",
            batch,
            "--json",
        ]);
        assert_eq!(code, 0, "eval loss failed: {err}");
        let got: Value = serde_json::from_str(out.trim()).unwrap();
        assert!(
            close(got["loss"].as_f64().unwrap(), want.loss),
            "batch {batch}: loss {} vs {}",
            got["loss"],
            want.loss
        );
        for (name, w) in
            [("loss_per_step", &want.loss_k), ("acc_per_step", &want.acc_k), ("accept_rate_per_step", &want.alpha_k)]
        {
            let g: Vec<f64> = got[name].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            assert_eq!(g.len(), 7, "{name} has one entry per step");
            for k in 0..7 {
                assert!(close(g[k], w[k]), "batch {batch}: {name}[{k}] = {} vs reference {}", g[k], w[k]);
            }
        }
        assert!(close(got["simulated_accept_length"].as_f64().unwrap(), want.simulated_accept_length));
        let tokens: f64 = refs.iter().map(|r| r.m_count[0]).sum();
        assert_eq!(got["tokens"].as_f64().unwrap(), tokens);
    }
}

#[test]
fn export_round_trips_and_inspect_lints() {
    let f = fixture();
    let (code, out, err) = aerie(&["inspect", &f.drafter, "--json"]);
    assert_eq!(code, 0, "clean drafter inspects clean: {err}{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["aux"]["output_of_layer"], serde_json::json!([1, 3, 5]));
    assert_eq!(report["aux"]["input_of_layer"], serde_json::json!([2, 4, 6]));

    let spec = f.root.join("spec").to_string_lossy().into_owned();
    let back = f.root.join("back").to_string_lossy().into_owned();
    // A drafter that names no target cannot be exported for speculators/vLLM, which load the
    // verifier from the config: refused, naming --target. Recording the target fixes it.
    let (code, _, err) = aerie(&["export", &f.drafter, "--to", "speculators", "--out", &spec, "--include-embedding"]);
    assert!(code != 0 && err.contains("--target"), "{err}");
    let cfg_path = Path::new(&f.drafter).join("config.json");
    let mut named: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    named["target_name_or_path"] = Value::from("tiny-target");
    std::fs::write(&cfg_path, named.to_string()).unwrap();
    assert_eq!(aerie(&["export", &f.drafter, "--to", "speculators", "--out", &spec, "--include-embedding"]).0, 0);
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&spec).join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["speculators_model_type"], "eagle3");
    assert_eq!(cfg["eagle_aux_hidden_state_layer_ids"], serde_json::json!([2, 4, 6]));
    assert_eq!(cfg["norm_before_residual"], false);
    assert_eq!(cfg["speculators_config"]["verifier"]["name_or_path"], "tiny-target");
    assert_eq!(aerie(&["export", &spec, "--to", "sglang", "--out", &back, "--include-embedding"]).0, 0);
    let a = std::fs::read(Path::new(&f.drafter).join("model.safetensors")).unwrap();
    let b = std::fs::read(Path::new(&back).join("model.safetensors")).unwrap();
    assert_eq!(a, b, "SGLang → speculators → SGLang is bit-identical");

    // A reduced vocabulary without d2t is the classic silent failure: inspect exits 2.
    let broken = f.root.join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::copy(Path::new(&f.drafter).join("config.json"), broken.join("config.json")).unwrap();
    let ckpt = aerie_model::checkpoint::load_drafter(Path::new(&f.drafter), None).unwrap();
    let kept: Vec<(&String, &HostTensor)> =
        ckpt.tensors.iter().filter(|(k, _)| k.as_str() != "d2t" && k.as_str() != "t2d").collect();
    write_safetensors(&broken.join("model.safetensors"), kept).unwrap();
    let (code, out, _) = aerie(&["inspect", &broken.to_string_lossy(), "--json"]);
    assert_eq!(code, 2);
    assert!(out.contains("reduced-vocab-without-d2t") || out.contains("d2t"), "{out}");
}

#[test]
fn eval_loss_refuses_shards_of_another_aux_layout() {
    let f = fixture();
    let other = f.root.join("other");
    std::fs::create_dir(&other).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&f.drafter).join("config.json")).unwrap()).unwrap();
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([1, 2, 5]);
    std::fs::write(other.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(Path::new(&f.drafter).join("model.safetensors"), other.join("model.safetensors")).unwrap();
    let (code, _, err) = aerie(&[
        "eval",
        "loss",
        "--drafter",
        &other.to_string_lossy(),
        "--data",
        &f.shards,
        "--target-head",
        &f.head,
        "--json",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("aux layers differ"), "{err}");
}
