//! The MLA drafter layout (`Eagle3DeepseekV2ForCausalLM`): export to SGLang's and vLLM's forms
//! and back is byte-identical, the tensor names are the ones both engines' loaders read
//! (`q_a_proj`, `kv_a_proj_with_mqa`, ... under `midlayer.` or `layers.0.`), the full vocabulary
//! needs no d2t, and `inspect` recognises the layout and lints what engines would run wrongly.

use std::fs;

use aerie_hub::{ExportOptions, Severity, export, inspect};
use aerie_model::checkpoint::{Dialect, Dtype, keys, load_drafter, synthetic};
use aerie_model::{AuxConvention, RopeScaling};
use serde_json::{Value, json};

use crate::common::*;

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn mla_sglang_to_vllm_to_sglang_is_byte_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, vllm, back) = (tmp.path().join("src"), tmp.path().join("vllm"), tmp.path().join("back"));
    let cfg = synthetic::tiny_mla_config();
    let original = drafter(&cfg, Dtype::BF16);
    assert!(!original.tensors.contains_key(keys::D2T), "full vocabulary: no d2t");
    save(&original, &src, Dialect::Sglang);
    let c = read_json(&src.join("config.json"));
    assert_eq!(c["architectures"], json!(["Eagle3DeepseekV2ForCausalLM"]));
    assert_eq!((c["q_lora_rank"].clone(), c["kv_lora_rank"].clone()), (json!(24), json!(16)));
    assert_eq!(c["draft_vocab_size"], c["vocab_size"]);
    assert_eq!(c["rope_scaling"]["type"], "yarn");
    assert_eq!(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json!([1, 4, 6]));

    let r = export(&src, Dialect::Speculators, &vllm, ExportOptions::default()).unwrap();
    assert_eq!((r.aux_layer_ids.clone(), r.aux_convention), (vec![2, 5, 7], AuxConvention::InputOfLayer));
    let names: Vec<&str> = r.tensors.iter().map(|t| t.key.as_str()).collect();
    for want in [
        "layers.0.self_attn.q_a_proj.weight",
        "layers.0.self_attn.q_a_layernorm.weight",
        "layers.0.self_attn.q_b_proj.weight",
        "layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "layers.0.self_attn.kv_a_layernorm.weight",
        "layers.0.self_attn.kv_b_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "fc.weight",
        "lm_head.weight",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("q_proj.") && !n.contains("q_a_") && !n.contains("q_b_")));
    let c = read_json(&vllm.join("config.json"));
    assert_eq!(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json!([2, 5, 7]));
    assert!(c.get("speculators_config").is_none(), "vLLM reads the flat DeepSeek config for MLA drafters");

    export(&vllm, Dialect::Sglang, &back, ExportOptions::default()).unwrap();
    for f in ["model.safetensors", "config.json"] {
        assert_eq!(fs::read(src.join(f)).unwrap(), fs::read(back.join(f)).unwrap(), "{f}");
    }
    let reloaded = load_drafter(&back, None).unwrap();
    let mut want = original.tensors.clone();
    want.remove(keys::EMBED);
    assert_eq!(reloaded.tensors, want);
    assert_eq!(reloaded.config, original.config);
}

#[test]
fn inspect_recognises_mla_and_lints_what_engines_run_wrongly() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = synthetic::tiny_mla_config();
    let dir = tmp.path().join("ok");
    save(&drafter(&cfg, Dtype::BF16), &dir, Dialect::Sglang);
    let r = inspect(&dir, None).unwrap();
    assert_eq!(r.architectures, vec!["Eagle3DeepseekV2ForCausalLM".to_string()]);
    assert_eq!(r.config.mla, cfg.mla);
    assert_eq!(r.errors(), 0, "{:?}", r.findings);
    assert!(r.expected.iter().any(|e| e.name == "midlayer.self_attn.kv_b_proj.weight"));

    // A Llama architecture string over MLA weights: SGLang would build the wrong model.
    let broken = tmp.path().join("arch");
    let ckpt = drafter(&cfg, Dtype::BF16);
    let mut c = config_json(&cfg, Dialect::Sglang);
    c["architectures"] = json!(["LlamaForCausalLMEagle3"]);
    write_raw(&broken, &c, &file_tensors(&ckpt, Dialect::Sglang, false));
    let r = inspect(&broken, None).unwrap();
    assert!(r.findings.iter().any(|f| f.code == "architecture" && f.severity == Severity::Error), "{:?}", r.findings);

    // Llama-3 RoPE scaling on an MLA drafter: vLLM would serve it as DeepSeek YaRN.
    let rope = tmp.path().join("rope");
    let mut cfg3 = cfg.clone();
    cfg3.rope.scaling = RopeScaling::Linear { factor: 2.0 };
    write_raw(&rope, &config_json(&cfg3, Dialect::Sglang), &file_tensors(&ckpt, Dialect::Sglang, false));
    let r = inspect(&rope, None).unwrap();
    assert!(r.findings.iter().any(|f| f.code == "mla-rope-scaling"), "{:?}", r.findings);

    // Llama attention weights in an MLA checkpoint: missing MLA keys and unexpected q_proj.
    let mixed = tmp.path().join("mixed");
    let llama = drafter(&tiny(), Dtype::BF16);
    write_raw(&mixed, &config_json(&cfg, Dialect::Sglang), &file_tensors(&llama, Dialect::Sglang, false));
    let r = inspect(&mixed, None).unwrap();
    let codes: Vec<&str> = r.findings.iter().map(|f| f.code.as_str()).collect();
    assert!(codes.contains(&"missing-key") && codes.contains(&"unexpected-key"), "{codes:?}");
}
