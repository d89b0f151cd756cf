//! `aerie shards convert` / `aerie shards verify`: re-encode a captured dataset (so a change of
//! encoding or teacher does not mean a new capture) and check every value of one.

use std::path::PathBuf;

use aerie_data::shard::{ConvertOptions, HiddenDtype, ShardDataset, Teacher, convert};
use anyhow::Result;
use clap::{Args, Subcommand};

use crate::progress;

/// `aerie shards ...`
#[derive(Debug, Subcommand)]
pub enum ShardsCommand {
    /// Re-encode a dataset into another storage dtype (and optionally a smaller teacher).
    /// Resumable: rerun the same command after an interruption; DST is a valid dataset holding
    /// a prefix of SRC's shards at every instant.
    Convert(ConvertArgs),
    /// Read every value of a dataset: checksums, masks, ids, log-probs, scales, finiteness.
    Verify(VerifyArgs),
}

/// Arguments of `aerie shards convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Source shard directory.
    pub src: PathBuf,
    /// Storage of the hidden states in DST: bf16, f16, f32, fp8-e4m3 or int4.
    #[arg(long, value_parser = parse_dtype)]
    pub dtype: HiddenDtype,
    /// The teacher DST keeps, a part of SRC's (`topk:K` from `final-hidden+topk:K`, or a
    /// smaller K); default: SRC's.
    #[arg(long, value_parser = parse_teacher)]
    pub teacher: Option<Teacher>,
    /// Destination directory (created, or resumed).
    #[arg(long)]
    pub out: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `aerie shards verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Shard directory.
    pub dir: PathBuf,
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

/// Run `aerie shards`.
pub fn run(cmd: ShardsCommand) -> Result<()> {
    match cmd {
        ShardsCommand::Convert(a) => {
            let opts = ConvertOptions { dtype: a.dtype, teacher: a.teacher, checksums: true };
            let pb = progress::bar(0, "convert", "shards");
            let r = convert(&a.src, &a.out, &opts, &mut |done, total| {
                pb.set_length(total as u64);
                pb.set_position(done as u64);
            })?;
            pb.finish_and_clear();
            if a.json {
                let v = serde_json::json!({
                    "out": a.out,
                    "dtype": a.dtype.as_str(),
                    "shards": r.shards,
                    "resumed_shards": r.resumed_shards,
                    "converted_samples": r.converted_samples,
                    "converted_tokens": r.converted_tokens,
                    "tokens": r.tokens,
                    "src_bytes": r.src_bytes,
                    "dst_bytes": r.dst_bytes,
                    "src_bytes_per_token": r.src_bytes_per_token(),
                    "dst_bytes_per_token": r.dst_bytes_per_token(),
                    "seconds": r.seconds,
                });
                println!("{v}");
            } else {
                println!(
                    "converted {} samples ({} tokens; {} of {} shards resumed) into {} as {}: {:.0} → {:.0} bytes per token",
                    r.converted_samples,
                    r.converted_tokens,
                    r.resumed_shards,
                    r.shards,
                    a.out.display(),
                    a.dtype,
                    r.src_bytes_per_token(),
                    r.dst_bytes_per_token()
                );
            }
        }
        ShardsCommand::Verify(a) => {
            let dataset = ShardDataset::open(&a.dir)?;
            let r = dataset.verify()?;
            if a.json {
                let v = serde_json::json!({
                    "dir": a.dir,
                    "dtype": dataset.metadata().dtype.as_str(),
                    "shards": r.shards,
                    "checksums": r.checksums,
                    "samples": r.samples,
                    "tokens": r.tokens,
                    "masked_tokens": r.masked_tokens,
                });
                println!("{v}");
            } else {
                println!(
                    "{}: {} samples / {} tokens in {} shards verified ({} checksums), dtype {}",
                    a.dir.display(),
                    r.samples,
                    r.tokens,
                    r.shards,
                    r.checksums,
                    dataset.metadata().dtype
                );
            }
        }
    }
    Ok(())
}
