//! Every validation error on load names the directory and the tensor, and all problems come at
//! once; accepted spellings (`model.` prefix, `layers.0`, shards) load to the same drafter.

use std::fs;

use aerie_model::checkpoint::io::{INDEX_FILE, write_safetensors};
use aerie_model::checkpoint::{Dialect, Dtype, HostTensor, TensorMap, keys, load_drafter};
use serde_json::json;

use crate::common::*;

/// Write the tiny drafter with `edit` applied to its SGLang file tensors, then load it.
fn load_edited(edit: impl FnOnce(&mut TensorMap)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("drafter");
    let mut t = file_tensors(&drafter(&tiny(), Dtype::BF16), Dialect::Sglang, false);
    edit(&mut t);
    write_raw(&dir, &config_json(&tiny(), Dialect::Sglang), &t);
    let e = err(load_drafter(&dir, None));
    assert!(e.contains("drafter: invalid checkpoint"), "{e}");
    e
}

#[test]
fn missing_key() {
    let e = load_edited(|t| {
        t.remove("midlayer.mlp.up_proj.weight");
    });
    assert!(e.contains("missing tensor `midlayer.mlp.up_proj.weight` (expected shape [96, 64] = [I, H])"), "{e}");
}

#[test]
fn unexpected_key() {
    let e = load_edited(|t| {
        t.insert("layers.1.mlp.up_proj.weight".into(), ramp(vec![96, 64], Dtype::BF16));
    });
    assert!(e.contains("unexpected tensor `layers.1.mlp.up_proj.weight`"), "{e}");
}

#[test]
fn wrong_shape_and_all_problems_at_once() {
    let e = load_edited(|t| {
        t.insert("midlayer.self_attn.q_proj.weight".into(), ramp(vec![128, 64], Dtype::BF16));
        t.insert("midlayer.self_attn.k_proj.weight".into(), ramp(vec![128, 128], Dtype::BF16));
        t.remove(keys::NORM);
    });
    assert!(
        e.contains("`midlayer.self_attn.q_proj.weight` has shape [128, 64], expected [128, 128] = [nH*d, 2H]"),
        "{e}"
    );
    assert!(
        e.contains("`midlayer.self_attn.k_proj.weight` has shape [128, 128], expected [64, 128] = [nKV*d, 2H]"),
        "{e}"
    );
    assert!(e.contains("missing tensor `norm.weight`"), "{e}");
}

#[test]
fn wrong_dtypes() {
    let e = load_edited(|t| {
        let d2t = t[keys::D2T].to_i64("d2t").unwrap();
        let as_i32 = HostTensor {
            dtype: Dtype::I32,
            shape: vec![64],
            data: d2t.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        };
        t.insert(keys::D2T.into(), as_i32);
        t.insert(keys::NORM.into(), HostTensor::from_i64(vec![64], &[0; 64]));
    });
    assert!(e.contains("`d2t` has dtype I32, expected I64"), "{e}");
    assert!(e.contains("`norm.weight` has dtype I64, expected a float type"), "{e}");
}

fn set_d2t(t: &mut TensorMap, f: impl FnOnce(&mut Vec<i64>)) {
    let mut d2t = t[keys::D2T].to_i64("d2t").unwrap();
    f(&mut d2t);
    t.insert(keys::D2T.into(), HostTensor::from_i64(vec![d2t.len()], &d2t));
}

#[test]
fn broken_d2t_invariants() {
    let e = load_edited(|t| set_d2t(t, |d| d[63] = 512 - 63)); // last draft id -> 512 = V
    assert!(e.contains("`d2t` maps 1 draft id(s) outside the target vocab 0..512, first: draft id 63 -> 512"), "{e}");
    let e = load_edited(|t| set_d2t(t, |d| d.swap(10, 11)));
    assert!(e.contains("not strictly ascending"), "{e}");
    // A valid d2t whose t2d marks other ids.
    let e = load_edited(|t| {
        let mut mask: Vec<bool> = t[keys::T2D].data.iter().map(|&b| b != 0).collect();
        let on = mask.iter().position(|&b| b).unwrap();
        let off = mask.iter().position(|&b| !b).unwrap();
        mask.swap(on, off);
        t.insert(keys::T2D.into(), HostTensor::from_bool(vec![512], &mask));
    });
    assert!(e.contains("`t2d` and `d2t` disagree"), "{e}");
    let e = load_edited(|t| {
        t.insert(keys::T2D.into(), HostTensor::from_bool(vec![512], &[true; 512]));
    });
    assert!(e.contains("`t2d` marks 512 target ids, expected draft_vocab_size 64"), "{e}");
}

#[test]
fn reduced_vocab_without_d2t() {
    let e = load_edited(|t| {
        t.remove(keys::D2T);
        t.remove(keys::T2D);
    });
    assert!(e.contains("draft_vocab_size 64 < vocab_size 512 but there is no `d2t`"), "{e}");
}

#[test]
fn full_vocab_without_d2t_is_identity_and_fine() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    cfg.draft_vocab_size = cfg.vocab_size;
    let ckpt = drafter(&cfg, Dtype::BF16);
    assert!(!ckpt.tensors.contains_key(keys::D2T));
    write_raw(tmp.path(), &config_json(&cfg, Dialect::Sglang), &file_tensors(&ckpt, Dialect::Sglang, false));
    load_drafter(tmp.path(), None).unwrap();
}

#[test]
fn aux_count_vs_fc_width() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    let t = file_tensors(&drafter(&cfg, Dtype::BF16), Dialect::Sglang, false);
    cfg.aux_layers.ids = vec![1, 6];
    write_raw(tmp.path(), &config_json(&cfg, Dialect::Sglang), &t);
    let e = err(load_drafter(tmp.path(), None));
    assert!(e.contains("`fc.weight` takes 192 in-features (3 aux features of target_hidden_size 64), but the config lists 2 aux layer ids [1, 6]"), "{e}");
}

#[test]
fn hidden_mismatch_without_target_hidden_size() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    cfg.target_hidden_size = 80;
    let t = file_tensors(&drafter(&cfg, Dtype::BF16), Dialect::Sglang, false);
    let mut c = config_json(&cfg, Dialect::Sglang);
    c.as_object_mut().unwrap().remove("target_hidden_size");
    write_raw(tmp.path(), &c, &t);
    let e = err(load_drafter(tmp.path(), None));
    assert!(e.contains("no target_hidden_size and hidden_size is 64: set target_hidden_size to 80"), "{e}");
}

#[test]
fn model_prefix_and_layers0_are_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let original = drafter(&tiny(), Dtype::BF16);
    let t: TensorMap = file_tensors(&original, Dialect::Speculators, true)
        .into_iter()
        .map(|(k, v)| (if k == keys::D2T || k == keys::T2D { k } else { format!("model.{k}") }, v))
        .collect();
    assert!(t.contains_key("model.layers.0.mlp.gate_proj.weight") && t.contains_key("model.lm_head.weight"));
    write_raw(tmp.path(), &config_json(&tiny(), Dialect::Sglang), &t);
    assert_eq!(load_drafter(tmp.path(), None).unwrap().tensors, original.tensors);
}

#[test]
fn duplicate_spellings_are_an_error() {
    let e = load_edited(|t| {
        let fc = t[keys::FC].clone();
        t.insert("model.fc.weight".into(), fc);
    });
    assert!(e.contains("file keys `fc.weight` and `model.fc.weight` both name `fc.weight`"), "{e}");
}

#[test]
fn sharded_index_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let original = drafter(&tiny(), Dtype::BF16);
    let all = file_tensors(&original, Dialect::Sglang, false);
    let (a, b): (TensorMap, TensorMap) = all.into_iter().partition(|(k, _)| k.starts_with("midlayer."));
    let mut weight_map = serde_json::Map::new();
    for (shard, part) in [("model-00001-of-00002.safetensors", &a), ("model-00002-of-00002.safetensors", &b)] {
        write_safetensors(&tmp.path().join(shard), part).unwrap();
        for k in part.keys() {
            weight_map.insert(k.clone(), json!(shard));
        }
    }
    fs::write(tmp.path().join(INDEX_FILE), json!({"metadata": {}, "weight_map": weight_map}).to_string()).unwrap();
    fs::write(tmp.path().join("config.json"), config_json(&tiny(), Dialect::Sglang).to_string()).unwrap();
    let mut want = original.tensors.clone();
    want.remove(keys::EMBED);
    assert_eq!(load_drafter(tmp.path(), None).unwrap().tensors, want);
}

#[test]
fn unknown_aux_ids_need_the_target() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("drafter");
    let original = drafter(&tiny(), Dtype::BF16);
    let mut c = config_json(&tiny(), Dialect::Sglang);
    c["eagle_config"].as_object_mut().unwrap().remove("eagle_aux_hidden_state_layer_ids");
    write_raw(&dir, &c, &file_tensors(&original, Dialect::Sglang, false));
    let e = err(load_drafter(&dir, None));
    assert!(e.contains("config.json") && e.contains("no aux layer ids"), "{e}");
    // A 10-layer target defaults to output of layers [1, 4, 6], tiny()'s own ids.
    let target = tmp.path().join("target");
    let emb = [("model.embed_tokens.weight".to_string(), original.tensors[keys::EMBED].clone())];
    write_target(&target, &tiny(), 10, &emb.into_iter().collect());
    let got = load_drafter(&dir, Some(&target)).unwrap();
    assert_eq!(got.config, tiny());
    assert_eq!(got.tensors, original.tensors);
}

#[test]
fn config_problems_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let e = err(load_drafter(tmp.path(), None));
    assert!(e.contains("config.json"), "{e}");
    fs::write(tmp.path().join("config.json"), "{ nope").unwrap();
    let e = err(load_drafter(tmp.path(), None));
    assert!(e.contains("config.json: not valid JSON"), "{e}");
    fs::write(tmp.path().join("config.json"), config_json(&tiny(), Dialect::Sglang).to_string()).unwrap();
    let e = err(load_drafter(tmp.path(), None));
    assert!(e.contains("no model.safetensors or model.safetensors.index.json"), "{e}");
}
