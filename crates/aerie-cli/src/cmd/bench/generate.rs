//! `aerie bench generate`: tokens/s of the native target's batched greedy generation at several
//! batch sizes, on real prompts rendered by the target's chat template, beside what the machine
//! allows: the weight bytes every decode step reads (against the host's measured copy rate) and
//! the FLOPs of a token (against a measured matmul rate). Every batch size runs the same prompts
//! for the same number of tokens (eos ignored), and the outputs are compared with batch 1's.

use std::path::PathBuf;
use std::time::Instant;

use aerie_data::template::{ChatTemplate, TemplateChoice};
use aerie_data::tokenizer::TokenizerFiles;
use aerie_eval::prompts::read_prompts;
use aerie_model::TargetModel;
use aerie_model::native::TargetSpec;
use aerie_model::native::batch::{BatchGenerator, GenerationRequest, greedy};
use anyhow::{Context, Result, bail};
use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::{Distribution, Tensor};
use clap::Args;
use serde::Serialize;

/// Arguments of `aerie bench generate`.
#[derive(Debug, Args)]
pub struct GenerateBenchArgs {
    /// Target model directory.
    #[arg(long)]
    pub target: PathBuf,
    /// Prompt file (MT-Bench `question.jsonl`, `{"prompt"}` or `{"messages"}` lines, as for
    /// `aerie eval decode`); each prompt's first turn is used.
    #[arg(long)]
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

/// One batch size.
#[derive(Debug, Serialize)]
struct BatchRun {
    batch: usize,
    sequences: usize,
    tokens: usize,
    seconds: f64,
    tokens_per_second: f64,
    /// Seconds in the prompts' prefills (their first tokens included).
    prefill_seconds: f64,
    /// Tokens after the first per second of the remaining time.
    decode_tokens_per_second: f64,
    /// Sequences whose tokens equal batch 1's (all of them, unless a near tie flipped).
    identical_to_batch_1: Option<usize>,
    /// FLOPs per second achieved by the decode steps (analytic count).
    decode_gflops: f64,
}

/// The report.
#[derive(Debug, Serialize)]
struct GenerateBench {
    target: PathBuf,
    threads: usize,
    /// Parameters read by every decode step (all but the embedding table, lm_head included).
    step_weight_bytes: u64,
    /// FLOPs of one decoded token at the mean context of the runs (matmuls and attention).
    flops_per_token: f64,
    mean_context: f64,
    /// Host memory copy rate, GB/s (best of 3, 256 MiB, this process's threads).
    copy_gb_per_second: f64,
    /// Decode steps per second if a step cost only reading its weights once.
    bandwidth_bound_steps_per_second: f64,
    /// f32 matmul rate of this backend on a decode-shaped product (`[256, H] × [H, I]`), GFLOP/s.
    matmul_gflops: f64,
    /// Tokens per second if decoding ran at the matmul rate.
    compute_bound_tokens_per_second: f64,
    runs: Vec<BatchRun>,
}

/// Run `aerie bench generate` (CPU backend).
pub fn run(a: &GenerateBenchArgs) -> Result<()> {
    if a.batch.is_empty() || a.batch.contains(&0) || a.max_new_tokens == 0 {
        bail!("--batch needs sizes >= 1 and --max-new-tokens >= 1");
    }
    let device = Default::default();
    let target = TargetModel::<Flex>::load(&a.target, &device)
        .with_context(|| format!("loading target {}", a.target.display()))?;
    let tok = TokenizerFiles::load(&a.target)?;
    let template = ChatTemplate::resolve(&TemplateChoice::Auto, &tok)?;
    let n = a.num_prompts.unwrap_or_else(|| *a.batch.iter().max().expect("non-empty"));
    let prompts = read_prompts(&a.prompts)?;
    if prompts.is_empty() {
        bail!("{}: no prompts", a.prompts.display());
    }
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .cycle()
        .take(n)
        .map(|p| {
            let text = template.render(&p.context, true)?;
            Ok(tok.tokenizer.encode(text.as_str(), false).map_err(|e| anyhow::anyhow!("{e}"))?.get_ids().to_vec())
        })
        .collect::<Result<_>>()?;

    let mut runs = Vec::new();
    let mut reference: Option<Vec<Vec<u32>>> = None;
    let spec = target.spec().clone();
    let mean_context = ids.iter().map(|p| p.len() as f64 + a.max_new_tokens as f64 / 2.0).sum::<f64>() / n as f64;
    let flops_per_token = flops_per_token(&spec, mean_context);
    for &b in &a.batch {
        let mut generator = BatchGenerator::new(&target, b, &[])?;
        for (i, p) in ids.iter().enumerate() {
            generator.push(GenerationRequest { id: i as u64, prompt: p.clone(), max_new_tokens: a.max_new_tokens })?;
        }
        let start = Instant::now();
        let mut pick = greedy::<Flex>;
        let mut done = generator.run_to_end(&mut pick)?;
        let seconds = start.elapsed().as_secs_f64();
        done.sort_by_key(|g| g.id);
        let prefill_seconds: f64 = done.iter().map(|g| g.prefill_seconds).sum();
        let tokens: usize = done.iter().map(|g| g.tokens.len()).sum();
        let outputs: Vec<Vec<u32>> = done.into_iter().map(|g| g.tokens).collect();
        let identical = reference.as_ref().map(|r| r.iter().zip(&outputs).filter(|(x, y)| x == y).count());
        if b == 1 {
            reference = Some(outputs);
        }
        let decode_tokens = tokens - n;
        let decode_seconds = (seconds - prefill_seconds).max(1e-9);
        runs.push(BatchRun {
            batch: b,
            sequences: n,
            tokens,
            seconds,
            tokens_per_second: tokens as f64 / seconds,
            prefill_seconds,
            decode_tokens_per_second: decode_tokens as f64 / decode_seconds,
            identical_to_batch_1: identical,
            decode_gflops: flops_per_token * decode_tokens as f64 / decode_seconds / 1e9,
        });
    }
    let step_weight_bytes = step_weight_bytes(&target);
    let copy = copy_gb_per_second();
    let matmul = matmul_gflops(spec.hidden_size, spec.intermediate_size);
    let report = GenerateBench {
        target: a.target.clone(),
        threads: std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        step_weight_bytes,
        flops_per_token,
        mean_context,
        copy_gb_per_second: copy,
        bandwidth_bound_steps_per_second: copy * 1e9 / step_weight_bytes as f64,
        matmul_gflops: matmul,
        compute_bound_tokens_per_second: matmul * 1e9 / flops_per_token,
        runs,
    };
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

/// FLOPs of one decoded token at context `t`: 2 per weight of the layers and the head, plus the
/// attention scores and weighted sum (2·2·t·nH·d per layer).
fn flops_per_token(s: &TargetSpec, t: f64) -> f64 {
    let (h, d) = (s.hidden_size as f64, s.head_dim as f64);
    let (nh, nkv) = (s.num_attention_heads as f64, s.num_key_value_heads as f64);
    let per_layer = h * nh * d * 2.0 + h * nkv * d * 2.0 + 3.0 * h * s.intermediate_size as f64;
    let matmul = 2.0 * (per_layer * s.num_hidden_layers as f64 + h * s.vocab_size as f64);
    matmul + 4.0 * t * nh * d * s.num_hidden_layers as f64
}

/// Bytes of every parameter except the embedding table (a decode step looks up R rows of it).
fn step_weight_bytes(target: &TargetModel<Flex>) -> u64 {
    let embed = target.model.embed_tokens.weight.val();
    let elem = embed.dtype().size() as u64;
    let [v, h] = embed.dims();
    (target.num_params() as u64 - (v * h) as u64) * elem
}

/// Host memory copy rate: best of 3 copies of 256 MiB (read + write counted).
fn copy_gb_per_second() -> f64 {
    let n = 64 << 20;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * (n * 4) as f64 / best / 1e9
}

/// f32 matmul GFLOP/s on `[256, h] × [h, i]`, best of 5.
fn matmul_gflops(h: usize, i: usize) -> f64 {
    let device = Default::default();
    let x = Tensor::<Flex, 2>::random([256, h], Distribution::Normal(0.0, 1.0), &device);
    let w = Tensor::<Flex, 2>::random([h, i], Distribution::Normal(0.0, 1.0), &device);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let y = x.clone().matmul(w.clone());
        let _ = y.into_data();
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * 256.0 * h as f64 * i as f64 / best / 1e9
}
