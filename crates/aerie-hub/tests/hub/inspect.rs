//! inspect: report contents, every lint, exit codes.

use std::fs;
use std::path::Path;

use aerie_hub::inspect::{CountSource, EmbeddingSource};
use aerie_hub::{InspectReport, Severity, inspect};
use aerie_model::checkpoint::{Dialect, Dtype, TensorMap, keys, validate};
use aerie_model::{AuxConvention, DrafterConfig};
use serde_json::{Value, json};

use crate::common::*;

fn codes(r: &InspectReport) -> Vec<(Severity, String)> {
    r.findings.iter().map(|f| (f.severity, f.code.clone())).collect()
}

fn has(r: &InspectReport, sev: Severity, code: &str) -> bool {
    r.findings.iter().any(|f| f.severity == sev && f.code == code)
}

/// A drafter dir (SGLang) and a 10-layer target dir holding the embedding.
fn setup(
    tmp: &Path,
    cfg: &DrafterConfig,
    edit_config: impl FnOnce(&mut Value),
) -> (std::path::PathBuf, std::path::PathBuf) {
    let ckpt = drafter(cfg, Dtype::BF16);
    let dir = tmp.join("drafter");
    let mut c = config_json(cfg, Dialect::Sglang);
    edit_config(&mut c);
    write_raw(&dir, &c, &file_tensors(&ckpt, Dialect::Sglang, false));
    let target = tmp.join("target");
    let emb = [("model.embed_tokens.weight".to_string(), ckpt.tensors[keys::EMBED].clone())];
    write_target(&target, cfg, 10, &emb.into_iter().collect());
    (dir, target)
}

/// The tiny drafter of `setup` with its files' tensors edited by `edit` (written without
/// validation); its directory.
fn edited_drafter(tmp: &Path, edit: impl FnOnce(&mut TensorMap)) -> std::path::PathBuf {
    let (dir, _) = setup(tmp, &tiny(), |_| {});
    let mut t = file_tensors(&drafter(&tiny(), Dtype::BF16), Dialect::Sglang, false);
    edit(&mut t);
    write_raw(&dir, &config_json(&tiny(), Dialect::Sglang), &t);
    dir
}

#[test]
fn clean_drafter_report() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny();
    let (dir, target) = setup(tmp.path(), &cfg, |_| {});
    let r = inspect(&dir, Some(&target)).unwrap();
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert_eq!(r.exit_code(true), 0);
    assert_eq!(r.dialect, Dialect::Sglang);
    assert_eq!(r.architectures, vec!["LlamaForCausalLMEagle3"]);
    assert_eq!((r.weight_dtype, r.config_dtype), (Some(Dtype::BF16), Some(Dtype::BF16)));
    assert_eq!(r.embedding, EmbeddingSource::Target);
    assert_eq!(r.params_from, CountSource::Weights);
    let expected: u64 = validate::expected_tensors(&cfg)
        .iter()
        .filter(|e| e.required && e.kind == validate::ElemKind::Float)
        .map(|e| e.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(r.trainable_params, expected);
    assert_eq!(r.frozen_params, 512 * 64);
    assert_eq!(r.aux.output_of_layer, vec![1, 4, 6]);
    assert_eq!(r.aux.input_of_layer, vec![2, 5, 7]);
    assert_eq!(r.aux.convention_in_config, AuxConvention::OutputOfLayer);
    assert_eq!(r.aux.target_num_layers, Some(10));
    let d = r.vocab.d2t.as_ref().unwrap();
    assert!(!d.identity && d.first_target_id >= 0 && d.last_target_id < 512);
    assert!(r.vocab.has_d2t && r.vocab.has_t2d);
    let q = r.tensors.iter().find(|t| t.name == "midlayer.self_attn.q_proj.weight").unwrap();
    assert_eq!((q.shape.clone(), q.dtype, q.trainable), (vec![128, 128], Dtype::BF16, true));
    // Without a target: embedding absent, aux ids still known, no target lints.
    let r = inspect(&dir, None).unwrap();
    assert_eq!((r.embedding, r.exit_code(true)), (EmbeddingSource::Absent, 0));
    // It serialises for --json.
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["dialect"], "sglang");
    assert_eq!(j["aux"]["input_of_layer"], json!([2, 5, 7]));
    assert!(j["findings"].as_array().unwrap().is_empty());
}

#[test]
fn reduced_vocab_without_d2t_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = edited_drafter(tmp.path(), |t| {
        t.remove(keys::D2T);
        t.remove(keys::T2D);
    });
    let r = inspect(&dir, None).unwrap();
    assert_eq!(codes(&r), vec![(Severity::Error, "reduced-vocab-without-d2t".to_string())]);
    assert_eq!(r.exit_code(false), 2);
}

#[test]
fn aux_ids_out_of_range_for_the_target() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, target) =
        setup(tmp.path(), &tiny(), |c| c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = json!([1, 4, 12]));
    assert!(inspect(&dir, None).unwrap().findings.is_empty(), "needs the target");
    let r = inspect(&dir, Some(&target)).unwrap();
    assert!(has(&r, Severity::Error, "aux-ids-out-of-range"), "{:?}", r.findings);
    assert_eq!(r.exit_code(false), 2);
}

#[test]
fn hidden_mismatch_without_target_hidden_size() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    cfg.target_hidden_size = 80;
    let (dir, _) = setup(tmp.path(), &cfg, |c| {
        c.as_object_mut().unwrap().remove("target_hidden_size");
    });
    let r = inspect(&dir, None).unwrap();
    assert_eq!(codes(&r), vec![(Severity::Error, "hidden-mismatch".to_string())]);
}

#[test]
fn config_lints() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, target) = setup(tmp.path(), &tiny(), |c| {
        c["num_nextn_predict_layers"] = json!(1);
        c["architectures"] = json!(["DeepseekV3ForCausalLM"]);
        c.as_object_mut().unwrap().remove("draft_vocab_size");
    });
    let r = inspect(&dir, Some(&target)).unwrap();
    for code in ["num-nextn-predict-layers", "architecture"] {
        assert!(has(&r, Severity::Error, code), "{code}: {:?}", r.findings);
    }
    assert!(has(&r, Severity::Warning, "no-draft-vocab-size"), "{:?}", r.findings);
    // Without draft_vocab_size Vd = V, so lm_head [64, 64] no longer matches [512, 64].
    assert!(has(&r, Severity::Error, "shape-mismatch"), "{:?}", r.findings);
    assert_eq!(r.findings[0].severity, Severity::Error, "errors first");
}

#[test]
fn unknown_and_missing_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = edited_drafter(tmp.path(), |t| {
        t.remove("midlayer.hidden_norm.weight");
        t.insert("midlayer.extra.weight".into(), ramp(vec![4], Dtype::BF16));
    });
    let r = inspect(&dir, None).unwrap();
    assert!(has(&r, Severity::Error, "missing-key") && has(&r, Severity::Error, "unexpected-key"), "{:?}", r.findings);
}

#[test]
fn warnings_fail_only_when_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, target) = setup(tmp.path(), &tiny(), |c| c["max_position_embeddings"] = json!(1024));
    let r = inspect(&dir, Some(&target)).unwrap();
    assert_eq!(codes(&r), vec![(Severity::Warning, "max-position-below-target".to_string())]);
    assert_eq!((r.exit_code(false), r.exit_code(true)), (0, 2));
}

#[test]
fn speculators_lints_and_unknown_aux_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spec");
    let mut c = config_json(&tiny(), Dialect::Speculators);
    let o = c.as_object_mut().unwrap();
    o.remove("norm_before_residual");
    o.remove("eagle_aux_hidden_state_layer_ids");
    write_raw(&dir, &c, &file_tensors(&drafter(&tiny(), Dtype::BF16), Dialect::Speculators, false));
    let r = inspect(&dir, None).unwrap();
    assert!(has(&r, Severity::Warning, "norm-before-residual-implicit"), "{:?}", r.findings);
    assert!(has(&r, Severity::Warning, "aux-ids-unknown"), "{:?}", r.findings);
    assert!(r.config.norm_before_residual && !r.aux.known);
    assert_eq!(r.exit_code(false), 0);
    let t = r.tensors.iter().find(|t| t.name == "midlayer.mlp.up_proj.weight").unwrap();
    assert_eq!(t.file_key, "layers.0.mlp.up_proj.weight");
}

#[test]
fn broken_d2t_is_reported_from_the_tensor_values() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = edited_drafter(tmp.path(), |t| {
        t.remove(keys::T2D);
        let mut d2t = t[keys::D2T].to_i64("d2t").unwrap();
        d2t[0] = -1;
        t.insert(keys::D2T.into(), aerie_model::checkpoint::HostTensor::from_i64(vec![64], &d2t));
    });
    let r = inspect(&dir, None).unwrap();
    assert!(has(&r, Severity::Error, "d2t-invariant"), "{:?}", r.findings);
    assert!(r.notes.iter().any(|n| n.contains("t2d absent")));
    assert_eq!(r.vocab.d2t.as_ref().unwrap().min_offset, -1);
    fs::remove_dir_all(&dir).unwrap();
}
