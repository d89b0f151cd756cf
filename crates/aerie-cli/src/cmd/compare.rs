//! `aerie compare`: `eval accept` for each candidate drafter on the same data, projected through
//! a costs file, written as one table (Markdown, CSV, Parquet, JSON) with PNG and SVG plots.

use std::path::PathBuf;

use aerie_eval::compare::{Candidate, rows, write_report};
use aerie_eval::cost::Costs;
use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;

use super::accept::{AcceptCommon, accept_one, open_data, samples};
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
    /// Print the table rows as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

fn default_name(p: &std::path::Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// Run `aerie compare`.
pub fn run(args: CompareArgs) -> Result<()> {
    if !args.names.is_empty() && args.names.len() != args.drafters.len() {
        bail!("--names has {} entries for {} drafters", args.names.len(), args.drafters.len());
    }
    args.common.options()?;
    let costs = args.costs.as_deref().map(Costs::load).transpose().context("reading the costs file")?;
    with_backend!(args.common.device, |B, dev| compare::<B>(&args, costs.as_ref(), &dev))
}

fn compare<B: Backend>(args: &CompareArgs, costs: Option<&Costs>, device: &B::Device) -> Result<()> {
    let (data, head) = open_data::<B>(&args.common, device)?;
    let n = args.drafters.len();
    let per = samples(&args.common, &data);
    // One bar across all candidates: n × samples, the current candidate in its prefix.
    let pb = indicatif::ProgressBar::new((n * per) as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "compare {prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} samples ({per_sec}, ETA {eta})",
        )
        .expect("valid template"),
    );
    let mut cands = Vec::with_capacity(n);
    for (i, dir) in args.drafters.iter().enumerate() {
        let name = args.names.get(i).cloned().unwrap_or_else(|| default_name(dir));
        pb.set_prefix(format!("[{}/{n}] {name}", i + 1));
        let report = accept_one::<B>(
            dir,
            &args.common,
            &data,
            head.as_ref(),
            &|d| pb.set_position((i * per + d) as u64),
            device,
        );
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                pb.abandon();
                return Err(e);
            }
        };
        pb.println(format!("[{}/{n}] {name}: τ {:.3}", i + 1, report.tau));
        cands.push(Candidate::new(name, dir.display().to_string(), report, costs));
    }
    pb.finish_and_clear();
    let written = write_report(&args.out, &cands, costs)?;
    if args.json {
        let v = serde_json::json!({ "rows": rows(&cands), "files": written });
        println!("{}", serde_json::to_string(&v)?);
    } else {
        print!("{}", aerie_eval::compare::markdown(&rows(&cands), costs));
        println!();
        for p in &written {
            println!("wrote      {}", p.display());
        }
    }
    Ok(())
}
