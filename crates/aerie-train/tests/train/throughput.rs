//! Throughput of a SmolLM2-135M-shaped drafter (H 576, 9/3 heads of 64, I 1536, V 49152,
//! Vd 8192, K 7) on synthetic captures. Ignored by default (about a minute on 2 cores); run with
//! `cargo test -p aerie-train --test train throughput -- --ignored --nocapture`.
//! `AERIE_TRAIN_DEVICES=2` runs two replicas (sequential on the CPU).

use aerie_data::shard::{SampleRef, ShardWriter};
use aerie_model::checkpoint::io::write_safetensors;
use aerie_model::checkpoint::{Dtype, HostTensor, synthetic};

use crate::common::*;

#[test]
#[ignore]
fn smollm2_shape_tokens_per_second() {
    let (h, v, vd, layers) = (576usize, 49152usize, 8192usize, 30usize);
    let root = tempfile::tempdir().unwrap();
    let p = |n: &str| root.path().join(n);
    std::fs::create_dir_all(p("target")).unwrap();
    let cfg = serde_json::json!({
        "hidden_size": h, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "num_hidden_layers": layers, "vocab_size": v, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "max_position_embeddings": 8192
    });
    std::fs::write(p("target/config.json"), cfg.to_string()).unwrap();
    let mut rng = Rng(1);
    let e: Vec<f32> = (0..v * h).map(|_| 0.05 * rng.signed_unit()).collect();
    let head = HostTensor::from_f32(vec![v, h], &e, Dtype::F32);
    write_safetensors(&p("target.safetensors"), [("embed_tokens.weight", &head), ("lm_head.weight", &head)]).unwrap();
    let (d2t, t2d) = synthetic::vocab_map(v, vd, 2);
    let (d, t) = (HostTensor::from_i64(vec![vd], &d2t), HostTensor::from_bool(vec![v], &t2d));
    write_safetensors(&p("vocab.safetensors"), [("d2t", &d), ("t2d", &t)]).unwrap();
    let mut meta = metadata();
    meta.hidden_size = h;
    meta.target_vocab_size = v;
    meta.target_num_layers = layers;
    meta.aux_layer_ids = vec![1, 14, 26];
    let mut w = ShardWriter::create(p("train"), meta, Default::default()).unwrap();
    let len = 256;
    for i in 0..24 {
        let ids: Vec<i32> = (0..len).map(|_| (rng.next_u64() % v as u64) as i32).collect();
        let aux: Vec<f32> = (0..len * 3 * h).map(|_| rng.signed_unit()).collect();
        let fin: Vec<f32> = (0..len * h).map(|_| rng.signed_unit()).collect();
        w.push(SampleRef::new(&ids, &vec![1u8; len], &aux).with_final_hidden(&fin).with_sample_id(i)).unwrap();
    }
    w.finish().unwrap();
    let text = format!(
        "output_dir = \"{}\"\nlog_every = 1\n[data]\ntrain = [\"{}\"]\nbatch_tokens = 1024\n[init]\nkind = \"fresh\"\n\
         target_config = \"{}\"\nvocab = \"{}\"\n[target]\npath = \"{}\"\n[optim]\nmax_steps = 4\n",
        p("run").display(),
        p("train").display(),
        p("target/config.json").display(),
        p("vocab.safetensors").display(),
        p("target.safetensors").display()
    );
    let cfg = aerie_train::TrainConfig::from_toml_str(&text, std::path::Path::new("smollm2.toml"), &[]).unwrap();
    let devices = std::env::var("AERIE_TRAIN_DEVICES").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let t0 = std::time::Instant::now();
    let s = run(&cfg, devices, None).unwrap();
    let lines = metrics_lines(&cfg.output_dir);
    let rates: Vec<f64> = lines.iter().map(|l| l["tokens_per_s"].as_f64().unwrap()).collect();
    eprintln!(
        "SmolLM2 shape, K 7, 4 steps of {} tokens on {devices} replica(s): {:.1} s total (setup included), per-step tokens/s {:?}, run average {:.0}",
        s.tokens / 4.0,
        t0.elapsed().as_secs_f64(),
        rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        s.tokens_per_s
    );
}
