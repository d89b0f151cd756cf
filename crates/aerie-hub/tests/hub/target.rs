//! What a drafter takes from its target: the embedding (dir, shards, `language_model.`, plain
//! file), the head (tied or not), the layer count.

use std::fs;

use aerie_model::checkpoint::io::{INDEX_FILE, write_safetensors};
use aerie_model::checkpoint::{
    Dialect, Dtype, TensorMap, keys, load_drafter_with_notes, load_target_head, target_num_layers,
};
use serde_json::json;

use crate::common::*;

fn one(key: &str, t: &aerie_model::checkpoint::HostTensor) -> TensorMap {
    TensorMap::from([(key.to_string(), t.clone())])
}

#[test]
fn embedding_from_target_dir_file_and_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let original = drafter(&tiny(), Dtype::BF16);
    let emb = original.tensors[keys::EMBED].clone();
    let dir = tmp.path().join("drafter");
    save(&original, &dir, Dialect::Sglang);

    // A plain model directory.
    let plain = tmp.path().join("plain");
    write_target(&plain, &tiny(), 10, &one("model.embed_tokens.weight", &emb));
    let l = load_drafter_with_notes(&dir, Some(&plain)).unwrap();
    assert_eq!(l.checkpoint.tensors, original.tensors);
    assert!(l.notes.iter().any(|n| n.contains("taken from the target")), "{:?}", l.notes);

    // A sharded multimodal target (Kimi-K2.5 layout: `language_model.` prefix).
    let kimi = tmp.path().join("kimi");
    write_target(&kimi, &tiny(), 10, &TensorMap::new());
    fs::remove_file(kimi.join("model.safetensors")).unwrap();
    let head = ramp(vec![512, 64], Dtype::BF16);
    write_safetensors(&kimi.join("model-1.safetensors"), &one("language_model.lm_head.weight", &head)).unwrap();
    write_safetensors(&kimi.join("model-2.safetensors"), &one("language_model.model.embed_tokens.weight", &emb))
        .unwrap();
    let index = json!({"weight_map": {
        "language_model.lm_head.weight": "model-1.safetensors",
        "language_model.model.embed_tokens.weight": "model-2.safetensors"}});
    fs::write(kimi.join(INDEX_FILE), index.to_string()).unwrap();
    assert_eq!(load_drafter_with_notes(&dir, Some(&kimi)).unwrap().checkpoint.tensors, original.tensors);
    assert_eq!(load_target_head(&kimi).unwrap(), head);

    // A plain safetensors file.
    for key in ["embed_tokens.weight", "model.embed_tokens.weight"] {
        let file = tmp.path().join(format!("{key}.safetensors"));
        write_safetensors(&file, &one(key, &emb)).unwrap();
        assert_eq!(load_drafter_with_notes(&dir, Some(&file)).unwrap().checkpoint.tensors, original.tensors);
    }

    // A target without an embedding is an error naming it.
    let file = tmp.path().join("head.safetensors");
    write_safetensors(&file, &one("lm_head.weight", &head)).unwrap();
    let e = err(load_drafter_with_notes(&dir, Some(&file)));
    assert!(e.contains("head.safetensors") && e.contains("no target embedding"), "{e}");
    // A target whose embedding does not fit the drafter is named as the one at fault.
    let wrong = tmp.path().join("wrong.safetensors");
    let bad = ramp(vec![500, 64], Dtype::BF16);
    write_safetensors(&wrong, &one("embed_tokens.weight", &bad)).unwrap();
    let e = err(load_drafter_with_notes(&dir, Some(&wrong)));
    assert!(e.contains("wrong.safetensors has an embedding of [500, 64]") && e.contains("[512, 64]"), "{e}");
}

#[test]
fn target_head_tied_untied_and_file() {
    let tmp = tempfile::tempdir().unwrap();
    let emb = ramp(vec![512, 64], Dtype::BF16);
    let head = ramp(vec![512, 64], Dtype::F32);
    let both: TensorMap =
        [("model.embed_tokens.weight".to_string(), emb.clone()), ("lm_head.weight".to_string(), head.clone())].into();

    let untied = tmp.path().join("untied");
    write_target(&untied, &tiny(), 10, &both);
    assert_eq!(load_target_head(&untied).unwrap(), head);

    let tied = tmp.path().join("tied");
    write_target(&tied, &tiny(), 10, &both);
    let mut c: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(tied.join("config.json")).unwrap()).unwrap();
    c["tie_word_embeddings"] = json!(true);
    fs::write(tied.join("config.json"), c.to_string()).unwrap();
    assert_eq!(load_target_head(&tied).unwrap(), emb);

    let headless = tmp.path().join("headless");
    write_target(&headless, &tiny(), 10, &one("model.embed_tokens.weight", &emb));
    assert_eq!(load_target_head(&headless).unwrap(), emb);

    let file = tmp.path().join("lm_head.safetensors");
    write_safetensors(&file, &one("lm_head.weight", &head)).unwrap();
    assert_eq!(load_target_head(&file).unwrap(), head);
    let file = tmp.path().join("emb.safetensors");
    write_safetensors(&file, &one("embed_tokens.weight", &emb)).unwrap();
    let e = err(load_target_head(&file));
    assert!(e.contains("emb.safetensors") && e.contains("no target head"), "{e}");
}

#[test]
fn target_layer_count_top_level_or_text_config() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("config.json"), json!({"num_hidden_layers": 30}).to_string()).unwrap();
    assert_eq!(target_num_layers(tmp.path()).unwrap(), 30);
    let kimi = json!({"architectures": ["KimiK25ForConditionalGeneration"],
                      "text_config": {"num_hidden_layers": 61, "hidden_size": 7168}});
    fs::write(tmp.path().join("config.json"), kimi.to_string()).unwrap();
    assert_eq!(target_num_layers(tmp.path()).unwrap(), 61);
    fs::write(tmp.path().join("config.json"), "{}").unwrap();
    let e = err(target_num_layers(tmp.path()));
    assert!(e.contains("config.json") && e.contains("num_hidden_layers"), "{e}");
}
