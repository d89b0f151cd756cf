//! `aerie eval ...`: the evaluations of a drafter, one module per subcommand. `aerie eval loss`
//! (teacher-forced TTT metrics on captured shards, measured by `aerie_eval::offline`) is here;
//! `accept`, `decode` and `serve` have their own.

mod accept;
mod decode;
pub mod serve;

use std::path::PathBuf;

use aerie_eval::offline::ShardEval;
use aerie_model::TttOptions;
use aerie_model::ttt::eval::EvalLossOptions;
use anyhow::Result;
use burn::tensor::backend::Backend;
use clap::{Args, Subcommand};

use crate::cmd::common::ShardPassArgs;
use crate::device::with_backend;
use crate::progress;

/// `aerie eval ...`
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Teacher-forced validation: the training objective without weight updates.
    Loss(LossArgs),
    /// Serving-mode acceptance: drafts from the drafter's own tokens, verified against the
    /// target; τ, per-position rates, τ(k).
    Accept(accept::AcceptArgs),
    /// Real speculative decoding on the native target, beside plain decoding of the same
    /// prompts: τ, tokens/s of both, measured T_d / T_s / T_v(n), greedy identity.
    Decode(decode::DecodeArgs),
    /// Inside a serving engine aerie starts (vLLM, or SGLang): τ and per-position acceptance
    /// from the engine's own numbers, plain and speculative tokens/s, greedy identity, the
    /// measured speedup, T_d and cycle, and the break-even τ derived from them.
    Serve(Box<serve::ServeArgs>),
}

/// Arguments of `aerie eval loss`.
#[derive(Debug, Args)]
pub struct LossArgs {
    /// Drafter directory (SGLang or speculators layout) or hub id `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub drafter: PathBuf,
    /// Captured shard directory (aerie-shard/1).
    #[arg(long)]
    pub data: PathBuf,
    /// Target lm_head: a safetensors file with `lm_head.weight`, or the target model directory
    /// (tied embeddings allowed), or its hub id. Not needed when the shards carry a top-k
    /// teacher only.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target_head: Option<PathBuf>,
    /// Target model (directory or safetensors file) to take `embed_tokens` from when the drafter
    /// does not ship it (or its hub id); defaults to --target-head when that is a directory.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: Option<PathBuf>,
    /// Unrolled draft steps K.
    #[arg(long, default_value_t = 7)]
    pub ttt_length: usize,
    /// Per-step loss decay (weights decay^k).
    #[arg(long, default_value_t = 0.8)]
    pub step_decay: f64,
    /// How the shards are walked.
    #[command(flatten)]
    pub pass: ShardPassArgs,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie eval`.
pub fn run(cmd: EvalCommand) -> Result<()> {
    match cmd {
        EvalCommand::Loss(args) => with_backend!(args.pass.device, |B, dev| loss::<B>(&args, &dev)),
        EvalCommand::Accept(args) => accept::run(args),
        EvalCommand::Decode(args) => decode::run(args),
        EvalCommand::Serve(args) => serve::run(*args),
    }
}

fn loss<B: Backend>(args: &LossArgs, device: &B::Device) -> Result<()> {
    let target = args.target.clone().or_else(|| args.target_head.clone().filter(|p| p.is_dir()));
    // Bounded before the per-step weights are allocated (a length of 10^12 grew without end).
    let max_depth = aerie_model::drafter::shape::MAX_DEPTH;
    if args.ttt_length > max_depth {
        anyhow::bail!(
            "--ttt-length {} is above the limit of {max_depth} draft steps (a drafter drafts at most that many; \
             acceptance decays geometrically with depth)",
            args.ttt_length
        );
    }
    let shards = ShardEval::<B>::open(&args.data, args.target_head.as_deref(), device)?;
    let opts = EvalLossOptions {
        ttt: TttOptions::geometric(args.ttt_length, args.step_decay),
        batch_size: args.pass.batch_size,
        max_samples: args.pass.max_samples,
    };
    let total = shards.samples(args.pass.max_samples);
    let pb = progress::bar(total as u64, "eval loss", "samples");
    let progress = |done: usize| pb.set_position(done as u64);
    let metrics = shards.loss(&args.drafter, target.as_deref(), &opts, args.pass.head_chunk_rows, &progress, device)?;
    pb.finish_and_clear();
    if args.json {
        let report = crate::cmd::common::reports::EvalLossReport {
            metrics,
            samples: total,
            ttt_length: args.ttt_length,
            teacher: (if shards.head.is_some() { "final-hidden" } else { "topk" }).into(),
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("drafter   {}", args.drafter.display());
        println!("data      {} ({total} samples, {} loss tokens)", args.data.display(), metrics.tokens);
        println!("loss      {:.4}", metrics.loss);
        println!("step      loss    acc     alpha");
        for k in 0..metrics.loss_per_step.len() {
            println!(
                "{k:<9} {:<7.4} {:<7.4} {:<7.4}",
                metrics.loss_per_step[k], metrics.acc_per_step[k], metrics.accept_rate_per_step[k]
            );
        }
        println!("simulated accept length (1 + Σ Π acc) {:.3}", metrics.simulated_accept_length);
    }
    Ok(())
}
