//! `aerie compare`: `eval accept` for each candidate drafter on the same data (or, with
//! `--target --prompts`, `eval decode` on the same prompts; or, with `--engine`, `eval serve` in
//! a serving engine, ranked by its measured speedup), projected through a costs file, written as
//! one table (Markdown, CSV, Parquet, JSON) with PNG and SVG plots.

use std::path::{Path, PathBuf};

use aerie_eval::compare::run::{self, Compare, CompareProgress};
use aerie_eval::compare::{Candidate, rows, write_report};
use aerie_eval::cost::{Costs, today};
use aerie_eval::decode::{DecodeOptions, DecodeSession};
use aerie_eval::offline::ShardEval;
use aerie_eval::serve::evaluate;
use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;
use indicatif::ProgressBar;

use crate::cmd::common::engine::{Bars, EngineArgs, resolve_engine_dtype, serve_options, served_drafters, workdir};
use crate::cmd::common::{AcceptCommon, writable};
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
    /// without --costs its projection uses the costs measured in its own run. A named set
    /// (`mtbench`) is fetched into `$AERIE_HOME` when missing.
    #[arg(long, conflicts_with = "data", requires = "target", value_parser = crate::cmd::assets::parse_prompts)]
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
    let names = aerie_hub::served::drafter_names(&args.drafters, &args.names)?;
    let drafters: Vec<(String, PathBuf)> = names.into_iter().zip(args.drafters.iter().cloned()).collect();
    args.common.options()?;
    let costs = args.costs.as_deref().map(Costs::load).transpose().context("reading the costs file")?;
    // The report is written after every candidate ran: refused now, in a second, when --out
    // would replace an input or files aerie did not write, or cannot be written.
    let mut inputs: Vec<(&str, &Path)> = args.drafters.iter().map(|d| ("a candidate drafter", d.as_path())).collect();
    if let Some(data) = &args.common.data {
        inputs.push(("--data", data));
    }
    aerie_data::owned::check_not_input(&args.out, "--out", &inputs)?;
    // Every candidate is a drafter with a readable config before the first one is evaluated, so
    // a mistyped third candidate fails now, not after two evaluations.
    for (name, dir) in &drafters {
        aerie_model::checkpoint::check_drafter_dir(dir)
            .and_then(|()| aerie_model::checkpoint::config::read_config(&dir.join("config.json"), None).map(drop))
            .with_context(|| format!("candidate `{name}`"))?;
    }
    aerie_eval::compare::check_out(&args.out)?;
    writable(&args.out.join("compare.json")).context("--out")?;
    if args.serving.engine.is_some() {
        return compare_serving(&args, costs.as_ref());
    }
    let bar = CandidatesBar(ProgressBar::hidden());
    let c = Compare { drafters: &drafters, costs: costs.as_ref(), progress: &bar };
    let result = with_backend!(args.common.pass.device, |B, dev| compare::<B>(&args, &c, &dev));
    match result {
        Ok((cands, table_costs)) => {
            bar.0.finish_and_clear();
            finish(&args, &cands, table_costs.as_ref())
        }
        Err(e) => {
            bar.0.abandon();
            Err(e)
        }
    }
}

/// One bar across all candidates, the current candidate in its prefix.
struct CandidatesBar(ProgressBar);

impl CompareProgress for CandidatesBar {
    fn start(&self, total: u64, unit: &str) {
        self.0.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        self.0.set_length(total);
        self.0.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "compare {{prefix}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}, ETA {{eta}})"
            ))
            .expect("valid template"),
        );
    }
    fn candidate(&self, i: usize, n: usize, name: &str, position: u64) {
        self.0.set_prefix(format!("[{}/{n}] {name}", i + 1));
        self.0.set_position(position);
    }
    fn position(&self, position: u64) {
        self.0.set_position(position);
    }
    fn advance(&self, units: u64) {
        self.0.inc(units);
    }
    fn line(&self, line: &str) {
        self.0.println(line);
    }
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
/// As in `eval serve`, what can fail is checked before the first engine starts (the report
/// directory written into), and the engine's report is saved (`OUT/serve-report.json`) before the
/// table and plots, which run after the engines, can fail.
fn compare_serving(args: &CompareArgs, costs: Option<&Costs>) -> Result<()> {
    let (Some(target), Some(prompts)) = (args.common.target.as_deref(), args.prompts.as_deref()) else {
        bail!("--engine compares inside a serving engine: give --target DIR and --prompts FILE");
    };
    let k = run::served_chain(&args.common.draft.shape()?)?;
    let saved = args.out.join("serve-report.json");
    writable(&saved).context("--out")?;
    let dir = workdir(args.serving.workdir.as_deref())?;
    let mut opts =
        serve_options(&args.serving, target, prompts, args.common.pass.max_samples, &[k], args.max_new_tokens, &dir)?;
    let drafters = served_drafters(&args.serving, target, &args.drafters, &args.names, &dir)?;
    resolve_engine_dtype(&args.serving, &mut opts)?;
    let bars = Bars::new();
    let result = evaluate(&opts, &drafters, &bars);
    bars.bar.finish_and_clear();
    let report =
        result.with_context(|| format!("comparing in {} (engine logs in {})", args.serving.kind(), dir.display()))?;
    aerie_data::atomic::write_bytes(&saved, serde_json::to_string_pretty(&report)?.as_bytes())
        .with_context(|| format!("writing {}", saved.display()))?;
    let table = || -> Result<()> {
        let (cands, costs) = run::serving(&report, costs, &today())?;
        finish(args, &cands, Some(&costs))
    };
    table().with_context(|| format!("after the engines ran; their measurements are saved in {}", saved.display()))
}

/// Offline or decoding mode, on the device's backend.
fn compare<B: Backend>(
    args: &CompareArgs,
    c: &Compare<'_>,
    device: &B::Device,
) -> Result<(Vec<Candidate>, Option<Costs>)> {
    let common = &args.common;
    if let Some(prompts) = &args.prompts {
        let target = common.target.as_deref().expect("clap requires --target with --prompts");
        let opts = DecodeOptions {
            shape: common.draft.shape()?,
            temperature: common.temperature,
            rule: common.rule,
            max_new_tokens: args.max_new_tokens,
            seed: common.seed,
        };
        let session = DecodeSession::<B>::load(target, prompts, common.pass.max_samples, &args.template, device)?;
        let place = (common.pass.device.to_string(), today());
        return Ok(run::decoding(c, &session, target, &opts, (&place.0, &place.1), device)?);
    }
    let shards = ShardEval::<B>::open(common.data_dir()?, common.target_head.as_deref(), device)?;
    let target = common.target_for_embedding();
    let cands = run::offline(c, &shards, target.as_deref(), &common.options()?, common.pass.max_samples, device)?;
    Ok((cands, c.costs.cloned()))
}
