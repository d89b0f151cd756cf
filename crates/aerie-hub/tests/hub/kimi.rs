//! The AQ-MedAI Kimi-K2 drafter shape (H 7168, 64 heads of 128, I 18432, V 163840, Vd 32000,
//! aux [1, 29, 57]) at full size, without gigabytes: configs in both dialects, inspect on a
//! config-only directory, and inspect on a full-shape checkpoint whose weights are holes in a
//! sparse file (inspect reads headers and d2t/t2d only).

use std::fs;
use std::time::Instant;

use aerie_hub::inspect::CountSource;
use aerie_hub::{Severity, inspect};
use aerie_model::checkpoint::config::{read_config, write_config};
use aerie_model::checkpoint::{Dialect, Dtype, keys, synthetic, validate};
use aerie_model::{AuxConvention, DrafterConfig};
use serde_json::json;

use crate::common::*;

/// fc 7168x21504, q/k/v 8192x14336, o 7168x8192, MLP 3 x 18432x7168, lm_head 32000x7168,
/// 4 norms of 7168.
const KIMI_TRAINABLE: u64 = 1_190_948_864;
const KIMI_FROZEN: u64 = 163_840 * 7168;

fn write_kimi_target(dir: &std::path::Path) {
    fs::create_dir_all(dir).unwrap();
    let c = json!({"architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840,
                        "max_position_embeddings": 262144}});
    fs::write(dir.join("config.json"), c.to_string()).unwrap();
}

#[test]
fn kimi_config_in_both_dialects_parses_back_equal() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = DrafterConfig::kimi_k2_aq_medai();
    for (dialect, ids, conv) in [
        (Dialect::Sglang, vec![1, 29, 57], AuxConvention::OutputOfLayer),
        (Dialect::Speculators, vec![2, 30, 58], AuxConvention::InputOfLayer),
    ] {
        let path = tmp.path().join(format!("{dialect}.json"));
        write_config(&path, &cfg, dialect, Dtype::BF16).unwrap();
        let p = read_config(&path, None).unwrap();
        assert_eq!(p.dialect, dialect);
        assert_eq!((p.config.aux_layers.ids.clone(), p.config.aux_layers.convention), (ids, conv));
        let mut got = p.config.clone();
        got.aux_layers = cfg.aux_layers.clone();
        assert_eq!(got, cfg);
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains("num_nextn_predict_layers") && text.contains("\"torch_dtype\": \"bfloat16\""));
    }
}

#[test]
fn kimi_config_only_dir_reports_shapes_from_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = DrafterConfig::kimi_k2_aq_medai();
    write_config(&tmp.path().join("config.json"), &cfg, Dialect::Sglang, Dtype::BF16).unwrap();
    let r = inspect(tmp.path(), None).unwrap();
    assert_eq!(r.params_from, CountSource::Config);
    assert_eq!((r.trainable_params, r.frozen_params), (KIMI_TRAINABLE, KIMI_FROZEN));
    let fc = r.expected.iter().find(|e| e.name == keys::FC).unwrap();
    assert_eq!(fc.shape, vec![7168, 21504]);
    let head = r.expected.iter().find(|e| e.name == keys::LM_HEAD).unwrap();
    assert_eq!(head.shape, vec![32000, 7168]);
    assert!(r.findings.iter().any(|f| f.code == "no-weights" && f.severity == Severity::Error));
    assert!(
        r.findings.iter().any(|f| f.code == "missing-key" && f.message.contains("`midlayer.mlp.gate_proj.weight`"))
    );
    assert!(r.findings.iter().any(|f| f.code == "reduced-vocab-without-d2t"));
    assert_eq!(r.exit_code(false), 2);
    assert_eq!(r.aux.input_of_layer, vec![2, 30, 58]);
}

#[test]
fn kimi_full_shape_checkpoint_is_inspected_from_headers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("drafter");
    fs::create_dir_all(&dir).unwrap();
    let cfg = DrafterConfig::kimi_k2_aq_medai();
    write_config(&dir.join("config.json"), &cfg, Dialect::Sglang, Dtype::BF16).unwrap();
    let (d2t, t2d) = synthetic::vocab_map(cfg.vocab_size, cfg.draft_vocab_size, 3);
    let mut entries = vec![
        (keys::D2T.to_string(), Dtype::I64, vec![32000], Some(d2t.iter().flat_map(|v| v.to_le_bytes()).collect())),
        (keys::T2D.to_string(), Dtype::Bool, vec![163840], Some(t2d.iter().map(|&b| b as u8).collect())),
    ];
    for e in validate::expected_tensors(&cfg) {
        if e.kind == validate::ElemKind::Float && e.required {
            entries.push((e.name, Dtype::BF16, e.shape, None));
        }
    }
    write_sparse_safetensors(&dir.join("model.safetensors"), &entries);
    let target = tmp.path().join("kimi-k2.5");
    write_kimi_target(&target);

    let start = Instant::now();
    let r = inspect(&dir, Some(&target)).unwrap();
    // inspect reads each float tensor once, one at a time, for the loaders' finiteness check
    // (18.5 s alone on the 2-core test machine for these 2.4 GB): bounded, never all held.
    assert!(start.elapsed().as_secs() < 90, "inspect took {:?}", start.elapsed());
    assert!(r.findings.iter().all(|f| f.code == "no-target-embedding"), "{:?}", r.findings);
    assert_eq!(r.params_from, CountSource::Weights);
    assert_eq!((r.trainable_params, r.frozen_params), (KIMI_TRAINABLE, KIMI_FROZEN));
    assert_eq!(r.aux.target_num_layers, Some(61));
    let stats = r.vocab.d2t.unwrap();
    assert_eq!(stats.first_target_id, d2t[0]);
    assert_eq!(stats.last_target_id, 31999 + d2t[31999]);
}
