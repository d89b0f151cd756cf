//! A drafter whose config spells RoPE only in transformers 5's `rope_parameters` (llama3 scaling)
//! exports with the legacy `rope_theta`/`rope_scaling` too, which SGLang, vLLM and speculators'
//! converter read (they read no `rope_parameters`: without the legacy keys they run plain RoPE).

use std::fs;
use std::process::Command;

use aerie_hub::{ExportOptions, export};
use aerie_model::checkpoint::{Dialect, Dtype};
use aerie_model::config::RopeScaling;
use serde_json::{Value, json};

use crate::common::*;

/// speculators' own SGLang-to-speculators conversion of the exported config (`Eagle3Converter`,
/// the Llama layer config it builds from the EAGLE-3 config): the RoPE it would serve.
const CONVERT: &str = r#"
import json, sys
from speculators.convert.eagle.eagle3_converter import Eagle3Converter
cfg = json.load(open(sys.argv[1] + "/config.json"))
c = Eagle3Converter()._create_transformer_config_from_eagle(cfg, sys.argv[2])
rp = getattr(c, "rope_parameters", None) or {}
rs = getattr(c, "rope_scaling", None) or {}
r = dict(rs); r.update(rp)
print(json.dumps({"rope_type": r.get("rope_type", r.get("type")), "factor": r.get("factor"),
                  "rope_theta": r.get("rope_theta", getattr(c, "rope_theta", None))}))
"#;

#[test]
fn a_rope_parameters_only_drafter_exports_the_legacy_rope_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    cfg.rope.theta = 500000.0;
    cfg.rope.scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
    };
    let params = json!({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    let target = tmp.path().join("target");
    let mut embed = aerie_model::checkpoint::TensorMap::new();
    embed.insert("model.embed_tokens.weight".into(), ramp(vec![cfg.vocab_size, cfg.target_hidden_size], Dtype::BF16));
    write_target(&target, &cfg, 8, &embed);
    for dialect in [Dialect::Sglang, Dialect::Speculators] {
        // A source drafter whose config holds `rope_parameters` only (as transformers 5 writes).
        let src = tmp.path().join(format!("src-{dialect}"));
        save(&drafter(&cfg, Dtype::BF16), &src, dialect);
        let path = src.join("config.json");
        let mut v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        let level = match dialect {
            Dialect::Sglang => v.as_object_mut().unwrap(),
            Dialect::Speculators => v["transformer_layer_config"].as_object_mut().unwrap(),
        };
        level.remove("rope_theta");
        level.remove("rope_scaling");
        level.insert("rope_parameters".into(), params.clone());
        fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();

        let out = tmp.path().join(format!("out-{dialect}"));
        let opts = ExportOptions { target: Some(target.clone()), ..Default::default() };
        export(&src, dialect, &out, opts).unwrap();
        let written: Value = serde_json::from_slice(&fs::read(out.join("config.json")).unwrap()).unwrap();
        let level = match dialect {
            Dialect::Sglang => &written,
            Dialect::Speculators => &written["transformer_layer_config"],
        };
        assert_eq!(level["rope_theta"], json!(500000.0), "{dialect}: {written:#}");
        assert_eq!(level["rope_scaling"]["rope_type"], json!("llama3"), "{dialect}: {written:#}");
        assert_eq!(level["rope_scaling"]["type"], json!("llama3"), "{dialect}: {written:#}");
        assert_eq!(level["rope_scaling"]["factor"], json!(8.0), "{dialect}: {written:#}");
        assert_eq!(level["rope_scaling"]["original_max_position_embeddings"], json!(64), "{dialect}");
        assert_eq!(level["rope_parameters"], params, "{dialect}: the source's rope_parameters stay");
    }

    let Some(py) = std::env::var_os("AERIE_PYTHON").filter(|p| !p.is_empty()) else {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI=true needs AERIE_PYTHON");
        eprintln!("skipping speculators' converter: set AERIE_PYTHON");
        return;
    };
    let out = tmp.path().join("out-sglang");
    let o = Command::new(py).arg("-c").arg(CONVERT).arg(&out).arg(&target).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "speculators' converter failed:\n{stdout}{}", String::from_utf8_lossy(&o.stderr));
    let read: Value = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    assert_eq!(read, json!({"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}), "{stdout}");
}
