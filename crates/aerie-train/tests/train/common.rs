//! A tiny synthetic world: a target (config.json + a safetensors file with head and embedding),
//! a draft vocab file, captured shards whose teacher a drafter can learn, and
//! config text pointing at all of it.
#![allow(dead_code)]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use aerie_data::shard::{
    AuxConvention, HiddenDtype, SampleRef, ShardMetadata, ShardWriter, ShardWriterOptions, Teacher,
};
use aerie_model::checkpoint::io::write_safetensors;
use aerie_model::checkpoint::{Dtype, HostTensor, synthetic};
use aerie_train::{Event, RunOptions, Summary, TrainConfig, train};

pub type B = burn::backend::Autodiff<burn::backend::Flex>;

pub const H: usize = 32;
pub const V: usize = 128;
pub const VD: usize = 32;
pub const LAYERS: usize = 8;
pub const AUX: [usize; 3] = [1, 3, 4]; // [1, N/2-1, N-4] for N = 8

pub fn cpu() -> burn::backend::flex::FlexDevice {
    burn::backend::flex::FlexDevice
}

/// The fixtures' generator: aerie's own splitmix64.
pub use aerie_model::rng::SplitMix as Rng;

/// Paths of the synthetic world.
pub struct World {
    pub root: tempfile::TempDir,
    pub target_dir: PathBuf,
    pub target_file: PathBuf,
    pub vocab: PathBuf,
    pub train: PathBuf,
    pub eval: PathBuf,
    pub embed: Vec<f32>,
}

impl World {
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }
}

pub fn metadata() -> ShardMetadata {
    ShardMetadata {
        target: "tiny/target".into(),
        target_num_layers: LAYERS,
        target_vocab_size: V,
        aux_layer_ids: AUX.to_vec(),
        aux_convention: AuxConvention::OutputOfLayer,
        hidden_size: H,
        dtype: HiddenDtype::F32,
        tokenizer_digest: "0".repeat(64),
        chat_template: "none".into(),
        teacher: Teacher::FinalHidden,
        created_by: "aerie-train tests".into(),
        extra: Default::default(),
    }
}

/// Write `n` samples (lengths 8..=24) to `dir`, with a teacher the drafter can learn (see below).
pub fn write_shards(dir: &Path, n: usize, seed: u64, embed: &[f32], opts: ShardWriterOptions) {
    write_shards_of(dir, n, seed, embed, opts, Lengths::Any)
}

/// The sample lengths a world's shards take.
#[derive(Debug, Clone, Copy)]
pub enum Lengths {
    /// 8..=24: micro-batches of many shapes.
    Any,
    /// 14 or 16: every micro-batch padded to 16 (padding still exercised), so a backend that
    /// compiles and autotunes kernels per shape (CubeCL) meets few shapes.
    FewShapes,
}

/// [`write_shards`] with the lengths chosen by `lengths`.
pub fn write_shards_of(dir: &Path, n: usize, seed: u64, embed: &[f32], opts: ShardWriterOptions, lengths: Lengths) {
    let mut rng = Rng(seed);
    let mut w = ShardWriter::create(dir, metadata(), opts).unwrap();
    for i in 0..n {
        let draw = rng.next_u64();
        let len = match lengths {
            Lengths::Any => 8 + (draw % 17) as usize,
            Lengths::FewShapes => 14 + 2 * (draw % 2) as usize,
        };
        let ids: Vec<i32> = (0..len).map(|_| (rng.next_u64() % V as u64) as i32).collect();
        let mask: Vec<u8> = (0..len).map(|t| u8::from(t >= 2)).collect();
        let aux: Vec<f32> = (0..len * 3 * H).map(|_| rng.signed_unit()).collect();
        // Row t (the distribution of token t + 1) is the target head over `6 c + 3 aux_high[t-1]`:
        // a shared direction c (a marginal every sample teaches) plus the high aux feature the
        // drafter's step 0 sees at position t - 1.
        let fin: Vec<f32> = (0..len)
            .flat_map(|t| {
                let at = t.saturating_sub(1) * 3 * H;
                let hi = &aux[at + 2 * H..at + 3 * H];
                hi.iter().zip(&embed[5 * H..6 * H]).map(|(a, c)| 6.0 * c + 3.0 * a).collect::<Vec<f32>>()
            })
            .collect();
        w.push(
            SampleRef::new(&ids, &mask, &aux)
                .with_final_hidden(&fin)
                .with_sample_id(1000 + i as i64 + seed as i64 * 100_000),
        )
        .unwrap();
    }
    w.finish().unwrap();
}

pub fn world() -> World {
    world_with(ShardWriterOptions::default())
}

pub fn world_with(opts: ShardWriterOptions) -> World {
    world_of(opts, Lengths::Any)
}

/// [`world`] whose samples take `lengths`.
pub fn world_of(opts: ShardWriterOptions, lengths: Lengths) -> World {
    let root = tempfile::tempdir().unwrap();
    let target_dir = root.path().join("target");
    std::fs::create_dir_all(&target_dir).unwrap();
    let cfg = serde_json::json!({
        "_name_or_path": "tiny/target",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": H, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_hidden_layers": LAYERS, "vocab_size": V, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": false
    });
    std::fs::write(target_dir.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let mut rng = Rng(7);
    let embed: Vec<f32> = (0..V * H).map(|_| 0.5 * rng.signed_unit()).collect();
    let head: Vec<f32> = (0..V * H).map(|_| 0.5 * rng.signed_unit()).collect();
    let e = HostTensor::from_f32(vec![V, H], &embed, Dtype::F32);
    let h = HostTensor::from_f32(vec![V, H], &head, Dtype::F32);
    let target_file = root.path().join("target.safetensors");
    write_safetensors(&target_file, [("embed_tokens.weight", &e), ("lm_head.weight", &h)]).unwrap();
    // Also a model directory layout.
    write_safetensors(
        &target_dir.join("model.safetensors"),
        [("model.embed_tokens.weight", &e), ("lm_head.weight", &h)],
    )
    .unwrap();
    let vocab = root.path().join("vocab.safetensors");
    write_vocab(&vocab, 3);
    let train = root.path().join("train");
    let eval = root.path().join("eval");
    write_shards_of(&train, 24, 1, &embed, opts.clone(), lengths);
    write_shards_of(&eval, 6, 2, &embed, opts, lengths);
    World { root, target_dir, target_file, vocab, train, eval, embed }
}

/// A draft vocab file (d2t, t2d) of VD ids out of V chosen by `seed`.
pub fn write_vocab(path: &Path, seed: u64) {
    let (d2t, t2d) = synthetic::vocab_map(V, VD, seed);
    let d = HostTensor::from_i64(vec![VD], &d2t);
    let t = HostTensor::from_bool(vec![V], &t2d);
    write_safetensors(path, [("d2t", &d), ("t2d", &t)]).unwrap();
}

/// A fresh-init config over the world; `extra` is appended (more top-level keys go BEFORE the
/// tables, so pass them in `top`).
pub fn config_text(w: &World, out: &str, top: &str, extra: &str) -> String {
    format!(
        r#"seed = 3
output_dir = "{out}"
log_every = 1
{top}

[data]
train = ["{train}"]
eval = ["{eval}"]
batch_tokens = 64
bucket_window = 8

[init]
kind = "fresh"
target_config = "{tcfg}"
vocab = "{vocab}"

[target]
path = "{tfile}"

[optim]
lr = 1e-3
warmup_ratio = 0.1
{extra}
"#,
        out = w.path(out).display(),
        train = w.train.display(),
        eval = w.eval.display(),
        tcfg = w.target_dir.join("config.json").display(),
        vocab = w.vocab.display(),
        tfile = w.target_file.display(),
    )
}

pub fn config(w: &World, out: &str, top: &str, extra: &str) -> TrainConfig {
    TrainConfig::from_toml_str(&config_text(w, out, top, extra), Path::new("test.toml"), &[]).unwrap()
}

pub fn run(cfg: &TrainConfig, devices: usize, resume: Option<&Path>) -> aerie_train::Result<Summary> {
    let opts = RunOptions::<B> {
        devices: vec![cpu(); devices],
        resume: resume.map(Path::to_path_buf),
        all_reduce: None,
        selector: None,
    };
    train(cfg, &opts, &mut |_| ControlFlow::Continue(()))
}

/// Run, stopping (as a kill would) right after step `stop_after`.
pub fn run_until(cfg: &TrainConfig, stop_after: u64) -> Summary {
    run_until_on(cfg, 1, stop_after)
}

/// [`run_until`] on `devices` replicas.
pub fn run_until_on(cfg: &TrainConfig, devices: usize, stop_after: u64) -> Summary {
    let opts = RunOptions::<B> { devices: vec![cpu(); devices], resume: None, all_reduce: None, selector: None };
    train(cfg, &opts, &mut |e| match e {
        Event::Step(p) if p.step >= stop_after => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .unwrap()
}

/// Every tensor of a checkpoint's model.safetensors, by name, as raw bytes.
pub fn tensors(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<u8>)> = st.tensors().into_iter().map(|(k, v)| (k, v.data().to_vec())).collect();
    out.sort();
    out
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub fn metrics_lines(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The held-out metrics of the run's initial drafter (before any step), on `w.eval`: what a run's
/// later held-out loss is compared with.
pub fn initial_held_out(w: &World, cfg: &TrainConfig) -> aerie_model::ttt::TttMetrics {
    use aerie_model::ttt::eval::{EvalLossOptions, eval_loss};
    use aerie_model::{Drafter, TargetHead};
    use burn::tensor::{Tensor, TensorData};
    let init = aerie_train::init::initial_drafter(cfg).unwrap().checkpoint;
    let drafter = Drafter::<burn::backend::Flex>::from_tensors(&init.config, &init.tensors, &cpu()).unwrap();
    let head = aerie_model::checkpoint::load_target_head(&w.target_file).unwrap();
    let wt = Tensor::<burn::backend::Flex, 2>::from_data(TensorData::new(head.to_f32("h").unwrap(), [V, H]), &cpu());
    let head = TargetHead::new(wt, drafter.vocab(), 64);
    let data = aerie_data::shard::ShardDataset::open(&w.eval).unwrap();
    eval_loss(&drafter, &data, Some(&head), &EvalLossOptions::default(), &mut |_, _| {}).unwrap()
}
