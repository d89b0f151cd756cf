//! Lossless round trips between dialects, dtype changes, and what an export writes.

use std::fs;

use aerie_hub::{ExportOptions, export};
use aerie_model::checkpoint::{Dialect, Dtype, keys, load_drafter, load_drafter_with_notes};
use serde_json::Value;

use crate::common::*;

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn sglang_to_speculators_to_sglang_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, spec, back) = (tmp.path().join("src"), tmp.path().join("spec"), tmp.path().join("back"));
    let original = drafter(&tiny(), Dtype::BF16);
    save(&original, &src, Dialect::Sglang);

    let r = export(&src, Dialect::Speculators, &spec, ExportOptions::default()).unwrap();
    assert_eq!((r.from, r.to, r.dtype), (Dialect::Sglang, Dialect::Speculators, Dtype::BF16));
    assert_eq!(r.aux_layer_ids, vec![2, 5, 7]);
    assert!(!r.embedding_included);
    assert!(r.tensors.iter().any(|t| t.key == "layers.0.self_attn.q_proj.weight"));
    assert!(r.tensors.iter().all(|t| !t.key.starts_with("midlayer.")));
    let cfg = read_json(&spec.join("config.json"));
    assert_eq!(cfg["eagle_aux_hidden_state_layer_ids"], serde_json::json!([2, 5, 7]));
    assert_eq!(cfg["norm_before_residual"], Value::Bool(false));
    assert_eq!(cfg["speculators_model_type"], "eagle3");

    export(&spec, Dialect::Sglang, &back, ExportOptions::default()).unwrap();
    // Same writer, same keys, same config: the files are byte-identical to the source's.
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
fn export_then_reload_is_bit_identical_at_the_same_dtype() {
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        for to in [Dialect::Sglang, Dialect::Speculators] {
            let tmp = tempfile::tempdir().unwrap();
            let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
            let original = drafter(&tiny(), dtype);
            save(&original, &src, Dialect::Sglang);
            // Keeping the dtype and asking for it explicitly must both be lossless.
            for (i, d) in [None, Some(dtype)].into_iter().enumerate() {
                let out = out.with_extension(i.to_string());
                let opts = ExportOptions { dtype: d, include_embedding: true, ..Default::default() };
                let e = err(export(&src, to, &out, opts.clone()));
                assert!(e.contains("no") && e.contains("embedding"), "{e}");
                let target = tmp.path().join("target");
                if !target.exists() {
                    let emb = [("model.embed_tokens.weight".to_string(), original.tensors[keys::EMBED].clone())];
                    write_target(&target, &tiny(), 10, &emb.into_iter().collect());
                }
                let opts = ExportOptions { target: Some(target), ..opts };
                let r = export(&src, to, &out, opts).unwrap();
                assert!(r.embedding_included && r.tensors.iter().any(|t| t.key == keys::EMBED));
                assert_eq!(load_drafter(&out, None).unwrap().tensors, original.tensors, "{dtype} {to}");
            }
        }
    }
}

#[test]
fn f32_to_bf16_export_rounds_floats_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
    let original = drafter(&tiny(), Dtype::F32);
    save(&original, &src, Dialect::Sglang);
    let opts = ExportOptions { dtype: Some(Dtype::BF16), ..Default::default() };
    let r = export(&src, Dialect::Speculators, &out, opts).unwrap();
    assert_eq!(r.dtype, Dtype::BF16);
    assert_eq!(read_json(&out.join("config.json"))["torch_dtype"], "bfloat16");
    let got = load_drafter(&out, None).unwrap();
    assert_eq!(got.weight_dtype, Dtype::BF16);
    for (name, t) in &got.tensors {
        let src_t = &original.tensors[name];
        if src_t.dtype.is_float() {
            assert_eq!(*t, src_t.cast_float(name, Dtype::BF16).unwrap(), "{name}");
        } else {
            assert_eq!(t, src_t, "{name}");
        }
    }
    assert_eq!(got.tensors[keys::D2T].dtype, Dtype::I64);
    assert_eq!(got.tensors[keys::T2D].dtype, Dtype::Bool);
}

#[test]
fn norm_before_residual_is_refused_for_sglang_and_explicit_for_speculators() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut cfg = tiny();
    cfg.norm_before_residual = true;
    save(&drafter(&cfg, Dtype::BF16), &src, Dialect::Speculators);
    let e = err(export(&src, Dialect::Sglang, &tmp.path().join("sg"), ExportOptions::default()));
    assert!(e.contains("norm_before_residual") && e.contains("SGLang") && e.contains("src"), "{e}");
    assert!(!tmp.path().join("sg").exists());
    let out = tmp.path().join("vllm");
    export(&src, Dialect::Speculators, &out, ExportOptions::default()).unwrap();
    assert_eq!(read_json(&out.join("config.json"))["norm_before_residual"], Value::Bool(true));
}

#[test]
fn eagle31_options_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    cfg.fc_norm = true;
    cfg.norm_output = true;
    let original = drafter(&cfg, Dtype::BF16);
    assert!(original.tensors.contains_key("fc_norm.2.weight"));
    let src = tmp.path().join("src");
    save(&original, &src, Dialect::Sglang);
    let spec = tmp.path().join("spec");
    export(&src, Dialect::Speculators, &spec, ExportOptions::default()).unwrap();
    let c = read_json(&spec.join("config.json"));
    assert_eq!((c["fc_norm"].clone(), c["norm_output"].clone()), (Value::Bool(true), Value::Bool(true)));
    let back = load_drafter(&spec, None).unwrap();
    assert_eq!(back.config, original.config.clone().with_input_aux());
    assert_eq!(back.tensors["fc_norm.1.weight"], original.tensors["fc_norm.1.weight"]);
}

trait WithInputAux {
    fn with_input_aux(self) -> Self;
}

impl WithInputAux for aerie_model::DrafterConfig {
    /// The same config as a speculators file reads back: aux ids in the input-of-layer convention.
    fn with_input_aux(mut self) -> Self {
        self.aux_layers = aerie_model::AuxLayers {
            ids: self.aux_layers.input_of_layer(),
            convention: aerie_model::AuxConvention::InputOfLayer,
        };
        self
    }
}

#[test]
fn output_directory_is_not_clobbered_without_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
    save(&drafter(&tiny(), Dtype::BF16), &src, Dialect::Sglang);
    export(&src, Dialect::Speculators, &out, ExportOptions::default()).unwrap();
    let e = err(export(&src, Dialect::Sglang, &out, ExportOptions::default()));
    assert!(e.contains("out") && e.contains("not empty"), "{e}");
    let opts = ExportOptions { overwrite: true, ..Default::default() };
    export(&src, Dialect::Sglang, &out, opts).unwrap();
    assert_eq!(read_json(&out.join("config.json"))["architectures"][0], "LlamaForCausalLMEagle3");
    // No temporary directories left beside the output.
    let names: Vec<String> =
        fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn export_reports_load_notes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let original = drafter(&tiny(), Dtype::BF16);
    let mut t = file_tensors(&original, Dialect::Sglang, false);
    t.remove(keys::T2D);
    write_raw(&src, &config_json(&tiny(), Dialect::Sglang), &t);
    let loaded = load_drafter_with_notes(&src, None).unwrap();
    assert_eq!(loaded.checkpoint.tensors[keys::T2D], original.tensors[keys::T2D]);
    let r = export(&src, Dialect::Sglang, &tmp.path().join("out"), ExportOptions::default()).unwrap();
    assert!(r.notes.iter().any(|n| n.contains("t2d absent")), "{:?}", r.notes);
    // Exported back in its own layout it keeps its tensor set: no t2d, as it came (NVIDIA's
    // modelopt export ships none; aerie derives it again on every load).
    assert!(!r.tensors.iter().any(|t| t.key == keys::T2D));
    // Written from memory (a training run's checkpoint of a fresh drafter), it ships the derived
    // t2d (SGLang ignores it; trainers need it).
    let mut fresh = loaded.checkpoint.clone();
    fresh.source = None;
    let out = tmp.path().join("fresh");
    aerie_model::checkpoint::save_drafter(&fresh, &out, &aerie_model::checkpoint::SaveOptions::default()).unwrap();
    assert!(load_drafter_with_notes(&out, None).unwrap().checkpoint.source.unwrap().tensors.contains(keys::T2D));
}
