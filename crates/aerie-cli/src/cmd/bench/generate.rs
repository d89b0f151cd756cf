//! `aerie bench generate`: tokens/s of the native target's batched greedy generation at several
//! batch sizes beside the machine's limits (aerie-eval's `generation`, measured by aerie-model's
//! `native::bench`); this module parses and prints.

use std::path::PathBuf;

use aerie_eval::generation::{GenerateBenchOptions, bench_generate_prompts};
use anyhow::Result;
use clap::Args;

/// Arguments of `aerie bench generate`.
#[derive(Debug, Args)]
pub struct GenerateBenchArgs {
    /// Target model directory or hub id `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: PathBuf,
    /// Prompt file (MT-Bench `question.jsonl`, `{"prompt"}` or `{"messages"}` lines, as for
    /// `aerie eval decode`), or a named set (`mtbench`); each prompt's first turn is used.
    #[arg(long, value_parser = crate::cmd::assets::parse_prompts)]
    pub prompts: PathBuf,
    /// Batch sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub batch: Vec<usize>,
    /// Prompts generated per batch size (default: the largest batch size).
    #[arg(long)]
    pub num_prompts: Option<usize>,
    /// New tokens per prompt (eos ignored, so every run decodes the same tokens).
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie bench generate` (CPU backend).
pub fn run(a: &GenerateBenchArgs) -> Result<()> {
    let opts =
        GenerateBenchOptions { batch: a.batch.clone(), num_prompts: a.num_prompts, max_new_tokens: a.max_new_tokens };
    let report = bench_generate_prompts(&a.target, &a.prompts, &opts)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{}: {} threads, {:.1} MB of weights per step ({:.1} GB/s copy: ≤ {:.0} steps/s), {:.3} GFLOP/token ({:.1} GFLOP/s matmul: ≤ {:.0} tokens/s)",
            report.target.display(),
            report.threads,
            report.step_weight_bytes as f64 / 1e6,
            report.copy_gb_per_second,
            report.bandwidth_bound_steps_per_second,
            report.flops_per_token / 1e9,
            report.matmul_gflops,
            report.compute_bound_tokens_per_second
        );
        for r in &report.runs {
            println!(
                "  batch {:>3}: {} tokens in {:.1} s, {:.1} tokens/s (decode {:.1} tokens/s, {:.1} GFLOP/s; prefill {:.1} s){}",
                r.batch,
                r.tokens,
                r.seconds,
                r.tokens_per_second,
                r.decode_tokens_per_second,
                r.decode_gflops,
                r.prefill_seconds,
                r.identical_to_batch_1.map_or(String::new(), |k| format!("; {k}/{} identical to batch 1", r.sequences))
            );
        }
    }
    Ok(())
}
