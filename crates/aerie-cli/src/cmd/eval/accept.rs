//! `aerie eval accept`: serving-mode acceptance of a drafter on captured shards (drafts from its
//! own tokens, verified against the target's distributions); τ, per-position rates, τ(k).

use std::path::PathBuf;

use aerie_eval::accept::AcceptReport;
use aerie_eval::offline::ShardEval;
use anyhow::{Context, Result};
use burn::tensor::backend::Backend;
use clap::Args;

use crate::cmd::common::AcceptCommon;
use crate::device::with_backend;
use crate::progress;

/// Arguments of `aerie eval accept`.
#[derive(Debug, Args)]
pub struct AcceptArgs {
    /// Drafter directory (SGLang or speculators layout) or hub id `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub drafter: PathBuf,
    #[command(flatten)]
    pub common: AcceptCommon,
    /// Write the acceptance profile (`speculation_profile.json`: per-position rates, τ by output
    /// position) here, atomically.
    #[arg(long)]
    pub profile_out: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie eval accept`.
pub fn run(args: AcceptArgs) -> Result<()> {
    args.common.options()?;
    // Written after the whole evaluation: refused now when it would replace an input or cannot
    // be written, not after minutes of drafting.
    if let Some(out) = &args.profile_out {
        let mut inputs = vec![("--drafter", args.drafter.as_path()), ("--data", args.common.data_dir()?)];
        if let Some(head) = &args.common.target_head {
            inputs.push(("--target-head", head));
        }
        aerie_data::owned::check_not_input(out, "--profile-out", &inputs)?;
        crate::cmd::common::writable(out).context("--profile-out")?;
    }
    with_backend!(args.common.pass.device, |B, dev| accept::<B>(&args, &dev))
}

fn accept<B: Backend>(args: &AcceptArgs, device: &B::Device) -> Result<()> {
    let c = &args.common;
    let shards = ShardEval::<B>::open(c.data_dir()?, c.target_head.as_deref(), device)?;
    let pb = progress::bar(shards.samples(c.pass.max_samples) as u64, "eval accept", "samples");
    let report = shards.accept(
        &args.drafter,
        c.target_for_embedding().as_deref(),
        &c.options()?,
        &|d| pb.set_position(d as u64),
        device,
    );
    pb.finish_and_clear();
    let report = report?;
    if let (Some(path), Some(profile)) = (&args.profile_out, &report.profile) {
        profile.write(path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_report(&args.drafter.display().to_string(), &report);
    Ok(())
}

/// The human rendering of an accept report.
fn print_report(name: &str, r: &AcceptReport) {
    println!("drafter    {name}");
    println!(
        "drafting   {} (k {}, topk {}, {} verified tokens, temperature {}), rule {}",
        r.drafting,
        r.steps,
        r.topk,
        r.verify_tokens,
        r.temperature,
        r.rule.name()
    );
    println!(
        "positions  {} ({} samples, {} drafts, {} cut by turn end)",
        r.positions, r.samples, r.drafts, r.positions_cut_by_turn_end
    );
    match r.cycles.last() {
        Some(c) => println!(
            "τ          {:.3} (accept length, bonus token included, over the {} cycles decoding runs: {} drafts accepted; {:.3} if every position started one)",
            r.tau, c.cycles, c.accepted_drafts, r.tau_all_positions
        ),
        None => println!("τ          {:.3} (accept length, bonus token included)", r.tau),
    }
    println!("position   α_i (conditional)   r_i (unconditional)");
    for (i, (a, u)) in r.accept_rate_conditional.iter().zip(&r.accept_rate_unconditional).enumerate() {
        println!("{:<10} {:<19.4} {:.4}", i + 1, a, u);
    }
    if let Some(p) = &r.profile {
        println!("by output  {}", p.bucket_line());
    }
    if r.drafting == "chain" {
        let curve: Vec<String> = r.curve.iter().map(|p| format!("τ({})={:.3}", p.k, p.tau)).collect();
        println!("curve      {}", curve.join("  "));
    }
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
}
