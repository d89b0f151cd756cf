//! Every published Kimi drafter's layout, written at a small scale (tiny sizes, their config keys,
//! tensor names and dtypes), read by aerie and exported back in its own layout untrained: the
//! same tensor names, shapes, dtypes and bytes, and the same config keys and values.
//!
//! Where each layout's facts come from (no checkpoint can be downloaded here):
//! - AQ-MedAI/Kimi-K2-Instruct-eagle3 (SpecForge): `LlamaForCausalLMEagle3`, the Llama keys plus
//!   `draft_vocab_size`, `eagle_config` {aux ids, `use_aux_hidden_state`}, `rope_scaling: null`,
//!   bos/eos/pad; SGLang names `midlayer.*`, `d2t` and `t2d` (scripts/kimi_miniature.py records
//!   the same keys; SGLang `models/llama_eagle3.py` reads the names).
//! - lightseekorg/kimi-k2.5-eagle3 (TorchSpec, Llama layer): the same Llama keys with TorchSpec's
//!   `eagle_config` (`use_input_layernorm_in_first_layer`, `use_last_layernorm`,
//!   `use_mtp_layernorm`), rope_theta 1e6 (a TorchSpec model card contrasts its own 50000 with
//!   this drafter's 1000000), `d2t`/`t2d`.
//! - lightseekorg/kimi-k2.5-eagle3-mla: TorchSpec's `configs/draft_models/kimi_k3_eagle3_mla.json`
//!   / `kimi_k25_eagle3_moe.json` keys (`Eagle3DeepseekV2ForCausalLM`, `model_type: kimi_k2`, MLA
//!   widths, `mla_use_nope`, YaRN with `mscale_all_dim`), the full 163,840 vocabulary, no d2t; the
//!   MLA names of SGLang `models/kimi_k25_eagle3.py` and vLLM `models/deepseek_eagle3.py`.
//! - nvidia/Kimi-K2.6-Eagle3 (TensorRT Model Optimizer): the key template of modelopt's
//!   `torch/export/plugins/hf_spec_export.py` (`export_spec_ckpt_config`: `initializer_range`,
//!   `pretraining_tp`, `use_cache`, `transformers_version`, eagle_config's
//!   `next_layer_regular`, `parallel_draft_step`, ...), and its state-dict map: `midlayer.*`,
//!   `d2t` without `t2d`.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use aerie_hub::{ExportOptions, export, inspect};
use aerie_model::DrafterConfig;
use aerie_model::checkpoint::config::parse_config;
use aerie_model::checkpoint::{Dialect, Dtype, HostTensor, io, keys, load_drafter, synthetic};
use serde_json::{Value, json};

use crate::common::*;

/// One published layout at a small scale.
struct Layout {
    name: &'static str,
    config: Value,
    /// Whether the files hold `t2d` beside `d2t`.
    t2d: bool,
}

/// The Llama-layer keys shared by the SpecForge and TorchSpec files, at the tiny sizes.
fn llama_keys(rope_theta: f64, eagle: Value) -> Value {
    json!({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
        "target_hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 1, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "max_position_embeddings": 262144, "vocab_size": 512,
        "draft_vocab_size": 64, "rope_theta": rope_theta, "rope_scaling": null,
        "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": false,
        "bos_token_id": 500, "eos_token_id": 501, "pad_token_id": 511, "torch_dtype": "bfloat16",
        "eagle_config": eagle,
    })
}

fn layouts() -> Vec<Layout> {
    let aq = llama_keys(50000.0, json!({"eagle_aux_hidden_state_layer_ids": [1, 4, 6], "use_aux_hidden_state": true}));
    let torchspec_eagle = json!({"eagle_aux_hidden_state_layer_ids": [1, 4, 6], "use_aux_hidden_state": true,
        "use_input_layernorm_in_first_layer": true, "use_last_layernorm": true, "use_mtp_layernorm": false});
    let lightseek = llama_keys(1_000_000.0, torchspec_eagle.clone());
    let mla = json!({
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
        "mla_use_nope": true, "hidden_act": "silu", "rms_norm_eps": 1e-5, "vocab_size": 512, "draft_vocab_size": 512,
        "torch_dtype": "bfloat16", "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "max_position_embeddings": 262144, "eagle_config": torchspec_eagle,
        "bos_token_id": 500, "eos_token_id": 501, "pad_token_id": 0,
    });
    let mut nvidia = llama_keys(
        50000.0,
        json!({"eagle_aux_hidden_state_layer_ids": [1, 4, 6],
        "use_aux_hidden_state": true, "use_input_layernorm_in_first_layer": true, "use_last_layernorm": true,
        "use_mtp_layernorm": false, "next_layer_regular": true, "parallel_draft_step": 1,
        "parallel_draft_heads_num_layers": 1}),
    );
    let n = nvidia.as_object_mut().unwrap();
    n.remove("target_hidden_size");
    for (k, v) in [
        ("initializer_range", json!(0.02)),
        ("pretraining_tp", json!(1)),
        ("use_cache", json!(true)),
        ("attention_dropout", json!(0.0)),
        ("transformers_version", json!("4.57.1")),
    ] {
        n.insert(k.into(), v);
    }
    vec![
        Layout { name: "AQ-MedAI/Kimi-K2-Instruct-eagle3", config: aq, t2d: true },
        Layout { name: "lightseekorg/kimi-k2.5-eagle3", config: lightseek, t2d: true },
        Layout { name: "lightseekorg/kimi-k2.5-eagle3-mla", config: mla, t2d: false },
        Layout { name: "nvidia/Kimi-K2.6-Eagle3", config: nvidia, t2d: false },
    ]
}

/// The layout's files: its config as published and seeded tensors of its shapes under SGLang's
/// names, in bf16 (`d2t` i64, `t2d` bool), no embedding (the engines take the target's).
fn write_layout(dir: &Path, l: &Layout) -> DrafterConfig {
    let cfg = parse_config(&l.config, Path::new(l.name), None).unwrap().config;
    let ckpt = synthetic::random_drafter(&cfg, Dtype::BF16, 7);
    let mut tensors = file_tensors(&ckpt, Dialect::Sglang, false);
    if !l.t2d {
        tensors.remove(keys::T2D);
    }
    write_raw(dir, &l.config, &tensors);
    cfg
}

fn tensors_of(dir: &Path) -> BTreeMap<String, HostTensor> {
    io::WeightFiles::open_dir(dir).unwrap().load_all().unwrap().into_iter().collect()
}

fn config_of(dir: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn every_published_kimi_layout_exports_back_to_itself_untrained() {
    let tmp = tempfile::tempdir().unwrap();
    for l in layouts() {
        let src = tmp.path().join(l.name.replace('/', "--"));
        let cfg = write_layout(&src, &l);
        let loaded = load_drafter(&src, None).unwrap();
        assert_eq!(loaded.dialect, Dialect::Sglang, "{}", l.name);
        // The vocabulary is the file's own: its d2t map, or the full vocabulary with no map.
        let full = cfg.draft_vocab_size == cfg.vocab_size;
        assert_eq!(loaded.tensors.contains_key(keys::D2T), !full, "{}", l.name);
        assert_eq!(cfg.mla.is_some(), l.name.ends_with("-mla"), "{}", l.name);

        let out = tmp.path().join(format!("{}-back", l.name.replace('/', "--")));
        let report = export(&src, Dialect::Sglang, &out, ExportOptions::default()).unwrap();
        assert_eq!(report.dtype, Dtype::BF16, "{}", l.name);
        let (want, got) = (tensors_of(&src), tensors_of(&out));
        assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>(), "{}: tensor names", l.name);
        for (k, t) in &want {
            assert_eq!(&got[k], t, "{}: `{k}` (dtype, shape or bytes)", l.name);
        }
        assert_eq!(config_of(&out), l.config, "{}: config keys and values", l.name);

        // The other engine's layout and back again also gives the published files.
        let vllm = tmp.path().join(format!("{}-vllm", l.name.replace('/', "--")));
        let again = tmp.path().join(format!("{}-again", l.name.replace('/', "--")));
        if cfg.mla.is_some() {
            export(&src, Dialect::Speculators, &vllm, ExportOptions::default()).unwrap();
            export(&vllm, Dialect::Sglang, &again, ExportOptions::default()).unwrap();
            let got = tensors_of(&again);
            assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>(), "{}", l.name);
            let back = config_of(&again);
            // Keys the published file has and aerie does not write come back only through the
            // same layout; the drafter itself is the same.
            assert_eq!(parse_config(&back, &again, None).unwrap().config, cfg, "{}", l.name);
        }

        // inspect recognises the layout: no errors, the architecture and the vocabulary named.
        let r = inspect(&src, None).unwrap();
        assert_eq!(r.errors(), 0, "{}: {:?}", l.name, r.findings);
        assert_eq!(r.config.draft_vocab_size, cfg.draft_vocab_size, "{}", l.name);
    }
}
