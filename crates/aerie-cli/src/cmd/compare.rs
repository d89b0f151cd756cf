//! `aerie compare`: `eval accept` for each candidate drafter on the same data (or, with
//! `--target --prompts`, `eval decode` on the same prompts; or, with `--engine`, `eval serve` in
//! a serving engine, ranked by its measured speedup), projected through a costs file, written as
//! one table (Markdown, CSV, Parquet, JSON) with PNG and SVG plots.

use std::path::PathBuf;

use aerie_eval::compare::{Candidate, rows, write_report};
use aerie_eval::cost::Costs;
use aerie_eval::decode::{DecodeOptions, DecodeSession, measured_costs};
use aerie_eval::offline::ShardEval;
use aerie_eval::serve::evaluate;
use aerie_model::drafter::shape::DraftShape;
use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;

use aerie_data::clock::today;

use crate::cmd::common::AcceptCommon;
use crate::cmd::common::engine::{Bars, EngineArgs, serve_options, served_drafters, workdir};
use crate::device::with_backend;

/// Arguments of `aerie compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Candidate drafter directories or hub ids `org/name[@revision]`.
    #[arg(required = true, value_parser = crate::model_ref::parse)]
    pub drafters: Vec<PathBuf>,
    /// Names for the candidates, comma-separated, in order (default: directory names).
    #[arg(long, value_delimiter = ',')]
    pub names: Vec<String>,
    #[command(flatten)]
    pub common: AcceptCommon,
    /// Costs file for the projection (configs/costs/*.toml).
    #[arg(long)]
    pub costs: Option<PathBuf>,
    /// Report directory (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Compare by real speculative decoding on the native target (`--target DIR`) over this
    /// prompt file instead of offline on `--data`: each candidate runs `aerie eval decode`, and
    /// without --costs its projection uses the costs measured in its own run.
    #[arg(long, conflicts_with = "data", requires = "target")]
    pub prompts: Option<PathBuf>,
    /// Decode mode: new tokens per answer at most.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Decode mode: chat template (`auto`, a built-in name, or a .jinja file).
    #[arg(long, default_value = "auto")]
    pub template: String,
    /// Compare inside a serving engine aerie starts (`--engine vllm`, with --target and
    /// --prompts): one plain run shared, each candidate served at --k, ranked by the engine's
    /// measured speedup, projected through the engine's measured costs unless --costs is given.
    #[command(flatten)]
    pub serving: EngineArgs,
    /// Print the table rows as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie compare`.
pub fn run(args: CompareArgs) -> Result<()> {
    // One name per candidate in every mode (rows, plots, exports): duplicates are refused.
    aerie_hub::served::drafter_names(&args.drafters, &args.names)?;
    args.common.options()?;
    let costs = args.costs.as_deref().map(Costs::load).transpose().context("reading the costs file")?;
    if args.serving.engine.is_some() {
        return compare_serving(&args, costs.as_ref());
    }
    with_backend!(args.common.pass.device, |B, dev| compare::<B>(&args, costs.as_ref(), &dev))
}

/// One bar across all candidates: n × `per` units, the current candidate in its prefix.
fn candidates_bar(n: usize, per: usize, unit: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new((n * per) as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "compare {{prefix}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}, ETA {{eta}})"
        ))
        .expect("valid template"),
    );
    pb
}

fn finish(args: &CompareArgs, cands: &[Candidate], costs: Option<&Costs>) -> Result<()> {
    let written = write_report(&args.out, cands, costs)?;
    if args.json {
        let v = serde_json::json!({ "rows": rows(cands), "files": written });
        println!("{}", serde_json::to_string(&v)?);
    } else {
        print!("{}", aerie_eval::compare::markdown(&rows(cands), costs));
        println!();
        for p in &written {
            println!("wrote      {}", p.display());
        }
    }
    Ok(())
}

/// Engine mode: every candidate served by the engine over the same prompts, against one plain run.
fn compare_serving(args: &CompareArgs, costs: Option<&Costs>) -> Result<()> {
    let (Some(target), Some(prompts)) = (args.common.target.as_deref(), args.prompts.as_deref()) else {
        bail!("--engine compares inside a serving engine: give --target DIR and --prompts FILE");
    };
    let shape = args.common.draft.shape()?;
    let DraftShape::Chain { k } = shape else {
        bail!("--engine serves chains of --k drafts (vLLM's EAGLE-3 has no draft trees)");
    };
    let dir = workdir(args.serving.workdir.as_deref())?;
    let opts =
        serve_options(&args.serving, target, prompts, args.common.pass.max_samples, &[k], args.max_new_tokens, &dir)?;
    let drafters = served_drafters(&args.serving, target, &args.drafters, &args.names, &dir)?;
    let bars = Bars::new();
    let result = evaluate(&opts, &drafters, &bars);
    bars.bar.finish_and_clear();
    let report =
        result.with_context(|| format!("comparing in {} (engine logs in {})", args.serving.kind(), dir.display()))?;
    let measured = report.costs(&today())?;
    let costs = costs.unwrap_or(&measured);
    let mut cands: Vec<Candidate> = report
        .runs
        .iter()
        .map(|r| {
            let mut c =
                Candidate::new(r.drafter.clone(), r.drafter_dir.display().to_string(), r.accept_report(), Some(costs));
            c.measured_speedup = Some(r.speedup);
            c
        })
        .collect();
    cands.sort_by(|a, b| b.measured_speedup.unwrap_or(0.0).total_cmp(&a.measured_speedup.unwrap_or(0.0)));
    finish(args, &cands, Some(costs))
}

/// Decode mode: every candidate decodes the same prompts on the native target.
fn compare_decoding<B: Backend>(
    args: &CompareArgs,
    prompts: &std::path::Path,
    costs: Option<&Costs>,
    device: &B::Device,
) -> Result<()> {
    let c = &args.common;
    let target = c.target.as_deref().expect("clap requires --target with --prompts");
    let shape = c.draft.shape()?;
    let opts = DecodeOptions {
        shape,
        temperature: c.temperature,
        rule: c.rule,
        max_new_tokens: args.max_new_tokens,
        seed: c.seed,
    };
    opts.validate(usize::MAX)?;
    let session = DecodeSession::<B>::load(target, prompts, c.pass.max_samples, &args.template, device)?;
    let names = aerie_hub::served::drafter_names(&args.drafters, &args.names)?;
    let n = args.drafters.len();
    let pb = candidates_bar(n, 2 * session.answers() * args.max_new_tokens, "tokens (max)");
    let mut cands = Vec::with_capacity(n);
    let mut report_costs = costs.cloned();
    for (i, dir) in args.drafters.iter().enumerate() {
        let name = names[i].clone();
        pb.set_prefix(format!("[{}/{n}] {name}", i + 1));
        pb.set_position((i * 2 * session.answers() * args.max_new_tokens) as u64);
        let run = session.run(target, dir, &opts, device, &mut |t| pb.inc(t as u64));
        let (report, timings) = match run {
            Ok(r) => r,
            Err(e) => {
                pb.abandon();
                return Err(e.into());
            }
        };
        let measured = measured_costs(&timings, target, &c.pass.device.to_string(), &shape, &today());
        let own = costs.cloned().or(measured);
        if report_costs.is_none() {
            report_costs.clone_from(&own);
        }
        pb.println(format!("[{}/{n}] {name}: τ {:.3}, measured speedup {:.3}", i + 1, report.tau, report.speedup));
        let mut cand = Candidate::new(name, dir.display().to_string(), report.acceptance, own.as_ref());
        cand.measured_speedup = Some(report.speedup);
        cands.push(cand);
    }
    pb.finish_and_clear();
    finish(args, &cands, report_costs.as_ref())
}

fn compare<B: Backend>(args: &CompareArgs, costs: Option<&Costs>, device: &B::Device) -> Result<()> {
    if let Some(prompts) = &args.prompts {
        return compare_decoding::<B>(args, prompts, costs, device);
    }
    let c = &args.common;
    let shards = ShardEval::<B>::open(c.data_dir()?, c.target_head.as_deref(), device)?;
    let opts = c.options()?;
    let target = c.target_for_embedding();
    let names = aerie_hub::served::drafter_names(&args.drafters, &args.names)?;
    let n = args.drafters.len();
    let per = shards.samples(c.pass.max_samples);
    let pb = candidates_bar(n, per, "samples");
    let mut cands = Vec::with_capacity(n);
    for (i, dir) in args.drafters.iter().enumerate() {
        let name = names[i].clone();
        pb.set_prefix(format!("[{}/{n}] {name}", i + 1));
        let report = shards.accept(dir, target.as_deref(), &opts, &|d| pb.set_position((i * per + d) as u64), device);
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                pb.abandon();
                return Err(e.into());
            }
        };
        pb.println(format!("[{}/{n}] {name}: τ {:.3}", i + 1, report.tau));
        cands.push(Candidate::new(name, dir.display().to_string(), report, costs));
    }
    pb.finish_and_clear();
    finish(args, &cands, costs)
}
