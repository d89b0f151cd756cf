//! `aerie bench ttt`: forward(+backward) throughput and peak memory of the TTT objective for a
//! drafter shape, with the analytic FLOP count to say how far from the machine's peak it runs.

use std::time::Instant;

use aerie_model::init::init_tensors;
use aerie_model::{Drafter, DrafterConfig, TargetHead, TttBatch, TttOptions, VocabMap, ttt_forward};
use anyhow::{Result, bail};
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use crate::device::DeviceArg;

/// `aerie bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Throughput of the training-time-test forward and backward.
    Ttt(TttArgs),
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

/// Arguments of `aerie bench ttt`.
#[derive(Debug, Args)]
pub struct TttArgs {
    /// Drafter shape.
    #[arg(long, value_enum, default_value = "smollm2")]
    pub shape: Shape,
    /// Sequence length L.
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Unrolled steps K.
    #[arg(long, default_value_t = 7)]
    pub ttt_length: usize,
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

/// Result of one benchmark.
#[derive(Debug, Serialize)]
pub struct TttBench {
    backend: String,
    shape: String,
    seq_len: usize,
    batch: usize,
    ttt_length: usize,
    backward: bool,
    trainable_params: usize,
    step_seconds: Vec<f64>,
    median_step_seconds: f64,
    tokens_per_second: f64,
    flops_per_token: f64,
    achieved_gflops: f64,
    peak_rss_mib: Option<f64>,
}

/// Run `aerie bench`.
pub fn run(cmd: BenchCommand) -> Result<()> {
    let BenchCommand::Ttt(args) = cmd;
    let report = match (args.device, args.backend) {
        (DeviceArg::Cpu, CpuBackend::Flex) => bench::<Autodiff<burn::backend::Flex>>(&args, &Default::default())?,
        #[cfg(feature = "ndarray")]
        (DeviceArg::Cpu, CpuBackend::Ndarray) => bench::<Autodiff<burn::backend::NdArray>>(&args, &Default::default())?,
        #[cfg(not(feature = "ndarray"))]
        (DeviceArg::Cpu, CpuBackend::Ndarray) => bail!("built without the `ndarray` feature"),
        #[cfg(feature = "cuda")]
        (DeviceArg::Cuda(i), _) => {
            bench::<Autodiff<burn::backend::Cuda>>(&args, &burn::backend::cuda::CudaDevice::new(i))?
        }
        #[cfg(not(feature = "cuda"))]
        (DeviceArg::Cuda(_), _) => bail!("built without CUDA: rebuild with `--features cuda`"),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} {} L={} B={} K={} {}: {:.1} tokens/s ({:.3} s/step), {:.2} GFLOP/token, {:.1} GFLOP/s, peak RSS {}",
            report.backend,
            report.shape,
            report.seq_len,
            report.batch,
            report.ttt_length,
            if report.backward { "fwd+bwd" } else { "fwd" },
            report.tokens_per_second,
            report.median_step_seconds,
            report.flops_per_token / 1e9,
            report.achieved_gflops,
            report.peak_rss_mib.map_or("n/a".into(), |m| format!("{m:.0} MiB")),
        );
    }
    Ok(())
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

fn bench<B: AutodiffBackend>(args: &TttArgs, device: &B::Device) -> Result<TttBench> {
    let (config, name) = match args.shape {
        Shape::Smollm2 => (DrafterConfig::smollm2_135m(8192), "smollm2-135m"),
        Shape::Kimi => (DrafterConfig::kimi_k2_aq_medai(), "kimi-k2-aq-medai"),
    };
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    // The draft vocabulary: every (V / Vd)-th target id, enough to exercise d2t.
    let stride = config.vocab_size / config.draft_vocab_size;
    let vocab =
        VocabMap::from_target_ids((0..config.draft_vocab_size).map(|j| j * stride).collect(), config.vocab_size)
            .map_err(anyhow::Error::msg)?;
    let tensors = init_tensors(&config, &vocab, None, 0);
    let trainable_params = tensors
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "embed_tokens.weight" | "d2t" | "t2d"))
        .map(|(_, t)| t.numel())
        .sum();
    let drafter = Drafter::<B>::from_tensors(&config, &tensors, device)?;
    drop(tensors);
    let (b, l) = (args.batch, args.seq_len);
    B::seed(device, 0);
    let aw = config.num_aux() * config.target_hidden_size;
    let head_weight = Tensor::<B::InnerBackend, 2>::random(
        [config.vocab_size, config.target_hidden_size],
        Distribution::Normal(0.0, 0.05),
        device,
    );
    let head = TargetHead::new(head_weight, &vocab, 8192);
    let teacher =
        head.targets(Tensor::random([b, l, config.target_hidden_size], Distribution::Normal(0.0, 1.0), device));
    let batch = TttBatch::<B> {
        input_ids: Tensor::<B, 2, Int>::random([b, l], Distribution::Uniform(0.0, config.vocab_size as f64), device),
        loss_mask: Tensor::ones([b, l], device),
        valid: Tensor::ones([b, l], device),
        aux: Tensor::random([b, l, aw], Distribution::Normal(0.0, 1.0), device),
        teacher: aerie_model::TeacherTargets {
            p: Tensor::from_inner(teacher.p),
            pf: Tensor::from_inner(teacher.pf),
            in_draft: Tensor::from_inner(teacher.in_draft),
        },
    };
    let opts = TttOptions::geometric(args.ttt_length, 0.8);
    let mut times = Vec::new();
    for i in 0..args.warmup + args.steps {
        let start = Instant::now();
        let out = ttt_forward(&drafter, &batch, &opts)?;
        if args.forward_only {
            let _ = out.loss.into_data();
        } else {
            let grads = out.loss.backward();
            let g = drafter.lm_head.weight.grad(&grads).expect("lm_head gradient");
            let _ = g.sum().into_data();
        }
        B::sync(device)?;
        if i >= args.warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let fwd = ttt_flops_per_token(&config, l, args.ttt_length);
    let flops_per_token = if args.forward_only { fwd } else { 3.0 * fwd };
    let tokens_per_second = (b * l) as f64 / median;
    Ok(TttBench {
        backend: B::name(device),
        shape: name.into(),
        seq_len: l,
        batch: b,
        ttt_length: args.ttt_length,
        backward: !args.forward_only,
        trainable_params,
        step_seconds: times,
        median_step_seconds: median,
        tokens_per_second,
        flops_per_token,
        achieved_gflops: flops_per_token * tokens_per_second / 1e9,
        peak_rss_mib: peak_rss_mib(),
    })
}
