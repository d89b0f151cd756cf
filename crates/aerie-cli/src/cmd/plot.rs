//! `aerie plot RUN... --out FILE`: the training curves of one or more runs on one PNG or SVG
//! (aerie-train's `metrics::curves`), the same numbers `tensorboard --logdir` shows from the
//! event files beside each run's `metrics.jsonl`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

/// Arguments of `aerie plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Run directories of `aerie train` (or their `metrics.jsonl` files); each run is one colour.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The chart: `.png` or `.svg`.
    #[arg(long)]
    pub out: PathBuf,
}

/// Run `aerie plot`.
pub fn run(a: PlotArgs) -> Result<()> {
    aerie_train::metrics::curves::plot_runs(&a.runs, &a.out)?;
    println!("{}", a.out.display());
    Ok(())
}
