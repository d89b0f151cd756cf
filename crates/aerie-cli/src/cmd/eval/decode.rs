//! `aerie eval decode`: real EAGLE-3 speculative decoding on the native target, against plain
//! decoding of the same prompts in the same run; τ, tokens/s of both, measured costs.

use std::path::PathBuf;

use aerie_eval::accept::AcceptRule;
use aerie_eval::decode::{DecodeOptions, DecodeReport, DecodeSession, measured_costs};
use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;

use aerie_eval::cost::today;

use crate::cmd::common::DraftShapeArgs;
use crate::device::{DeviceArg, with_backend};
use crate::progress;

/// Arguments of `aerie eval decode`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// Target model directory (HF layout: config.json, safetensors, tokenizer) or hub id.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: PathBuf,
    /// Drafter directory (SGLang or speculators layout) or hub id.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub drafter: PathBuf,
    /// Prompt file, JSONL: MT-Bench (`turns`), `{"prompt": ...}` or `{"messages": [...]}`; or a
    /// named set (`mtbench`), fetched into `$AERIE_HOME` when missing.
    #[arg(long, value_parser = crate::cmd::assets::parse_prompts)]
    pub prompts: PathBuf,
    /// Draft layout.
    #[command(flatten)]
    pub draft: DraftShapeArgs,
    /// Sampling temperature; 0 decodes greedily.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Verify rule: greedy (temperature 0), onehot (argmax drafts, SGLang's rule) or sampling
    /// (drafts sampled from q; chains only). Default: greedy at temperature 0, onehot above.
    #[arg(long)]
    pub rule: Option<AcceptRule>,
    /// New tokens per answer at most.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Decode only the first N prompts.
    #[arg(long)]
    pub max_prompts: Option<usize>,
    /// Seed of the samplers.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Chat template: `auto` (the target's own), a built-in name, or a .jinja file.
    #[arg(long, default_value = "auto")]
    pub template: String,
    /// Write the measured costs (T_d, T_s, T_v(n), overhead) as a costs TOML for `aerie project`.
    #[arg(long)]
    pub costs_out: Option<PathBuf>,
    /// Write the report JSON here too (atomically).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the acceptance profile (`speculation_profile.json`: per-position rates, τ by output
    /// position, as the verdicts count) here, atomically.
    #[arg(long)]
    pub profile_out: Option<PathBuf>,
    /// Also decode the plain answers greedily N at a time (continuous batching) and report their
    /// throughput beside the batch-1 baseline: what serving without speculation gets from the
    /// same machine. Greedy only.
    #[arg(long)]
    pub plain_batch: Option<usize>,
    /// `cpu`, `cuda:N` or `wgpu:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

impl DecodeArgs {
    fn options(&self) -> Result<DecodeOptions> {
        let shape = self.draft.shape()?;
        let rule = self.rule.unwrap_or(if self.temperature == 0.0 { AcceptRule::Greedy } else { AcceptRule::Onehot });
        Ok(DecodeOptions {
            shape,
            temperature: self.temperature,
            rule,
            max_new_tokens: self.max_new_tokens,
            seed: self.seed,
        })
    }
}

/// Run `aerie eval decode`.
pub fn run(args: DecodeArgs) -> Result<()> {
    // Everything but the tree width against Vd can be checked before loading any model.
    args.options()?.validate(usize::MAX)?;
    if let Some(b) = args.plain_batch
        && (b == 0 || args.temperature != 0.0)
    {
        bail!("--plain-batch needs a batch size of at least 1 and greedy decoding (temperature 0)");
    }
    // Written after the whole run: refused now when it would replace an input.
    let inputs = [("--prompts", args.prompts.as_path()), ("--drafter", &args.drafter), ("--target", &args.target)];
    // ... and checked writable now (its directory created), not after minutes of decoding.
    for (flag, out) in [("--out", &args.out), ("--costs-out", &args.costs_out), ("--profile-out", &args.profile_out)] {
        if let Some(out) = out {
            aerie_data::owned::check_not_input(out, flag, &inputs)?;
            crate::cmd::common::writable(out).with_context(|| flag.to_string())?;
        }
    }
    with_backend!(args.device, |B, dev| decode::<B>(&args, &dev))
}

fn decode<B: Backend>(args: &DecodeArgs, device: &B::Device) -> Result<()> {
    let opts = args.options()?;
    let session = DecodeSession::<B>::load(&args.target, &args.prompts, args.max_prompts, &args.template, device)?;
    let pb = progress::bar((2 * session.answers() * args.max_new_tokens) as u64, "eval decode", "tok");
    let result = session.run(&args.target, &args.drafter, &opts, device, &mut |n| pb.inc(n as u64));
    pb.finish_and_clear();
    let (mut report, timings) = result?;
    if let Some(batch) = args.plain_batch {
        report.plain_batched = Some(session.plain_batched(&report.plain_answers, batch, args.max_new_tokens)?);
    }
    let prompts = &session.prompts;

    let json = serde_json::to_string(&report)?;
    if let Some(out) = &args.out {
        aerie_data::atomic::write_bytes(out, format!("{json}\n").as_bytes())?;
    }
    if let Some(path) = &args.profile_out {
        report.profile.write(path)?;
    }
    if let Some(path) = &args.costs_out {
        let Some(costs) = measured_costs(&timings, &args.target, &args.device.to_string(), &opts.shape, &today())
        else {
            bail!("no decode steps were timed (every answer ended at its first token); no costs file written");
        };
        let header =
            format!("# Measured by `aerie eval decode` on {} prompts of {}.\n", prompts.len(), args.prompts.display());
        aerie_data::atomic::write_bytes(path, format!("{header}{}", costs.to_toml()?).as_bytes())?;
    }
    if args.json {
        println!("{json}");
    } else {
        print_report(&report, args);
    }
    Ok(())
}

fn print_report(r: &DecodeReport, args: &DecodeArgs) {
    println!("target      {}", args.target.display());
    println!("drafter     {}", args.drafter.display());
    println!(
        "decoding    {:?}, temperature {}, rule {}, {} answers, {} cycles",
        r.options.shape,
        r.options.temperature,
        r.options.rule.name(),
        r.answers,
        r.cycles
    );
    println!(
        "τ           {:.3} (accept length, bonus included; {:.3} tokens kept per cycle)",
        r.tau, r.tokens_per_cycle
    );
    println!("position    α_i (conditional)   r_i (unconditional)");
    let a = &r.acceptance;
    for (i, (c, u)) in a.accept_rate_conditional.iter().zip(&a.accept_rate_unconditional).enumerate() {
        println!("{:<11} {:<19.4} {:.4}", i + 1, c, u);
    }
    println!("by output   {}", r.profile.bucket_line());
    println!(
        "plain       {} tokens, {:.1} tok/s decode ({:.1} end to end)",
        r.plain.tokens, r.plain.decode_tokens_per_s, r.plain.end_to_end_tokens_per_s
    );
    println!(
        "speculative {} tokens, {:.1} tok/s decode ({:.1} end to end)",
        r.speculative.tokens, r.speculative.decode_tokens_per_s, r.speculative.end_to_end_tokens_per_s
    );
    println!("speedup     {:.3}x (decode tokens/s, prefill excluded)", r.speedup);
    if let Some(b) = &r.plain_batched {
        println!(
            "plain ×{:<4} {} tokens, {:.1} tok/s end to end ({} of {} answers identical to batch 1)",
            b.batch, b.tokens, b.tokens_per_s, b.identical_answers, b.answers
        );
    }
    let ms = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2} ms"));
    let tv: Vec<String> = r.costs.t_v_ms.iter().map(|(n, v)| format!("T_v({n}) {v:.2} ms")).collect();
    println!(
        "costs       T_d {}  T_s {}  {}  cycle {}",
        ms(r.costs.t_d_ms),
        ms(r.costs.t_s_ms),
        tv.join("  "),
        ms(r.costs.cycle_ms)
    );
    match r.greedy_identical {
        Some(true) => println!("greedy      speculative output identical to plain greedy on every answer"),
        Some(false) => println!("greedy      {} answers DIFFER from plain greedy decoding", r.mismatched_answers),
        None => {}
    }
}
