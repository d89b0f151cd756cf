//! Tokens/s of the native target's batched greedy generation ([`super::batch`]) at several batch
//! sizes, beside what the machine allows: the weight bytes every decode step reads (against the
//! host's measured copy rate) and the FLOPs of a token (against a measured matmul rate). Every
//! batch size runs the same prompts for the same number of tokens (eos ignored), and the outputs
//! are compared with batch 1's. CPU backend (burn-flex), as the host kernels it measures.
//!
//! The prompts arrive as token ids; `aerie bench generate` renders them from a prompt file
//! (aerie-eval's `generation`).

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::{Distribution, Tensor};
use serde::Serialize;

use super::TargetSpec;
use super::batch::{BatchGenerator, GenerationRequest, greedy};
use super::llama::TargetModel;
use crate::{Error, Result};

/// One batch size.
#[derive(Debug, Clone, Serialize)]
pub struct BatchRun {
    /// Sequences decoded at once.
    pub batch: usize,
    /// Sequences in all.
    pub sequences: usize,
    /// New tokens in all.
    pub tokens: usize,
    /// Wall seconds of the run.
    pub seconds: f64,
    /// tokens / seconds.
    pub tokens_per_second: f64,
    /// Seconds in the prompts' prefills (their first tokens included).
    pub prefill_seconds: f64,
    /// Tokens after the first per second of the remaining time.
    pub decode_tokens_per_second: f64,
    /// Sequences whose tokens equal batch 1's (all of them, unless a near tie flipped).
    pub identical_to_batch_1: Option<usize>,
    /// FLOPs per second achieved by the decode steps (analytic count).
    pub decode_gflops: f64,
}

/// The report (`aerie bench generate --json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct GenerateBench {
    /// The target's directory.
    pub target: PathBuf,
    /// rayon threads (`RAYON_NUM_THREADS`, else the machine's parallelism).
    pub threads: usize,
    /// Parameters read by every decode step (all but the embedding table, lm_head included).
    pub step_weight_bytes: u64,
    /// FLOPs of one decoded token at the mean context of the runs (matmuls and attention).
    pub flops_per_token: f64,
    /// Mean context: prompt plus half the new tokens.
    pub mean_context: f64,
    /// Host memory copy rate, GB/s (best of 3, 256 MiB, this process's threads).
    pub copy_gb_per_second: f64,
    /// Decode steps per second if a step cost only reading its weights once.
    pub bandwidth_bound_steps_per_second: f64,
    /// f32 matmul rate of this backend on a decode-shaped product (`[256, H] × [H, I]`), GFLOP/s.
    pub matmul_gflops: f64,
    /// Tokens per second if decoding ran at the matmul rate.
    pub compute_bound_tokens_per_second: f64,
    /// One entry per batch size, in the order asked.
    pub runs: Vec<BatchRun>,
}

/// Generate `max_new_tokens` for every prompt of `prompts` at each batch size of `batches`, and
/// measure the machine's limits beside it. `target_dir` only names the target in the report.
pub fn bench_generate(
    target: &TargetModel<Flex>,
    target_dir: PathBuf,
    prompts: &[Vec<u32>],
    batches: &[usize],
    max_new_tokens: usize,
) -> Result<GenerateBench> {
    check_options(batches, max_new_tokens)?;
    if prompts.is_empty() {
        return Err(Error::Shape("no prompts to generate from".into()));
    }
    let n = prompts.len();
    let mut runs = Vec::new();
    let mut reference: Option<Vec<Vec<u32>>> = None;
    let spec = target.spec().clone();
    let mean_context = prompts.iter().map(|p| p.len() as f64 + max_new_tokens as f64 / 2.0).sum::<f64>() / n as f64;
    let flops_per_token = flops_per_token(&spec, mean_context);
    for &b in batches {
        let mut generator = BatchGenerator::new(target, b, &[])?;
        for (i, p) in prompts.iter().enumerate() {
            generator.push(GenerationRequest { id: i as u64, prompt: p.clone(), max_new_tokens })?;
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
    let step_weight_bytes = step_weight_bytes(target);
    let copy = copy_gb_per_second();
    let matmul = matmul_gflops(spec.hidden_size, spec.intermediate_size);
    Ok(GenerateBench {
        target: target_dir,
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
    })
}

/// Refuse batch sizes of 0 (or none) and a zero token budget, before anything is loaded.
pub fn check_options(batches: &[usize], max_new_tokens: usize) -> Result<()> {
    if batches.is_empty() || batches.contains(&0) || max_new_tokens == 0 {
        return Err(Error::Shape("--batch needs sizes >= 1 and --max-new-tokens >= 1".into()));
    }
    Ok(())
}

/// FLOPs of one decoded token at context `t`: 2 per weight of the layers and the head, plus the
/// attention scores and weighted sum (2·2·t·nH·d per layer).
pub fn flops_per_token(s: &TargetSpec, t: f64) -> f64 {
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
