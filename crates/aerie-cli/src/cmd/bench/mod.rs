//! `aerie bench generate`: batched generation of the native target ([`generate`]).
//!
//! `aerie bench shards`: read and decode rate of a shard dataset against the disk (see
//! `aerie_data::shard::bench`).
//!
//! `aerie bench ttt` / `aerie bench train`: forward(+backward) throughput and peak memory of the
//! TTT objective for a drafter shape (a named one, or the one a training config describes), with
//! the analytic FLOP count to say how far from the machine's peak it runs.
//!
//! Inputs are synthetic: random aux features and token ids, a random teacher over the draft
//! vocabulary. The frozen target embedding is only looked up, so for very large vocabularies
//! (V·H above 2^28 values) it is cut to fewer rows, which changes no FLOP count (`embed_rows` in
//! the report says so).

mod generate;

use std::path::PathBuf;
use std::time::Instant;

use aerie_data::vocab::DraftVocab;
use aerie_model::init::init_tensors;
use aerie_model::{Drafter, DrafterConfig, TttBatch, TttOptions, ttt_forward};
use aerie_train::LossKind;
use aerie_train::TrainConfig;
use aerie_train::config::Precision;
use aerie_train::init::drafter_config;
use aerie_train::objective::{BatchMasks, Normalisers, micro_loss};
use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use burn::tensor::activation::softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use crate::cmd::common::parse_set;
use crate::device::DeviceArg;

/// `aerie bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Throughput of the training-time-test forward and backward for a named drafter shape.
    Ttt(TttArgs),
    /// The same measurement for the drafter, TTT length, loss and sequence length of a training
    /// config (reads only the config and the `config.json`/vocab files it names, no weights or
    /// shards).
    Train(TrainBenchArgs),
    /// Read and decode rate of a shard dataset (the fused batch decode of training and
    /// evaluation) against the disk's sequential read of the same files.
    Shards(ShardsBenchArgs),
    /// Tokenizer load time and single-threaded encode throughput on a JSON list of texts, with
    /// a digest of the ids (compare with `scripts/bench_tokenizer.py` for python tiktoken).
    Tokenizer(TokenizerBenchArgs),
    /// Tokens/s of the native target's batched greedy generation at several batch sizes, beside
    /// the machine's bandwidth and matmul limits.
    Generate(generate::GenerateBenchArgs),
}

/// Arguments of `aerie bench shards`.
#[derive(Debug, Args)]
pub struct ShardsBenchArgs {
    /// Shard directory (`aerie capture --out`, `aerie shards convert --out`).
    pub dir: PathBuf,
    /// Tokens per gathered batch.
    #[arg(long, default_value_t = 16_384)]
    pub batch_tokens: usize,
    /// Drop the page cache before each pass (needs root), so that both passes read the disk.
    #[arg(long)]
    pub drop_caches: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn bench_shards(a: &ShardsBenchArgs) -> Result<()> {
    use aerie_data::shard::bench::{BenchOptions, bench_shards};
    let opts = BenchOptions { batch_tokens: a.batch_tokens, drop_caches: a.drop_caches };
    let r = bench_shards(&a.dir, &opts)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} ({} {}, {} shards, {} tokens, {:.0} B/token, {} cache, {} threads)\n  read:   {:.3} GB/s, {:.0} tokens/s\n  decode: {:.3} GB/s of file, {:.0} tokens/s ({:.2} GB/s of f32 batches), {:.2}× the read rate",
            a.dir.display(),
            r.dtype,
            r.teacher,
            r.shards,
            r.tokens,
            r.bytes_per_token,
            if r.cold_cache { "cold" } else { "warm (pass 2 reads pages pass 1 cached)" },
            r.threads,
            r.read_gb_per_second,
            r.read_tokens_per_second,
            r.decode_gb_per_second,
            r.decode_tokens_per_second,
            r.decoded_gb_per_second,
            r.decode_over_read,
        );
    }
    Ok(())
}

/// `aerie bench tokenizer`.
#[derive(Debug, Args)]
pub struct TokenizerBenchArgs {
    /// Tokenizer directory (tokenizer.json, or tiktoken.model of the Kimi family) or hub id.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub tokenizer: PathBuf,
    /// A JSON array of strings (`scripts/bench_tokenizer.py --texts-out` writes ShareGPT's).
    #[arg(long)]
    pub texts: PathBuf,
    /// Loads and passes over the texts; the best time of each is reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Named drafter shapes.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shape {
    /// SmolLM2-135M-sized (H 576, 9/3 heads of 64, I 1536, Vd 8192).
    Smollm2,
    /// The AQ-MedAI Kimi-K2 drafter layer (H 7168, 64 heads of 128, I 18432, Vd 32000).
    Kimi,
}

/// CPU backends to compare.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum CpuBackend {
    /// burn-flex (default).
    Flex,
    /// burn-ndarray (needs the `ndarray` feature).
    Ndarray,
}

/// What every benchmark takes besides the drafter.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Sequences per step.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Timed iterations.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Time the forward only.
    #[arg(long)]
    pub forward_only: bool,
    /// CPU backend.
    #[arg(long, value_enum, default_value = "flex")]
    pub backend: CpuBackend,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `aerie bench ttt`.
#[derive(Debug, Args)]
pub struct TttArgs {
    /// Drafter shape.
    #[arg(long, value_enum, default_value = "smollm2")]
    pub shape: Shape,
    /// Sequence length L.
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    /// Unrolled steps K.
    #[arg(long, default_value_t = 7)]
    pub ttt_length: usize,
    /// Activation dtype over f32 weights (`f32` or `bf16`), as the training config's `precision`
    /// key.
    #[arg(long, default_value = "f32")]
    pub precision: Precision,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Arguments of `aerie bench train`.
#[derive(Debug, Args)]
pub struct TrainBenchArgs {
    /// Training config (TOML), as for `aerie train`.
    pub config: PathBuf,
    /// Override a config key (repeatable), as for `aerie train`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Sequence length L (default: the config's `data.max_length`, else `data.batch_tokens`: one
    /// sequence filling a micro-batch).
    #[arg(long)]
    pub seq_len: Option<usize>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Result of one benchmark.
#[derive(Debug, Serialize)]
pub struct TttBench {
    backend: String,
    shape: String,
    seq_len: usize,
    batch: usize,
    ttt_length: usize,
    loss: LossKind,
    precision: Precision,
    backward: bool,
    threads: usize,
    trainable_params: usize,
    embed_rows: usize,
    step_seconds: Vec<f64>,
    median_step_seconds: f64,
    /// Process CPU time (all threads) per timed step, median.
    median_step_cpu_seconds: f64,
    tokens_per_second: f64,
    flops_per_token: f64,
    achieved_gflops: f64,
    peak_rss_mib: Option<f64>,
}

/// One benchmark to run.
struct Spec {
    config: DrafterConfig,
    name: String,
    seq_len: usize,
    ttt: TttOptions,
    loss: LossKind,
    precision: Precision,
}

/// Run `aerie bench`.
pub fn run(cmd: BenchCommand) -> Result<()> {
    let (spec, run) = match cmd {
        BenchCommand::Ttt(a) => {
            let (config, name) = match a.shape {
                Shape::Smollm2 => (DrafterConfig::smollm2_135m(8192), "smollm2-135m"),
                Shape::Kimi => (DrafterConfig::kimi_k2_aq_medai(), "kimi-k2-aq-medai"),
            };
            let spec = Spec {
                config,
                name: name.into(),
                seq_len: a.seq_len,
                ttt: TttOptions::geometric(a.ttt_length, 0.8).with_alpha_grad(false),
                loss: LossKind::SoftCe,
                precision: a.precision,
            };
            (spec, a.run)
        }
        BenchCommand::Train(a) => (train_spec(&a)?, a.run),
        BenchCommand::Shards(a) => return bench_shards(&a),
        BenchCommand::Tokenizer(a) => return bench_tokenizer(&a),
        BenchCommand::Generate(a) => return generate::run(&a),
    };
    let report = match (run.device, run.backend) {
        (DeviceArg::Cpu, CpuBackend::Flex) => bench::<Autodiff<burn::backend::Flex>>(&spec, &run, &Default::default())?,
        #[cfg(feature = "ndarray")]
        (DeviceArg::Cpu, CpuBackend::Ndarray) => {
            bench::<Autodiff<burn::backend::NdArray>>(&spec, &run, &Default::default())?
        }
        #[cfg(not(feature = "ndarray"))]
        (DeviceArg::Cpu, CpuBackend::Ndarray) => bail!("built without the `ndarray` feature"),
        #[cfg(feature = "cuda")]
        (DeviceArg::Cuda(i), _) => {
            bench::<Autodiff<burn::backend::Cuda>>(&spec, &run, &burn::backend::cuda::CudaDevice::new(i))?
        }
        #[cfg(not(feature = "cuda"))]
        (DeviceArg::Cuda(_), _) => bail!("built without CUDA: rebuild with `--features cuda`"),
    };
    if run.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} {} L={} B={} K={} {} {:?}: {:.1} tokens/s ({:.3} s/step, {:.2} CPU s/step), {:.2} GFLOP/token, {:.1} GFLOP/s, peak RSS {}",
            report.backend,
            report.shape,
            report.seq_len,
            report.batch,
            report.ttt_length,
            if report.backward { "fwd+bwd" } else { "fwd" },
            report.precision,
            report.tokens_per_second,
            report.median_step_seconds,
            report.median_step_cpu_seconds,
            report.flops_per_token / 1e9,
            report.achieved_gflops,
            report.peak_rss_mib.map_or("n/a".into(), |m| format!("{m:.0} MiB")),
        );
    }
    Ok(())
}

fn bench_tokenizer(a: &TokenizerBenchArgs) -> Result<()> {
    let bytes = std::fs::read(&a.texts).with_context(|| format!("cannot read {}", a.texts.display()))?;
    let texts: Vec<String> = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not a JSON array of strings", a.texts.display()))?;
    let m = aerie_data::tokenizer::measure(&a.tokenizer, &texts, a.repeats)?;
    if a.json {
        println!("{}", serde_json::to_string(&m)?);
    } else {
        println!(
            "{} ({}): load {:.3} s; {} texts, {} chars, {} tokens in {:.3} s: {:.0} tokens/s; ids sha256 {}",
            m.file.display(),
            m.kind,
            m.load_seconds,
            m.texts,
            m.chars,
            m.tokens,
            m.encode_seconds,
            m.tokens_per_second,
            m.ids_sha256
        );
    }
    Ok(())
}

/// The drafter shape, K, step weights, loss and L of a training config.
fn train_spec(a: &TrainBenchArgs) -> Result<Spec> {
    let sets = parse_set(&a.set)?;
    let cfg = TrainConfig::load(&a.config, &sets)?;
    let config = drafter_config(&cfg).with_context(|| format!("the drafter of {}", a.config.display()))?;
    let seq_len = a.seq_len.or(cfg.data.max_length).unwrap_or(cfg.data.batch_tokens);
    let name = a.config.file_stem().map_or_else(|| "config".into(), |s| s.to_string_lossy().into_owned());
    Ok(Spec { config, name, seq_len, ttt: cfg.ttt_options(), loss: cfg.loss, precision: cfg.precision })
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

fn bench<B: AutodiffBackend>(spec: &Spec, run: &RunArgs, device: &B::Device) -> Result<TttBench> {
    if run.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let mut config = spec.config.clone();
    let rows = embed_rows(&config);
    config.vocab_size = rows;
    // The draft vocabulary: every (V / Vd)-th target id, enough to exercise d2t.
    let stride = config.vocab_size / config.draft_vocab_size;
    let vocab =
        DraftVocab::from_target_ids((0..config.draft_vocab_size).map(|j| j * stride).collect(), config.vocab_size)
            .map_err(anyhow::Error::msg)?;
    let tensors = init_tensors(&config, &vocab, None, 0);
    let trainable_params = tensors
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "embed_tokens.weight" | "d2t" | "t2d"))
        .map(|(_, t)| t.numel())
        .sum();
    let drafter = Drafter::<B>::from_tensors(&config, &tensors, device)?;
    drop(tensors);
    let (b, l, vd) = (run.batch, spec.seq_len, config.draft_vocab_size);
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
        teacher: aerie_model::TeacherTargets {
            pf: Tensor::from_inner(p.clone().mul_scalar(0.9)),
            p: Tensor::from_inner(p),
            in_draft: Tensor::ones([b, l], device),
        },
    };
    let masks = BatchMasks::of(&batch);
    let norm = Normalisers::of(&[&masks], spec.ttt.ttt_length);
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    for i in 0..run.warmup + run.steps {
        let (start, cpu0) = (Instant::now(), cpu_seconds());
        let out = aerie_model::autodiff::record(|| ttt_forward(&drafter, &batch, &spec.ttt))?;
        if run.forward_only {
            let _ = out.loss.into_data();
        } else {
            let loss = aerie_model::autodiff::record(|| {
                micro_loss(spec.loss, &out, &batch, &masks, &norm, &spec.ttt.step_weights)
            });
            let grads = aerie_model::autodiff::backward(loss);
            let g = drafter.lm_head.weight.grad(&grads).expect("lm_head gradient");
            let _ = g.sum().into_data();
        }
        B::sync(device)?;
        if i >= run.warmup {
            times.push(start.elapsed().as_secs_f64());
            cpu.push(cpu_seconds() - cpu0);
        }
    }
    let median_step = median(&times);
    let fwd = ttt_flops_per_token(&config, l, spec.ttt.ttt_length);
    let flops_per_token = if run.forward_only { fwd } else { 3.0 * fwd };
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
        precision: spec.precision,
        backward: !run.forward_only,
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
