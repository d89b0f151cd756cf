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
