//! Warm starts keep the drafter's vocab map; a different vocab is an error unless overridden.

use aerie_model::checkpoint::{Dtype, SaveOptions, load_drafter, save_drafter, synthetic};

use crate::common::*;

/// A drafter directory for the world's target, with its own vocab map (seed 11).
fn drafter_dir(w: &World) -> std::path::PathBuf {
    let mut cfg = synthetic::tiny_config();
    cfg.hidden_size = H;
    cfg.target_hidden_size = H;
    cfg.intermediate_size = 64;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 8;
    cfg.vocab_size = V;
    cfg.draft_vocab_size = VD;
    cfg.aux_layers.ids = AUX.to_vec();
    let mut ckpt = synthetic::random_drafter(&cfg, Dtype::BF16, 11);
    ckpt.tensors.remove("embed_tokens.weight");
    let dir = w.path("drafter");
    save_drafter(&ckpt, &dir, &SaveOptions::default()).unwrap();
    dir
}

fn warm_config(w: &World, out: &str, init: &str, optim: &str) -> aerie_train::TrainConfig {
    let text = config_text(w, out, "", optim);
    let start = text.find("[init]").unwrap();
    let end = text.find("[target]").unwrap();
    let text = format!("{}[init]\n{init}\n\n{}", &text[..start], &text[end..]);
    aerie_train::TrainConfig::from_toml_str(&text, std::path::Path::new("warm.toml"), &[]).unwrap()
}

#[test]
fn warm_start_keeps_d2t_and_t2d() {
    let w = world();
    let dir = drafter_dir(&w);
    let src = load_drafter(&dir, Some(&w.target_file)).unwrap();
    let init = format!("kind = \"warm_start\"\ndrafter = \"{}\"", dir.display());
    let cfg = warm_config(&w, "warm", &init, "max_steps = 3");
    let s = run(&cfg, 1, None).unwrap();
    let out = load_drafter(s.final_checkpoint.as_ref().unwrap(), Some(&w.target_file)).unwrap();
    assert_eq!(out.tensors["d2t"], src.tensors["d2t"]);
    assert_eq!(out.tensors["t2d"], src.tensors["t2d"]);
    assert_eq!(out.weight_dtype, Dtype::F32);

    // The world's vocab (seed 3) differs from the drafter's (seed 11).
    let init = format!("{init}\nvocab = \"{}\"", w.vocab.display());
    let cfg = warm_config(&w, "warm2", &init, "max_steps = 1");
    let e = run(&cfg, 1, None).unwrap_err().to_string();
    assert!(e.contains("differs from") && e.contains("allow_vocab_override"), "{e}");

    // Overridden: the new map is used, and with lr 0 the rows of shared ids are the old rows.
    let init = format!("{init}\nallow_vocab_override = true");
    let mut cfg = warm_config(&w, "warm3", &init, "max_steps = 1");
    cfg.optim.lr = 0.0;
    let s = run(&cfg, 1, None).unwrap();
    let out = load_drafter(s.final_checkpoint.as_ref().unwrap(), Some(&w.target_file)).unwrap();
    let (d2t, _) = synthetic::vocab_map(V, VD, 3);
    assert_eq!(out.tensors["d2t"].to_i64("d2t").unwrap(), d2t);
    let ids = |c: &aerie_model::checkpoint::DrafterCheckpoint| -> Vec<usize> {
        let d = c.tensors["d2t"].to_i64("d2t").unwrap();
        d.iter().enumerate().map(|(i, o)| (i as i64 + o) as usize).collect()
    };
    let (old_ids, new_ids) = (ids(&src), ids(&out));
    let old_rows = src.tensors["lm_head.weight"].to_f32("lm_head").unwrap();
    let new_rows = out.tensors["lm_head.weight"].to_f32("lm_head").unwrap();
    let mut shared = 0;
    for (j, t) in new_ids.iter().enumerate() {
        if let Some(i) = old_ids.iter().position(|x| x == t) {
            assert_eq!(&new_rows[j * H..(j + 1) * H], &old_rows[i * H..(i + 1) * H], "row of target id {t}");
            shared += 1;
        }
    }
    assert!(shared > 0);
}

/// A published drafter's files at the world's sizes: the config as its authors write it (keys
/// aerie does not read, their spelling, `target_hidden_size` left out as modelopt does) and its
/// tensor set (no `t2d` beside `d2t`, as NVIDIA's modelopt export; `kimi-k2.5-eagle3-mla`: the
/// full vocabulary and no map). Facts and sources: aerie-hub's `tests/hub/published.rs`.
fn published_dir(w: &World, name: &str, mla: bool) -> std::path::PathBuf {
    use aerie_model::checkpoint::{config, io, keys};
    let mut cfg = synthetic::tiny_config();
    (cfg.hidden_size, cfg.target_hidden_size, cfg.intermediate_size) = (H, H, 64);
    (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) = (4, 2, 8);
    (cfg.vocab_size, cfg.draft_vocab_size) = (V, if mla { V } else { VD });
    cfg.aux_layers.ids = AUX.to_vec();
    if mla {
        cfg.num_key_value_heads = 4;
        cfg.mla = Some(aerie_model::MlaConfig {
            q_lora_rank: 16,
            kv_lora_rank: 12,
            qk_nope_head_dim: 8,
            qk_rope_head_dim: 4,
            v_head_dim: 6,
        });
        cfg.head_dim = 4;
    }
    let ckpt = synthetic::random_drafter(&cfg, Dtype::BF16, 11);
    let dir = w.path(name);
    let mut c = config::to_json(&cfg, aerie_model::checkpoint::Dialect::Sglang, Dtype::BF16, &dir).unwrap();
    let o = c.as_object_mut().unwrap();
    for k in ["target_hidden_size", "fc_norm", "norm_output", "norm_before_residual"] {
        o.remove(k);
    }
    o.insert("bos_token_id".into(), serde_json::json!(V - 2));
    o.insert("transformers_version".into(), serde_json::json!("4.57.1"));
    o["eagle_config"]["use_input_layernorm_in_first_layer"] = serde_json::json!(true);
    o["eagle_config"]["parallel_draft_step"] = serde_json::json!(1);
    if mla {
        o.insert("mla_use_nope".into(), serde_json::json!(true));
    }
    let tensors: aerie_model::checkpoint::TensorMap =
        ckpt.tensors.into_iter().filter(|(k, _)| k != keys::EMBED && k != keys::T2D).collect();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&c).unwrap()).unwrap();
    io::write_safetensors(&dir.join(io::SINGLE_FILE), &tensors).unwrap();
    dir
}

#[test]
fn published_layouts_warm_start_and_export_back_unchanged_when_untrained() {
    use aerie_model::checkpoint::{Dialect, io};
    let w = world();
    for (name, mla) in [("modelopt-like", false), ("lightseek-mla-like", true)] {
        let dir = published_dir(&w, name, mla);
        let init = format!("kind = \"warm_start\"\ndrafter = \"{}\"", dir.display());
        // lr 0: the steps run (full-vocabulary head included) and change nothing.
        let mut cfg = warm_config(&w, &format!("{name}-run"), &init, "max_steps = 2");
        cfg.optim.lr = 0.0;
        let s = run(&cfg, 1, None).unwrap();
        let final_dir = s.final_checkpoint.clone().unwrap();
        let trained = load_drafter(&final_dir, None).unwrap();
        assert_eq!(trained.tensors.contains_key("d2t"), !mla, "{name}: the vocabulary is the drafter's own");
        // The run's checkpoint (f32) exported back to bf16 in the published layout.
        let back = w.path(&format!("{name}-back"));
        let opts = SaveOptions { dialect: Dialect::Sglang, dtype: Some(Dtype::BF16), ..SaveOptions::default() };
        save_drafter(&trained, &back, &opts).unwrap();
        let files = |d: &std::path::Path| io::WeightFiles::open_dir(d).unwrap().load_all().unwrap();
        assert_eq!(files(&back), files(&dir), "{name}: tensor names, shapes, dtypes and bytes");
        let json = |d: &std::path::Path| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap()
        };
        // Every key as published but TorchSpec's NoPE switch: aerie trained the weights with RoPE.
        let mut want = json(&dir);
        if mla {
            want["mla_use_nope"] = serde_json::json!(false);
        }
        assert_eq!(json(&back), want, "{name}: config keys and values");
    }
}
