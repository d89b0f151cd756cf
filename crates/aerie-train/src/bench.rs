//! Throughput and peak memory of the TTT objective's forward(+backward) for a drafter shape (a
//! named one, or the one a training config describes), with the analytic FLOP count to say how far
//! from the machine's peak it runs (`aerie bench ttt`, `aerie bench train`). It lives beside the
//! trainer because it times the trainer's own loss ([`crate::objective::micro_loss`]) on the
//! drafter the trainer would build ([`crate::init::drafter_config`]).
//!
//! Inputs are synthetic: random aux features and token ids, a random teacher over the draft
//! vocabulary. The frozen target embedding is only looked up, so for very large vocabularies
//! (V·H above 2^28 values) it is cut to fewer rows, which changes no FLOP count (`embed_rows` in
//! the report says so).

use std::path::Path;
use std::time::Instant;

use aerie_data::vocab::DraftVocab;
use aerie_model::init::init_tensors;
use aerie_model::{Drafter, DrafterConfig, TeacherTargets, TttBatch, TttOptions, ttt_forward};
use burn::tensor::activation::softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use serde::Serialize;

use crate::config::Precision;
use crate::init::drafter_config;
use crate::objective::{BatchMasks, Normalisers, micro_loss};
use crate::replay::Replay;
use crate::{Error, LossKind, Result, TrainConfig};

/// Named drafter shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// SmolLM2-135M-sized (H 576, 9/3 heads of 64, I 1536, Vd 8192).
    Smollm2,
    /// The AQ-MedAI Kimi-K2 drafter layer (H 7168, 64 heads of 128, I 18432, Vd 32000).
    Kimi,
}

/// What to measure: a drafter, a sequence length, a TTT length and a loss.
#[derive(Debug, Clone)]
pub struct TttBenchSpec {
    /// The drafter's shape.
    pub config: DrafterConfig,
    /// Its name in the report.
    pub name: String,
    /// Sequence length L.
    pub seq_len: usize,
    /// Unrolled steps and their weights.
    pub ttt: TttOptions,
    /// The training loss.
    pub loss: LossKind,
    /// Activation dtype over f32 weights.
    pub precision: Precision,
    /// β of `optim.replay_weight`: above 0 the step also walks the hits and adds the replay
    /// term, as training does (its host read of the hits is part of what is timed).
    pub replay_weight: f64,
}

impl TttBenchSpec {
    /// A named shape with the soft-CE loss at `ttt_length` geometric steps (weights 0.8^k).
    pub fn named(shape: Shape, seq_len: usize, ttt_length: usize, precision: Precision) -> Self {
        let (config, name) = match shape {
            Shape::Smollm2 => (DrafterConfig::smollm2_135m(8192), "smollm2-135m"),
            Shape::Kimi => (DrafterConfig::kimi_k2_aq_medai(), "kimi-k2-aq-medai"),
        };
        Self {
            config,
            name: name.into(),
            seq_len,
            ttt: TttOptions::geometric(ttt_length, 0.8).with_alpha_grad(false),
            loss: LossKind::SoftCe,
            precision,
            replay_weight: 0.0,
        }
    }

    /// The drafter shape, K, step weights, loss and precision of the training config at `path`
    /// (with `--set` overrides); L is `seq_len`, else `data.max_length`, else `data.batch_tokens`
    /// (one sequence filling a micro-batch). Reads only the config and the `config.json`/vocab
    /// files it names, no weights or shards.
    pub fn from_config(path: &Path, sets: &[(String, String)], seq_len: Option<usize>) -> Result<Self> {
        let cfg = TrainConfig::load(path, sets)?;
        let config = drafter_config(&cfg)?;
        let seq_len = seq_len.or(cfg.data.max_length).unwrap_or(cfg.data.batch_tokens);
        let name = path.file_stem().map_or_else(|| "config".into(), |s| s.to_string_lossy().into_owned());
        Ok(Self {
            config,
            name,
            seq_len,
            ttt: cfg.ttt_options(),
            loss: cfg.loss,
            precision: cfg.precision,
            replay_weight: cfg.optim.replay_weight,
        })
    }
}

/// How to run it.
#[derive(Debug, Clone, Copy)]
pub struct TttBenchOptions {
    /// Sequences per step.
    pub batch: usize,
    /// Timed iterations.
    pub steps: usize,
    /// Untimed warm-up iterations.
    pub warmup: usize,
    /// Time the forward only.
    pub forward_only: bool,
}

/// Result of one benchmark (`aerie bench ttt|train --json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct TttBench {
    /// The burn backend's name.
    pub backend: String,
    /// The spec's name.
    pub shape: String,
    /// L.
    pub seq_len: usize,
    /// Sequences per step.
    pub batch: usize,
    /// K.
    pub ttt_length: usize,
    /// The loss timed.
    pub loss: LossKind,
    /// β of the replay term timed with it (0: none).
    pub replay_weight: f64,
    /// Activation dtype.
    pub precision: Precision,
    /// Whether the backward was timed too.
    pub backward: bool,
    /// rayon threads (`RAYON_NUM_THREADS`, else the machine's parallelism).
    pub threads: usize,
    /// Parameters trained (all but the frozen embedding and the vocabulary maps).
    pub trainable_params: usize,
    /// Rows of the target embedding built (fewer than V for huge vocabularies).
    pub embed_rows: usize,
    /// Wall seconds of each timed step.
    pub step_seconds: Vec<f64>,
    /// Their median.
    pub median_step_seconds: f64,
    /// Process CPU time (all threads) per timed step, median.
    pub median_step_cpu_seconds: f64,
    /// B·L / median step.
    pub tokens_per_second: f64,
    /// Analytic FLOPs per token (3× the forward's with the backward).
    pub flops_per_token: f64,
    /// FLOPs per token × tokens/s.
    pub achieved_gflops: f64,
    /// Peak resident memory of the process (`VmHWM`), where /proc has it.
    pub peak_rss_mib: Option<f64>,
}

/// Matmul FLOPs per token of the TTT forward at sequence length `l` (attention counted over the
/// causal half plus the diagonal keys); backward costs about twice the forward.
pub fn ttt_flops_per_token(c: &DrafterConfig, l: usize, k: usize) -> f64 {
    let (h, d, i) = (c.hidden_size as f64, c.head_dim as f64, c.intermediate_size as f64);
    let (nh, nkv) = (c.num_attention_heads as f64, c.num_key_value_heads as f64);
    let fc = 2.0 * (c.num_aux() * c.target_hidden_size) as f64 * h;
    let proj = 2.0 * 2.0 * h * (nh + 2.0 * nkv) * d + 2.0 * nh * d * h;
    let mlp = 3.0 * 2.0 * h * i;
    let head = 2.0 * h * c.draft_vocab_size as f64;
    let per_step_attn = |step: usize| 2.0 * 2.0 * nh * d * ((l as f64 + 1.0) / 2.0 + step as f64);
    fc + (0..k).map(|s| proj + mlp + head + per_step_attn(s)).sum::<f64>()
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// User + system CPU seconds of this process so far (all threads; 0 where /proc is missing).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // Fields after the parenthesised command name: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Target embedding rows the benchmark builds: the whole vocabulary unless V·H passes 2^28.
fn embed_rows(c: &DrafterConfig) -> usize {
    const MAX_VALUES: usize = 1 << 28;
    if c.vocab_size * c.hidden_size <= MAX_VALUES {
        c.vocab_size
    } else {
        (MAX_VALUES / c.hidden_size).max(c.draft_vocab_size)
    }
}

/// Time `opts.steps` forward(+backward) passes of the TTT objective of `spec` on `device`, after
/// `opts.warmup` untimed ones.
pub fn bench_ttt<B: AutodiffBackend>(
    spec: &TttBenchSpec,
    opts: &TttBenchOptions,
    device: &B::Device,
) -> Result<TttBench> {
    if opts.steps == 0 {
        return Err(Error::Options("--steps must be at least 1".into()));
    }
    let mut config = spec.config.clone();
    let rows = embed_rows(&config);
    config.vocab_size = rows;
    // The draft vocabulary: every (V / Vd)-th target id, enough to exercise d2t.
    let stride = config.vocab_size / config.draft_vocab_size;
    let vocab =
        DraftVocab::from_target_ids((0..config.draft_vocab_size).map(|j| j * stride).collect(), config.vocab_size)
            .map_err(|e| Error::Options(format!("the benchmark's draft vocabulary: {e}")))?;
    let tensors = init_tensors(&config, &vocab, None, 0);
    let trainable_params = tensors
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "embed_tokens.weight" | "d2t" | "t2d"))
        .map(|(_, t)| t.numel())
        .sum();
    let drafter = Drafter::<B>::from_tensors(&config, &tensors, device)?;
    drop(tensors);
    let (b, l, vd) = (opts.batch, spec.seq_len, config.draft_vocab_size);
    B::seed(device, 0);
    let aw = config.num_aux() * config.target_hidden_size;
    // A teacher with some peak: softmax of N(0, 2²) logits over the draft vocabulary.
    let p = softmax(Tensor::<B::InnerBackend, 3>::random([b, l, vd], Distribution::Normal(0.0, 2.0), device), 2);
    let batch = TttBatch::<B> {
        input_ids: Tensor::<B, 2, Int>::random([b, l], Distribution::Uniform(0.0, config.vocab_size as f64), device),
        loss_mask: Tensor::ones([b, l], device),
        valid: Tensor::ones([b, l], device),
        // The trainer's cast (`Trainer::with_compute_dtype`): aux features enter in the compute dtype.
        aux: Tensor::<B, 3>::random([b, l, aw], Distribution::Normal(0.0, 1.0), device).cast(spec.precision.dtype()),
        teacher: TeacherTargets {
            pf: Tensor::from_inner(p.clone().mul_scalar(0.9)),
            p: Tensor::from_inner(p),
            in_draft: Tensor::ones([b, l], device),
        },
    };
    let masks = BatchMasks::of(&batch);
    let norm = Normalisers::of(&[&masks], spec.ttt.ttt_length);
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    for i in 0..opts.warmup + opts.steps {
        let (start, cpu0) = (Instant::now(), cpu_seconds());
        let out = aerie_model::autodiff::record(|| ttt_forward(&drafter, &batch, &spec.ttt))?;
        if opts.forward_only {
            let _ = out.loss.into_data();
        } else {
            let loss = aerie_model::autodiff::record(|| {
                let replay = (spec.replay_weight > 0.0).then(|| Replay::of(&out, &masks));
                let extra =
                    replay.and_then(|r| r.term(&out, &spec.ttt.step_weights, norm.positions, spec.replay_weight));
                micro_loss(spec.loss, &out, &batch, &masks, &norm, &spec.ttt.step_weights, extra)
            });
            let grads = aerie_model::autodiff::backward(loss);
            let g = drafter.lm_head.weight.grad(&grads).expect("lm_head gradient");
            let _ = g.sum().into_data();
        }
        B::sync(device).map_err(|e| Error::Options(format!("{}: {e:?}", B::name(device))))?;
        if i >= opts.warmup {
            times.push(start.elapsed().as_secs_f64());
            cpu.push(cpu_seconds() - cpu0);
        }
    }
    let median_step = median(&times);
    let fwd = ttt_flops_per_token(&config, l, spec.ttt.ttt_length);
    let flops_per_token = if opts.forward_only { fwd } else { 3.0 * fwd };
    let tokens_per_second = (b * l) as f64 / median_step;
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    Ok(TttBench {
        backend: B::name(device),
        shape: spec.name.clone(),
        seq_len: l,
        batch: b,
        ttt_length: spec.ttt.ttt_length,
        loss: spec.loss,
        replay_weight: spec.replay_weight,
        precision: spec.precision,
        backward: !opts.forward_only,
        threads,
        trainable_params,
        embed_rows: rows,
        step_seconds: times,
        median_step_seconds: median_step,
        median_step_cpu_seconds: median(&cpu),
        tokens_per_second,
        flops_per_token,
        achieved_gflops: flops_per_token * tokens_per_second / 1e9,
        peak_rss_mib: peak_rss_mib(),
    })
}
