//! `aerie capture`: run the target over a prepared dataset and write aerie-shard/1, with aerie's
//! native engine (the default) or, for targets only Python runs, the in-process Python worker of
//! `python/aerie_capture` (engine `transformers`, or `sglang` under torchrun with `--tp` ranks).
//! Whatever the engine, the dataset is verified by aerie's own reader before the report.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use aerie_capture::{CaptureOptions, capture};
use aerie_data::prepare::PreparedDataset;
use aerie_data::shard::{FloatDtype, ShardDataset, Teacher};
use aerie_model::TargetModel;
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
    /// Storage dtype of the hidden states: bf16, f16 or f32.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: FloatDtype,
    /// Teacher: `final-hidden`, `topk:K` or `final-hidden+topk:K`.
    #[arg(long, default_value = "final-hidden", value_parser = parse_teacher)]
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
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Capture engine: aerie's own (`native`), or the Python worker (`python/aerie_capture`)
    /// with transformers (any HF causal LM, CPU or GPU) or SGLang (tensor parallel, GPUs).
    #[arg(long, value_enum, default_value = "native")]
    pub engine: Engine,
    /// Python interpreter for the `transformers` and `sglang` engines (one whose environment
    /// holds torch and the engine); default `$AERIE_PYTHON`, else `python3`.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// `sglang`: tensor-parallel ranks (one per GPU), started with `torchrun`.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Python engines: token budget of one forward batch (`sglang` packs samples unpadded
    /// under it; `transformers` runs one sample per forward whatever it is).
    #[arg(long, default_value_t = 32_768)]
    pub max_batch_tokens: usize,
    /// Python engines: run the pre-flight self-test (a tiny random DeepSeek-V3 through both
    /// Python engines, then 8 real samples of `--data` checked) instead of a capture.
    #[arg(long)]
    pub self_test: bool,
    /// Further arguments for the Python worker, after `--` (`python -m aerie_capture --help`).
    #[arg(last = true)]
    pub engine_args: Vec<String>,
}

/// `--engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// aerie's Rust target (Llama family), on `--device`.
    Native,
    /// The Python worker on transformers.
    Transformers,
    /// The Python worker on SGLang, `--tp` ranks.
    Sglang,
}

fn parse_dtype(s: &str) -> Result<FloatDtype, String> {
    s.parse::<FloatDtype>().map_err(|e| e.to_string())
}

fn parse_teacher(s: &str) -> Result<Teacher, String> {
    s.parse::<Teacher>().map_err(|e| e.to_string())
}

/// Run `aerie capture`.
pub fn run(args: CaptureArgs) -> Result<()> {
    match args.engine {
        Engine::Native => {
            if args.self_test || !args.engine_args.is_empty() {
                bail!("--self-test and worker arguments after `--` need --engine transformers or sglang");
            }
            with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
        }
        Engine::Transformers | Engine::Sglang => run_python(&args),
    }
}

/// The directory holding the `aerie_capture` package: `$AERIE_CAPTURE_PYTHONPATH`, else this
/// checkout's `python/` when it is there (a source build), else none (the package must then be
/// installed in the interpreter's environment, `pip install ./python`).
fn worker_package_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AERIE_CAPTURE_PYTHONPATH") {
        return Some(PathBuf::from(p));
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
    dir.join("aerie_capture/__init__.py").is_file().then_some(dir)
}

/// The Python worker's command line: `python -m aerie_capture`, under `torchrun` (as
/// `python -m torch.distributed.run`, so the same interpreter) for `--tp` > 1.
fn python_command(args: &CaptureArgs, python: &Path, self_test: Option<&str>) -> Command {
    let mut c = Command::new(python);
    if args.engine == Engine::Sglang && args.tp > 1 {
        c.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &args.tp.to_string()]);
    }
    c.args(["-m", "aerie_capture"]);
    if let Some(dir) = worker_package_dir() {
        let mut paths = vec![dir];
        if let Some(old) = std::env::var_os("PYTHONPATH") {
            paths.extend(std::env::split_paths(&old));
        }
        c.env("PYTHONPATH", std::env::join_paths(paths).expect("PYTHONPATH entries without separators"));
    }
    let engine = if args.engine == Engine::Sglang { "sglang" } else { "transformers" };
    c.args(["--engine", engine]);
    c.arg("--target").arg(&args.target);
    c.args(["--target-name", &args.target.display().to_string()]);
    c.arg("--data").arg(&args.data);
    if let Some(out) = &args.out {
        c.arg("--out").arg(out);
    }
    c.args(["--split", &args.split, "--dtype", args.dtype.as_str(), "--teacher", &args.teacher.to_string()]);
    c.args(["--shard-tokens", &args.shard_tokens.to_string(), "--max-batch-tokens", &args.max_batch_tokens.to_string()]);
    if let Some(ids) = &args.aux_layers {
        let ids: Vec<String> = ids.iter().map(usize::to_string).collect();
        c.args(["--aux-layers", &ids.join(",")]);
    }
    if let Some(n) = args.max_samples {
        c.args(["--max-samples", &n.to_string()]);
    }
    if args.engine == Engine::Transformers {
        c.args(["--device", &args.device.to_string()]);
    } else {
        c.args(["--tp", &args.tp.to_string()]);
    }
    if let Some(phase) = self_test {
        c.args(["--self-test", phase]);
    }
    c.args(&args.engine_args);
    c
}

/// Run the Python worker, then verify what it wrote with aerie's reader (the same full pass the
/// native engine ends with) and report like the native engine, plus the worker's own fields.
fn run_python(args: &CaptureArgs) -> Result<()> {
    let python =
        args.python.clone().or_else(|| std::env::var_os("AERIE_PYTHON").map(PathBuf::from)).unwrap_or("python3".into());
    if args.self_test {
        // SGLang's distributed state is process-global: one process (group) per phase.
        let phases: &[&str] = if args.engine == Engine::Sglang { &["tiny", "real"] } else { &["all"] };
        for phase in phases {
            let status = python_command(args, &python, Some(phase)).stdin(Stdio::null()).status().with_context(|| {
                format!("starting the Python capture worker with {} (set --python or AERIE_PYTHON)", python.display())
            })?;
            if !status.success() {
                bail!("self-test phase `{phase}` failed ({status}); its JSON line above says which check");
            }
        }
        return Ok(());
    }
    let mut cmd = python_command(args, &python, None);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let t0 = Instant::now();
    let out = cmd.output().with_context(|| {
        format!("starting the Python capture worker with {} (set --python or AERIE_PYTHON)", python.display())
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("the Python capture worker ({}) failed with {}; its output:\n{stdout}", python.display(), out.status);
    }
    let worker: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l.trim()).ok())
        .with_context(|| format!("the Python capture worker printed no JSON report; its output:\n{stdout}"))?;
    let dir = args.out.as_ref().expect("--out is required without --self-test");
    let dataset = ShardDataset::open(dir)?;
    let verify = dataset.verify()?;
    let bytes: u64 = dataset
        .manifest()
        .shards
        .iter()
        .map(|s| std::fs::metadata(dir.join(&s.file)).map(|m| m.len()).unwrap_or(0))
        .sum();
    let bytes_per_token = bytes as f64 / dataset.num_tokens().max(1) as f64;
    let number = |key: &str| worker[key].as_f64().unwrap_or(0.0);
    if args.json {
        let v = serde_json::json!({
            "out": dir,
            "engine": worker["engine"],
            "created_by": worker["created_by"],
            "resumed_samples": worker["resumed_samples"],
            "captured_samples": worker["captured_samples"],
            "captured_tokens": worker["captured_tokens"],
            "seconds": worker["seconds"],
            "tokens_per_second": worker["tokens_per_second"],
            "wall_seconds": t0.elapsed().as_secs_f64(),
            "bytes_per_token": bytes_per_token,
            "verified": {
                "shards": verify.shards,
                "samples": verify.samples,
                "tokens": verify.tokens,
                "masked_tokens": verify.masked_tokens,
            },
        });
        println!("{v}");
    } else {
        println!(
            "captured {} samples ({} tokens, {:.0} tokens/s; {} resumed) into {} with {}; verified {} samples / {} tokens in {} shards, {:.0} bytes per token",
            number("captured_samples"),
            number("captured_tokens"),
            number("tokens_per_second"),
            number("resumed_samples"),
            dir.display(),
            worker["created_by"].as_str().unwrap_or("the Python worker"),
            verify.samples,
            verify.tokens,
            verify.shards,
            bytes_per_token
        );
    }
    Ok(())
}

fn run_on<B: Backend>(args: &CaptureArgs, device: &B::Device) -> Result<()> {
    let out = args.out.as_ref().expect("--out is required without --self-test");
    let target = TargetModel::<B>::load(&args.target, device)
        .with_context(|| format!("loading target {}", args.target.display()))?;
    let data = PreparedDataset::open(&args.data)?;
    let opts = CaptureOptions {
        target_name: args.target.display().to_string(),
        aux_layers: args.aux_layers.clone(),
        dtype: args.dtype,
        teacher: args.teacher,
        shard_tokens: args.shard_tokens,
        split: args.split.clone(),
        max_samples: args.max_samples,
    };
    let pb = progress::bar(0, "capture", "samples");
    let report = capture(&target, &args.target, &data, out, &opts, &mut |p| {
        pb.set_length(p.total);
        pb.set_position(p.samples);
        pb.set_message(format!("{} tokens", p.tokens));
    })?;
    pb.finish_and_clear();
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
            "verified": {
                "shards": report.verify.shards,
                "samples": report.verify.samples,
                "tokens": report.verify.tokens,
                "masked_tokens": report.verify.masked_tokens,
            },
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
