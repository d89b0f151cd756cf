//! Helpers: synthetic drafters written to temporary directories, raw (unvalidated) writers for
//! broken checkpoints, and a sparse-file writer for full-size headers without full-size data.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use aerie_model::DrafterConfig;
use aerie_model::checkpoint::{
    Dialect, DrafterCheckpoint, Dtype, HostTensor, SaveOptions, TensorMap, config, io, keys, save_drafter, synthetic,
};
use serde_json::{Value, json};

/// The scaled-down drafter: H 64, 4 heads of 32 / 2 KV, I 96, V 512, Vd 64, aux [1, 4, 6].
pub fn tiny() -> DrafterConfig {
    synthetic::tiny_config()
}

/// A valid synthetic drafter in `dtype`.
pub fn drafter(cfg: &DrafterConfig, dtype: Dtype) -> DrafterCheckpoint {
    synthetic::random_drafter(cfg, dtype, 42)
}

/// Save `ckpt` through aerie's own writer (validated), without the embedding.
pub fn save(ckpt: &DrafterCheckpoint, dir: &Path, dialect: Dialect) {
    let opts = SaveOptions { dialect, ..SaveOptions::default() };
    save_drafter(ckpt, dir, &opts).unwrap();
}

/// The config JSON of `cfg` in `dialect`.
pub fn config_json(cfg: &DrafterConfig, dialect: Dialect) -> Value {
    config::to_json(cfg, dialect, Dtype::BF16, Path::new("config.json")).unwrap()
}

/// `ckpt`'s tensors under `dialect`'s file keys (embedding left out unless `with_embed`).
pub fn file_tensors(ckpt: &DrafterCheckpoint, dialect: Dialect, with_embed: bool) -> TensorMap {
    ckpt.tensors
        .iter()
        .filter(|(k, _)| with_embed || k.as_str() != keys::EMBED)
        .map(|(k, t)| (keys::file_key(k, dialect), t.clone()))
        .collect()
}

/// Write a checkpoint without any validation (to build broken ones).
pub fn write_raw(dir: &Path, config: &Value, tensors: &TensorMap) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("config.json"), serde_json::to_string_pretty(config).unwrap()).unwrap();
    io::write_safetensors(&dir.join(io::SINGLE_FILE), tensors).unwrap();
}

/// A target model directory: `config.json` with `layers` decoder layers plus the given tensors.
pub fn write_target(dir: &Path, cfg: &DrafterConfig, layers: usize, tensors: &TensorMap) {
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": layers,
        "hidden_size": cfg.target_hidden_size,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": false,
    });
    write_raw(dir, &config, tensors);
}

/// The error text of a failed call (panics on success).
pub fn err<T: std::fmt::Debug, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// A float tensor of `shape` filled with a ramp, in `dtype`.
pub fn ramp(shape: Vec<usize>, dtype: Dtype) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (i % 97) as f32 / 97.0).collect();
    HostTensor::from_f32(shape, &v, dtype)
}

/// One entry of [`write_sparse_safetensors`]: key, dtype, shape, and the bytes if stored.
pub type SparseEntry = (String, Dtype, Vec<usize>, Option<Vec<u8>>);

/// Write a safetensors file whose header declares every entry at full size, but store data only
/// for entries that carry bytes; the rest is a hole in a sparse file (no disk, no RAM).
pub fn write_sparse_safetensors(path: &Path, entries: &[SparseEntry]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    let mut placed = Vec::new();
    for (key, dtype, shape, data) in entries {
        let len = shape.iter().product::<usize>() * dtype.size();
        if let Some(d) = data {
            assert_eq!(d.len(), len, "{key}");
        }
        header.insert(
            key.clone(),
            json!({"dtype": dtype.safetensors_name(), "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        placed.push((offset, data));
        offset += len;
    }
    let mut h = Value::Object(header).to_string().into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = fs::File::create(path).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    let base = 8 + h.len() as u64;
    for (off, data) in placed {
        if let Some(d) = data {
            f.seek(SeekFrom::Start(base + off as u64)).unwrap();
            f.write_all(d).unwrap();
        }
    }
    f.set_len(base + offset as u64).unwrap();
}
