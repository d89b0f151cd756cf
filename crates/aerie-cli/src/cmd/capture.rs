//! `aerie capture`: run the target over a prepared dataset and write aerie-shard/1, with aerie's
//! native engine (the default) or, for targets only Python runs, the in-process Python worker of
//! `python/aerie_capture` (engine `transformers`, `sglang` under torchrun with `--tp` ranks, or
//! `vllm` in process).
//! Whatever the engine, the dataset is verified by aerie's own reader before the report.

use std::path::PathBuf;
use std::time::Instant;

use aerie_capture::{CaptureOptions, PythonCapture, PythonEngine, capture_prepared};
use aerie_data::shard::{HiddenDtype, Teacher, VerifyReport};
use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::{Args, ValueEnum};

use crate::device::{DeviceArg, with_backend};
use crate::progress;

/// Arguments of `aerie capture`.
#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// Target model directory (HF layout, e.g. from `aerie import gguf`) or hub id
    /// `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: PathBuf,
    /// Prepared dataset (`aerie data prepare`).
    #[arg(long)]
    pub data: PathBuf,
    /// Output shard directory; an interrupted capture there is resumed.
    #[arg(long, required_unless_present = "self_test")]
    pub out: Option<PathBuf>,
    /// Aux layers, output-of-layer convention (default EAGLE-3's [1, N/2-1, N-4]).
    #[arg(long, value_delimiter = ',')]
    pub aux_layers: Option<Vec<usize>>,
    /// Storage of the hidden states: bf16, f16, f32, or a compact encoding of format 2:
    /// fp8-e4m3 (a scale per token and layer, half of bf16's bytes) or int4 (a scale per 32
    /// values); docs/shard-format.md §3.1 gives their error bounds and measured accept cost.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: HiddenDtype,
    /// Teacher: `final-hidden`, `topk:K` or `final-hidden+topk:K`. The default, the target's
    /// 32 most likely tokens per position, costs 256 bytes per token where the final hidden
    /// state costs 2·Ht (14 KB for Kimi-K2), and trained SmolLM2's drafter to the same held-out
    /// τ (1.318 against 1.320 with final-hidden; docs/shard-format.md §10).
    #[arg(long, default_value = "topk:32", value_parser = parse_teacher)]
    pub teacher: Teacher,
    /// Tokens per shard.
    #[arg(long, default_value_t = 65_536)]
    pub shard_tokens: usize,
    /// Split of the prepared dataset.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Capture only the first N samples of the split.
    #[arg(long)]
    pub max_samples: Option<usize>,
    /// `cpu`, `cuda:N` or `wgpu:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Capture engine: aerie's own (`native`), or the Python worker (`python/aerie_capture`)
    /// with transformers (any HF causal LM, CPU or GPU), SGLang (tensor parallel, GPUs) or vLLM
    /// (in process, GPUs or the CPU).
    #[arg(long, value_enum, default_value = "native")]
    pub engine: Engine,
    /// Python interpreter for the `transformers`, `sglang` and `vllm` engines (one whose environment
    /// holds torch and the engine); default `$AERIE_PYTHON`, else `python3`.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// `sglang`: tensor-parallel ranks (one per GPU), started with `torchrun`; `vllm`: its
    /// `tensor_parallel_size`.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Python engines: token budget of one forward batch (`sglang` packs samples unpadded
    /// under it; `transformers` runs one sample per forward whatever it is).
    #[arg(long, default_value_t = 32_768)]
    pub max_batch_tokens: usize,
    /// `vllm`: the KV cache in GiB. The default sizes it for capture (one `--max-batch-tokens`
    /// batch and one longest prompt of the prepared data, with a quarter more) instead of
    /// vLLM's own default, a share of the device that on a CPU is 85 % of the machine's
    /// memory and refuses to start unless that much is free.
    #[arg(long)]
    pub kv_cache_gb: Option<f64>,
    /// Python engines: run the pre-flight self-test (a tiny random DeepSeek-V3 through both
    /// Python engines, then 8 real samples of `--data` checked) instead of a capture.
    #[arg(long)]
    pub self_test: bool,
    /// Extra worker/engine argument, passed as is (repeat it: `--engine-arg=--trust-remote-code`;
    /// `python -m aerie_capture --help` lists them), as `eval serve` and `compare` take theirs.
    #[arg(long = "engine-arg", allow_hyphen_values = true)]
    pub engine_args: Vec<String>,
}

/// `--engine`: the native engine, or the Python worker on transformers or a serving engine
/// (`aerie_engine::Engine`, which it maps to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// aerie's Rust target (Llama family), on `--device`.
    Native,
    /// The Python worker on transformers.
    Transformers,
    /// The Python worker on SGLang, `--tp` ranks.
    Sglang,
    /// The Python worker on vLLM in process (`extract_hidden_states`), `--tp` GPUs or the CPU.
    Vllm,
}

fn parse_dtype(s: &str) -> Result<HiddenDtype, String> {
    s.parse::<HiddenDtype>().map_err(|e| e.to_string())
}

fn parse_teacher(s: &str) -> Result<Teacher, String> {
    s.parse::<Teacher>().map_err(|e| e.to_string())
}

/// Run `aerie capture`.
pub fn run(args: CaptureArgs) -> Result<()> {
    match args.engine {
        Engine::Native => {
            if args.self_test || !args.engine_args.is_empty() {
                bail!("--self-test and --engine-arg need --engine transformers, sglang or vllm");
            }
            with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
        }
        Engine::Transformers | Engine::Sglang | Engine::Vllm => run_python(&args),
    }
}

/// The `verified` object of both engines' `--json` reports.
fn verified_json(v: &VerifyReport) -> serde_json::Value {
    serde_json::json!({"shards": v.shards, "samples": v.samples, "tokens": v.tokens, "masked_tokens": v.masked_tokens})
}

/// What to capture, for either engine; the target is named by its path as given.
fn capture_options(args: &CaptureArgs) -> CaptureOptions {
    CaptureOptions {
        target_name: args.target.display().to_string(),
        aux_layers: args.aux_layers.clone(),
        dtype: args.dtype,
        teacher: args.teacher,
        shard_tokens: args.shard_tokens,
        split: args.split.clone(),
        max_samples: args.max_samples,
    }
}

/// The Python worker's options, from the native capture's flags (it writes every encoding the
/// native writer does, byte for byte the same).
fn python_capture(args: &CaptureArgs) -> Result<PythonCapture> {
    if let DeviceArg::Wgpu(_) = args.device {
        bail!(
            "--device {}: wgpu is burn's backend, for the native engine only; the Python engines take cpu or cuda:N",
            args.device
        );
    }
    Ok(PythonCapture {
        python: aerie_engine::python::interpreter(args.python.as_deref()),
        engine: match args.engine {
            Engine::Sglang => PythonEngine::Served(aerie_engine::Engine::Sglang),
            Engine::Vllm => PythonEngine::Served(aerie_engine::Engine::Vllm),
            _ => PythonEngine::Transformers,
        },
        target: args.target.clone(),
        data: args.data.clone(),
        out: args.out.clone(),
        capture: capture_options(args),
        max_batch_tokens: args.max_batch_tokens,
        device: args.device.to_string(),
        tp: args.tp,
        kv_cache_gb: args.kv_cache_gb,
        extra_args: args.engine_args.clone(),
    })
}

/// Run the Python worker (it verifies through aerie's reader) and report like the native
/// engine, plus the worker's own fields.
fn run_python(args: &CaptureArgs) -> Result<()> {
    let job = python_capture(args)?;
    if args.self_test {
        return Ok(job.self_test()?);
    }
    let t0 = Instant::now();
    let report = job.run()?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    let (worker, verify) = (&report.worker, &report.verify);
    let dir = args.out.as_ref().expect("--out is required without --self-test");
    if args.json {
        let v = serde_json::json!({
            "out": dir,
            "engine": worker.engine,
            "created_by": worker.created_by,
            "resumed_samples": worker.resumed_samples,
            "captured_samples": worker.captured_samples,
            "captured_tokens": worker.captured_tokens,
            "seconds": worker.seconds,
            "tokens_per_second": worker.tokens_per_second,
            "wall_seconds": t0.elapsed().as_secs_f64(),
            "bytes_per_token": report.bytes_per_token,
            "verified": verified_json(verify),
        });
        println!("{v}");
    } else {
        println!(
            "captured {} samples ({} tokens, {:.0} tokens/s; {} resumed) into {} with {}; verified {} samples / {} tokens in {} shards, {:.0} bytes per token",
            worker.captured_samples,
            worker.captured_tokens,
            worker.tokens_per_second,
            worker.resumed_samples,
            dir.display(),
            worker.created_by,
            verify.samples,
            verify.tokens,
            verify.shards,
            report.bytes_per_token
        );
    }
    Ok(())
}

fn run_on<B: Backend>(args: &CaptureArgs, device: &B::Device) -> Result<()> {
    let out = args.out.as_ref().expect("--out is required without --self-test");
    let opts = capture_options(args);
    let pb = progress::bar(0, "capture", "samples");
    let report = capture_prepared::<B>(&args.target, &args.data, out, &opts, device, &mut |p| {
        pb.set_length(p.total);
        pb.set_position(p.samples);
        pb.set_message(format!("{} tokens", p.tokens));
    })
    .with_context(|| format!("capturing {} through {}", args.data.display(), args.target.display()))?;
    pb.finish_and_clear();
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    let tps = report.captured_tokens as f64 / report.seconds.max(1e-9);
    if args.json {
        let v = serde_json::json!({
            "out": out,
            "resumed_samples": report.resumed_samples,
            "captured_samples": report.captured_samples,
            "captured_tokens": report.captured_tokens,
            "seconds": report.seconds,
            "tokens_per_second": tps,
            "bytes_per_token": report.bytes_per_token,
            "verified": verified_json(&report.verify),
        });
        println!("{v}");
    } else {
        println!(
            "captured {} samples ({} tokens, {:.0} tokens/s; {} resumed) into {}; verified {} samples / {} tokens in {} shards, {:.0} bytes per token",
            report.captured_samples,
            report.captured_tokens,
            tps,
            report.resumed_samples,
            out.display(),
            report.verify.samples,
            report.verify.tokens,
            report.verify.shards,
            report.bytes_per_token
        );
    }
    Ok(())
}
