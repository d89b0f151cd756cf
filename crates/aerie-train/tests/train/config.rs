//! Config parsing: defaults, unknown keys with suggestions, `--set`, and the documented examples.

use std::path::Path;

use aerie_train::TrainConfig;
use aerie_train::config::keys::KEYS;

const MIN: &str = r#"
output_dir = "runs/x"
[data]
train = ["data/train"]
[init]
kind = "warm_start"
drafter = "drafters/x"
"#;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().parent().unwrap()
}

#[test]
fn defaults_follow_the_reference_recipe() {
    let c = TrainConfig::from_toml_str(MIN, Path::new("min.toml"), &[]).unwrap();
    assert_eq!((c.optim.lr, c.optim.warmup_ratio, c.optim.eps, c.optim.weight_decay), (1e-4, 0.015, 1e-8, 0.0));
    assert_eq!(c.optim.betas, [0.9, 0.999]);
    assert_eq!(c.optim.max_grad_norm, 0.5);
    assert_eq!((c.ttt_length, c.step_weight_decay), (7, 0.8));
    assert_eq!(c.loss, aerie_train::LossKind::SoftCe);
    // Round trip through the saved TOML.
    let back = TrainConfig::from_toml_str(&c.to_toml(), Path::new("copy.toml"), &[]).unwrap();
    assert_eq!(back, c);
}

#[test]
fn unknown_keys_name_the_nearest_valid_key() {
    let text = format!("{MIN}[optim]\nlrr = 1e-4\n");
    let e = TrainConfig::from_toml_str(&text, Path::new("my.toml"), &[]).unwrap_err().to_string();
    assert!(
        e.contains("my.toml") && e.contains("unknown key `optim.lrr`") && e.contains("did you mean `optim.lr`"),
        "{e}"
    );
    let text = MIN.replace("output_dir", "ttt_lenght = 3\noutput_dir");
    let e = TrainConfig::from_toml_str(&text, Path::new("my.toml"), &[]).unwrap_err().to_string();
    assert!(e.contains("did you mean `ttt_length`"), "{e}");
    // A key in the wrong section points to where it belongs.
    let text = format!("{MIN}batch_tokens = 10\n");
    let e = TrainConfig::from_toml_str(&text, Path::new("my.toml"), &[]).unwrap_err().to_string();
    assert!(e.contains("unknown key `init.batch_tokens`") && e.contains("did you mean `data.batch_tokens`"), "{e}");
    let sets = [("optim.warmup".to_string(), "0.1".to_string())];
    let e = TrainConfig::from_toml_str(MIN, Path::new("my.toml"), &sets).unwrap_err().to_string();
    assert!(e.contains("--set") && e.contains("did you mean `optim.warmup_ratio`"), "{e}");
}

#[test]
fn set_overrides_and_value_checks() {
    let sets = [("optim.lr".to_string(), "5e-5".to_string()), ("loss".to_string(), "lk".to_string())];
    let c = TrainConfig::from_toml_str(MIN, Path::new("min.toml"), &sets).unwrap();
    assert_eq!(c.optim.lr, 5e-5);
    assert_eq!(c.loss, aerie_train::LossKind::Lk);
    let sets = [("optim.warmup_ratio".to_string(), "2".to_string())];
    let e = TrainConfig::from_toml_str(MIN, Path::new("min.toml"), &sets).unwrap_err().to_string();
    assert!(e.contains("optim.warmup_ratio") && e.contains("[0, 1]"), "{e}");
    let fresh = MIN.replace("kind = \"warm_start\"", "kind = \"fresh\"");
    let e = TrainConfig::from_toml_str(&fresh, Path::new("f.toml"), &[]).unwrap_err().to_string();
    assert!(e.contains("init.vocab") && e.contains("init.drafter"), "{e}");
}

#[test]
fn every_key_is_documented_and_the_examples_parse() {
    let readme = std::fs::read_to_string(workspace().join("configs/README.md")).unwrap();
    for k in KEYS {
        assert!(readme.contains(&format!("`{}`", k.key)), "configs/README.md does not document `{}`", k.key);
    }
    // The quickstart's recipe (with its @WORK@ placeholder filled) and the Kimi fine-tune.
    for name in ["quickstart-smollm2.toml", "kimi-k25-finetune.toml"] {
        let p = workspace().join("configs").join(name);
        let text = std::fs::read_to_string(&p).unwrap().replace("@WORK@", "/tmp/work");
        TrainConfig::from_toml_str(&text, &p, &[]).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
    // The key table covers exactly what the config serialises when every option is set.
    let text = format!(
        "eval_every = 1\n{MIN}[init.shape]\nhidden_size = 1\nintermediate_size = 1\nnum_attention_heads = 1\n\
         num_key_value_heads = 1\nhead_dim = 2\nrms_norm_eps = 1e-6\nrope_theta = 1.0\nmax_position_embeddings = 8\n\
         aux_layer_ids = [1]\nfc_norm = true\nnorm_output = true\n[init.shape.mla]\nq_lora_rank = 4\n\
         kv_lora_rank = 4\nqk_nope_head_dim = 2\nqk_rope_head_dim = 2\nv_head_dim = 2\n"
    )
    .replace(
        "kind = \"warm_start\"\ndrafter = \"drafters/x\"",
        "kind = \"fresh\"\nvocab = \"v\"\ntarget_config = \"t\"",
    );
    let sets: Vec<(String, String)> = [
        ("data.max_length", "9"),
        ("data.eval_max_samples", "9"),
        ("optim.max_steps", "9"),
        ("optim.replay_weight", "0.5"),
        ("target.path", "p"),
        ("target.head", "h"),
        ("target.embedding", "e"),
        ("init.from_target", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let full = TrainConfig::from_toml_str(&text, Path::new("full.toml"), &sets).unwrap();
    fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    flatten(&if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, v, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    // warm_start only (init.drafter, optim.anchor_weight), or needing the target's model directory
    // ([select]): cannot be set here; tests/train/anchor.rs and select.rs set them.
    let mut serialised: Vec<String> = ["init.drafter", "optim.anchor_weight"].map(String::from).to_vec();
    serialised.extend(
        ["every_steps", "prompts", "k", "max_new_tokens", "max_prompts", "target", "template"]
            .map(|k| format!("select.{k}")),
    );
    flatten("", &serde_json::to_value(&full).unwrap(), &mut serialised);
    serialised.sort();
    let mut table: Vec<String> = KEYS.iter().map(|k| k.key.to_string()).collect();
    table.sort();
    assert_eq!(serialised, table);
}
