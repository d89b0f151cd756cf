//! `aerie export`: write a drafter in the exact layout SGLang or vLLM/speculators loads, then
//! read it back and verify every tensor (the exporter checks itself).

use std::path::PathBuf;

use aerie_hub::export::{ExportOptions, export};
use aerie_model::checkpoint::{Dialect, Dtype};
use anyhow::{Result, anyhow};
use clap::Args;

/// Arguments of `aerie export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Source drafter directory (either dialect) or hub id `org/name[@revision]`.
    #[arg(value_parser = crate::model_ref::parse)]
    pub dir: PathBuf,
    /// `sglang` (midlayer.*, output-of-layer aux ids) or `speculators` (layers.0.*, vLLM).
    #[arg(long, value_parser = parse_dialect)]
    pub to: Dialect,
    /// Output directory (written atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// Target model (directory or hub id): supplies the embedding and layer count when the
    /// source lacks them.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: Option<PathBuf>,
    /// Float dtype to write (`f32`, `bf16`, `f16`); default keeps the source's, bit-identical.
    #[arg(long, value_parser = parse_dtype)]
    pub dtype: Option<Dtype>,
    /// Ship `embed_tokens.weight` (engines normally take it from the target).
    #[arg(long)]
    pub include_embedding: bool,
    /// Replace an existing drafter directory at --out.
    #[arg(long)]
    pub force: bool,
    /// Print the export report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_dialect(s: &str) -> Result<Dialect, String> {
    Dialect::parse(s).ok_or_else(|| format!("`{s}` is not a dialect: use `sglang` or `speculators`"))
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    Dtype::parse(s).filter(|d| d.is_float()).ok_or_else(|| format!("`{s}` is not a float dtype: use f32, bf16 or f16"))
}

/// Run `aerie export`.
pub fn run(args: ExportArgs) -> Result<()> {
    let opts = ExportOptions {
        target: args.target.clone(),
        dtype: args.dtype,
        include_embedding: args.include_embedding,
        overwrite: args.force,
    };
    let report = export(&args.dir, args.to, &args.out, opts).map_err(|e| anyhow!(e))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "exported {} ({}) → {} ({}): {} tensors, {} bytes, {}, aux {:?} ({:?}), verified by read-back",
            report.src.display(),
            report.from,
            report.out.display(),
            report.to,
            report.tensors.len(),
            report.bytes,
            report.dtype,
            report.aux_layer_ids,
            report.aux_convention
        );
        println!("for        {} (`{}` layout: serve it with {})", report.engine, report.to, report.engine);
    }
    Ok(())
}
