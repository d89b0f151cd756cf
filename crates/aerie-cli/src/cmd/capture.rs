//! `aerie capture`: run the native target over a prepared dataset and write aerie-shard/1.

use std::path::PathBuf;

use aerie_capture::{CaptureOptions, capture};
use aerie_data::prepare::PreparedDataset;
use aerie_data::shard::{HiddenDtype, Teacher};
use aerie_model::TargetModel;
use anyhow::{Context, Result};
use burn::tensor::backend::Backend;
use clap::Args;

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
    #[arg(long)]
    pub out: PathBuf,
    /// Aux layers, output-of-layer convention (default EAGLE-3's [1, N/2-1, N-4]).
    #[arg(long, value_delimiter = ',')]
    pub aux_layers: Option<Vec<usize>>,
    /// Storage of the hidden states: bf16, f16, f32, or a compact encoding of format 2:
    /// fp8-e4m3 (a scale per token and layer, half of bf16's bytes) or int4 (a scale per 32
    /// values); docs/shard-format.md §3.1 gives their error bounds and measured accept cost.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: HiddenDtype,
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
}

fn parse_dtype(s: &str) -> Result<HiddenDtype, String> {
    s.parse::<HiddenDtype>().map_err(|e| e.to_string())
}

fn parse_teacher(s: &str) -> Result<Teacher, String> {
    s.parse::<Teacher>().map_err(|e| e.to_string())
}

/// Run `aerie capture`.
pub fn run(args: CaptureArgs) -> Result<()> {
    with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
}

fn run_on<B: Backend>(args: &CaptureArgs, device: &B::Device) -> Result<()> {
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
    let report = capture(&target, &args.target, &data, &args.out, &opts, &mut |p| {
        pb.set_length(p.total);
        pb.set_position(p.samples);
        pb.set_message(format!("{} tokens", p.tokens));
    })?;
    pb.finish_and_clear();
    let tps = report.captured_tokens as f64 / report.seconds.max(1e-9);
    if args.json {
        let v = serde_json::json!({
            "out": args.out,
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
            args.out.display(),
            report.verify.samples,
            report.verify.tokens,
            report.verify.shards,
            report.bytes_per_token
        );
    }
    Ok(())
}
