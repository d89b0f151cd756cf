//! `aerie vocab build`: the draft vocabulary (`d2t`/`t2d`) of a prepared dataset, built from
//! masked-token frequencies or kept from an existing drafter, via `aerie_data::vocab`.

use std::path::PathBuf;

use aerie_data::vocab::{VocabOptions, build_vocab};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::progress;

/// `aerie vocab ...`
#[derive(Debug, Subcommand)]
pub enum VocabCommand {
    /// Build (or keep) the draft vocabulary of a prepared dataset.
    Build(BuildArgs),
}

/// Arguments of `aerie vocab build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Prepared dataset directory (from `aerie data prepare`).
    pub prepared: PathBuf,
    /// Draft vocabulary size Vd (e.g. 32000). With --keep-from it must match the drafter's.
    #[arg(long)]
    pub draft_vocab: Option<usize>,
    /// Output safetensors file (`d2t`, `t2d`); the JSON report goes beside it.
    #[arg(long)]
    pub out: PathBuf,
    /// Keep the mapping of this drafter (directory with model.safetensors, or the file) and
    /// report its coverage on this data; or a hub id `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub keep_from: Option<PathBuf>,
    /// Another prepared dataset (same tokenizer) to build the vocabulary over as well, weighted
    /// as much as the first whatever its size (repeatable): one map for the old domain and the
    /// new, for a fine-tune with `init.allow_vocab_override` (docs/training.md).
    #[arg(long, conflicts_with = "keep_from")]
    pub mix: Vec<PathBuf>,
    /// Target vocabulary size V (default: the one recorded by `data prepare`).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Splits to count (repeatable; default train).
    #[arg(long = "split")]
    pub splits: Vec<String>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie vocab`.
pub fn run(cmd: VocabCommand) -> Result<()> {
    match cmd {
        VocabCommand::Build(args) => build(&args),
    }
}

fn build(args: &BuildArgs) -> Result<()> {
    let opts = VocabOptions {
        draft_vocab_size: args.draft_vocab,
        vocab_size: args.vocab_size,
        splits: args.splits.clone(),
        keep_from: args.keep_from.clone(),
        mix: args.mix.clone(),
    };
    let pb = progress::bar(0, "vocab", "samples");
    let report = build_vocab(&args.prepared, &args.out, &opts, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    })
    .with_context(|| format!("building the draft vocabulary of {}", args.prepared.display()))?;
    pb.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "vocab       {} ({}, Vd {} of V {})",
        report.out.display(),
        report.source,
        report.draft_vocab_size,
        report.vocab_size
    );
    println!(
        "data        {} samples, {} masked tokens, {} distinct ids",
        report.samples, report.masked_tokens, report.distinct_tokens
    );
    println!(
        "coverage    {:.4} ({} of {} masked tokens)",
        report.coverage, report.covered_tokens, report.masked_tokens
    );
    if let Some(c) = report.rebuilt_coverage {
        println!("rebuilt     {c:.4} (a vocabulary rebuilt from this data; the drafter's mapping was kept)");
    }
    for d in &report.datasets {
        println!(
            "dataset     {} ({} masked tokens): coverage {:.4}",
            d.prepared.display(),
            d.masked_tokens,
            d.coverage
        );
    }
    if report.padded_ids > 0 {
        println!("padding     {} draft ids never occur in the data", report.padded_ids);
    }
    Ok(())
}
