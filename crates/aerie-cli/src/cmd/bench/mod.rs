//! `aerie bench ...`: arguments, progress and printing; each measurement lives in the crate that
//! owns what it measures:
//! - `generate`: batched generation of the native target (aerie-eval's `generation`, over
//!   aerie-model's `native::bench`);
//! - `shards`: read and decode rate of a shard dataset against the disk (`aerie_data::shard::bench`);
//! - `tokenizer`: load time and encode rate of a tokenizer (`aerie_data::tokenizer::measure`);
//! - `ttt` / `train`: forward(+backward) throughput and peak memory of the TTT objective for a
//!   drafter shape, named or from a training config (`aerie_train::bench`);
//! - `shift`: decoded τ of fine-tuning methods after a domain shift, a pipeline of `aerie`
//!   commands (`shift.rs`).

mod generate;
mod shift;

use std::path::PathBuf;

use aerie_train::bench::{TttBench, TttBenchOptions, TttBenchSpec, bench_ttt};
use aerie_train::config::Precision;
use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use clap::{Args, Subcommand, ValueEnum};

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
    /// Fine-tuning methods after a domain shift: the quickstart's chat drafter fine-tuned on
    /// SmolLM2's answers to HumanEval by each method and seed, scored by decoded τ (greedy verify
    /// cycles over held-out answers) on both domains. About 45 minutes on 2 cores after the
    /// quickstart; writes WORKDIR/shift.json and the table WORKDIR/shift.md.
    Shift(shift::ShiftArgs),
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

impl From<Shape> for aerie_train::bench::Shape {
    fn from(s: Shape) -> Self {
        match s {
            Shape::Smollm2 => Self::Smollm2,
            Shape::Kimi => Self::Kimi,
        }
    }
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
    /// `cpu`, `cuda:N` or `wgpu:N`.
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

/// Run `aerie bench`.
pub fn run(cmd: BenchCommand) -> Result<()> {
    let (spec, run) = match cmd {
        BenchCommand::Ttt(a) => (TttBenchSpec::named(a.shape.into(), a.seq_len, a.ttt_length, a.precision), a.run),
        BenchCommand::Train(a) => {
            let spec = TttBenchSpec::from_config(&a.config, &parse_set(&a.set)?, a.seq_len)
                .with_context(|| format!("the drafter of {}", a.config.display()))?;
            (spec, a.run)
        }
        BenchCommand::Shards(a) => return bench_shards(&a),
        BenchCommand::Tokenizer(a) => return bench_tokenizer(&a),
        BenchCommand::Generate(a) => return generate::run(&a),
        BenchCommand::Shift(a) => return shift::run(&a),
    };
    let opts =
        TttBenchOptions { batch: run.batch, steps: run.steps, warmup: run.warmup, forward_only: run.forward_only };
    let report: TttBench = match (run.device, run.backend) {
        (DeviceArg::Cpu, CpuBackend::Flex) => {
            bench_ttt::<Autodiff<burn::backend::Flex>>(&spec, &opts, &Default::default())?
        }
        #[cfg(feature = "ndarray")]
        (DeviceArg::Cpu, CpuBackend::Ndarray) => {
            bench_ttt::<Autodiff<burn::backend::NdArray>>(&spec, &opts, &Default::default())?
        }
        #[cfg(not(feature = "ndarray"))]
        (DeviceArg::Cpu, CpuBackend::Ndarray) => bail!("built without the `ndarray` feature"),
        #[cfg(feature = "cuda")]
        (DeviceArg::Cuda(i), _) => {
            bench_ttt::<Autodiff<burn::backend::Cuda>>(&spec, &opts, &burn::backend::cuda::CudaDevice::new(i))?
        }
        #[cfg(not(feature = "cuda"))]
        (DeviceArg::Cuda(_), _) => bail!("built without CUDA: rebuild with `--features cuda`"),
        #[cfg(feature = "wgpu")]
        (DeviceArg::Wgpu(i), _) => {
            crate::device::refuse_bf16_on_wgpu(spec.precision, run.device)?;
            bench_ttt::<Autodiff<burn::backend::Wgpu>>(&spec, &opts, &crate::device::wgpu_device(i)?)?
        }
        #[cfg(not(feature = "wgpu"))]
        (DeviceArg::Wgpu(_), _) => bail!("built without wgpu: rebuild with the default features"),
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
