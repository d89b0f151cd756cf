//! Shared helpers: scratch directories, small deterministic samples, and surgery on written
//! shards and manifests to produce every kind of invalid dataset.
#![allow(dead_code)]

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use aerie_data::shard::{
    AuxConvention, HiddenDtype, Manifest, SampleRef, ShardMetadata, ShardWriter, ShardWriterOptions, Teacher,
};
use safetensors::{Dtype, View};

/// A scratch directory under cargo's per-target tmp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("aerie-data-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const LAYERS: usize = 3;
pub const HIDDEN: usize = 4;
pub const VOCAB: usize = 1000;

pub fn metadata(dtype: HiddenDtype, teacher: Teacher) -> ShardMetadata {
    ShardMetadata {
        target: "tiny/target".into(),
        target_num_layers: 8,
        target_vocab_size: VOCAB,
        aux_layer_ids: vec![1, 3, 4],
        aux_convention: AuxConvention::OutputOfLayer,
        hidden_size: HIDDEN,
        dtype,
        tokenizer_digest: "0123456789abcdef".repeat(4),
        chat_template: "chatml".into(),
        teacher,
        created_by: "aerie-data tests".into(),
        extra: BTreeMap::new(),
    }
}

/// An owned sample with values derived from `seed`.
#[derive(Debug, Clone)]
pub struct Sample {
    pub input_ids: Vec<i32>,
    pub loss_mask: Vec<u8>,
    pub aux: Vec<f32>,
    pub final_hidden: Option<Vec<f32>>,
    pub topk_ids: Vec<i32>,
    pub topk_logprobs: Vec<f32>,
    pub sample_id: Option<i64>,
}

impl Sample {
    pub fn new(seed: u64, len: usize, teacher: Teacher) -> Self {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let value = |x: u32| (x % 20_000) as f32 / 1000.0 - 10.0;
        let input_ids = (0..len).map(|_| (next() % VOCAB as u32) as i32).collect();
        let loss_mask = (0..len).map(|i| u8::from(i % 3 != 0)).collect();
        let aux = (0..len * LAYERS * HIDDEN).map(|_| value(next())).collect();
        let final_hidden = teacher.has_final_hidden().then(|| (0..len * HIDDEN).map(|_| value(next())).collect());
        let k = teacher.topk().unwrap_or(0);
        let topk_ids = (0..len * k).map(|_| (next() % VOCAB as u32) as i32).collect();
        let topk_logprobs = (0..len).flat_map(|_| (0..k).map(|j| -0.5 * j as f32 - 0.01)).collect();
        Self { input_ids, loss_mask, aux, final_hidden, topk_ids, topk_logprobs, sample_id: Some(seed as i64) }
    }

    pub fn as_ref(&self) -> SampleRef<'_> {
        let mut s = SampleRef::new(&self.input_ids, &self.loss_mask, &self.aux);
        if let Some(f) = &self.final_hidden {
            s = s.with_final_hidden(f);
        }
        if !self.topk_ids.is_empty() {
            s = s.with_topk(&self.topk_ids, &self.topk_logprobs);
        }
        s.sample_id = self.sample_id;
        s
    }

    pub fn masked(&self) -> u64 {
        self.loss_mask.iter().map(|&m| u64::from(m)).sum()
    }
}

/// Samples with ids `first..first + lens.len()` and the given lengths.
pub fn samples(first: u64, lens: &[usize], teacher: Teacher) -> Vec<Sample> {
    lens.iter().enumerate().map(|(i, &len)| Sample::new(first + i as u64, len, teacher)).collect()
}

pub fn options(shard_tokens: usize) -> ShardWriterOptions {
    ShardWriterOptions { shard_tokens, ..ShardWriterOptions::default() }
}

pub fn write(dir: &Path, meta: ShardMetadata, samples: &[Sample], shard_tokens: usize) -> Manifest {
    let mut writer = ShardWriter::create(dir, meta, options(shard_tokens)).unwrap();
    for s in samples {
        writer.push(s.as_ref()).unwrap();
    }
    writer.finish().unwrap()
}

/// What `x` becomes after storage as `dtype`.
pub fn quantize(x: f32, dtype: HiddenDtype) -> f32 {
    match dtype {
        HiddenDtype::F32 => x,
        HiddenDtype::F16 => half::f16::from_f32(x).to_f32(),
        HiddenDtype::BF16 => half::bf16::from_f32(x).to_f32(),
        scaled => panic!("{scaled} depends on the group's scale; see encodings.rs"),
    }
}

/// An owned tensor for rewriting shards.
#[derive(Debug, Clone)]
pub struct Owned {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl View for &Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

pub type Tensors = BTreeMap<String, Owned>;
pub type Meta = HashMap<String, String>;

/// Read a shard, let `edit` change its tensors and metadata, write it back.
pub fn rewrite_shard(path: &Path, edit: impl FnOnce(&mut Tensors, &mut Meta)) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, info) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = info.metadata().clone().unwrap_or_default();
    let mut tensors: Tensors = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let owned = Owned { dtype: t.dtype(), shape: t.shape().to_vec(), data: t.data().to_vec() };
            (name, owned)
        })
        .collect();
    edit(&mut tensors, &mut meta);
    let meta = (!meta.is_empty()).then_some(meta);
    safetensors::serialize_to_file(tensors.iter(), meta, path).unwrap();
}

/// Let `edit` change `manifest.json`.
pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("manifest.json");
    let mut value: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(&path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
}

pub fn i64_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}
