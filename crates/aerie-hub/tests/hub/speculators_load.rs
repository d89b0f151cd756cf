//! `aerie export --to speculators` names the verifier the drafter belongs to, and speculators'
//! own `from_pretrained` (PyPI `speculators`, through `AERIE_PYTHON`) loads the export.

use std::fs;
use std::process::Command;

use aerie_hub::{ExportOptions, export};
use aerie_model::checkpoint::Dialect;
use aerie_model::checkpoint::Dtype;
use serde_json::{Value, json};

use crate::common::*;

const LOAD: &str = r#"
import sys
from speculators import SpeculatorModel
m = SpeculatorModel.from_pretrained(sys.argv[1])
v = m.config.speculators_config.verifier
print(type(m).__name__, v.name_or_path, ",".join(v.architectures or []))
"#;

#[test]
fn a_speculators_export_names_its_verifier_and_speculators_loads_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out, target) = (tmp.path().join("src"), tmp.path().join("out"), tmp.path().join("target"));
    let mut cfg = tiny();
    cfg.target_name_or_path = None; // as `aerie import gguf` leaves it
    save(&drafter(&cfg, Dtype::BF16), &src, Dialect::Sglang);

    // No target known: refused, naming the way out, before anything is written.
    let e = err(export(&src, Dialect::Speculators, &out, ExportOptions::default()));
    assert!(e.contains("names no target") && e.contains("--target"), "{e}");
    assert!(!out.join("config.json").exists());

    // A transformers-loadable target config (what AutoConfig.from_pretrained reads).
    let target_cfg = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
        "hidden_size": cfg.target_hidden_size, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": cfg.vocab_size, "max_position_embeddings": 4096,
        "tie_word_embeddings": false, "rms_norm_eps": 1e-5,
    });
    let mut tensors = aerie_model::checkpoint::TensorMap::new();
    tensors.insert("model.embed_tokens.weight".into(), ramp(vec![cfg.vocab_size, cfg.target_hidden_size], Dtype::BF16));
    write_raw(&target, &target_cfg, &tensors);
    let opts = ExportOptions { target: Some(target.clone()), ..Default::default() };
    export(&src, Dialect::Speculators, &out, opts).unwrap();
    let written: Value = serde_json::from_slice(&fs::read(out.join("config.json")).unwrap()).unwrap();
    let verifier = &written["speculators_config"]["verifier"];
    assert_eq!(verifier["name_or_path"], json!(target.display().to_string()));
    assert_eq!(verifier["architectures"], json!(["LlamaForCausalLM"]));

    let Some(py) = std::env::var_os("AERIE_PYTHON").filter(|p| !p.is_empty()) else {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI=true needs AERIE_PYTHON");
        eprintln!("skipping speculators' from_pretrained: set AERIE_PYTHON");
        return;
    };
    let o = Command::new(py).arg("-c").arg(LOAD).arg(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "speculators could not load the export:\n{}{}",
        stdout,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains(&format!("{} LlamaForCausalLM", target.display())), "{stdout}");
}
