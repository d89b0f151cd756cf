//! `aerie quickstart`: the README's main job. From nothing to a trained, evaluated drafter
//! exported for SGLang, on a CPU: fetch the pinned assets, import SmolLM2 from GGUF, regenerate
//! ShareGPT conversations with SmolLM2's own answers (batched; `--answers dataset` keeps
//! ShareGPT's GPT-3.5 answers instead), prepare them, build the draft vocabulary, capture, train,
//! evaluate, export, and decode MT-Bench prompts speculatively against plain decoding.
//!
//! Each stage runs the same `aerie` subcommand a user would type (so the quickstart exercises
//! exactly the public interface) and is skipped when its output already exists, which also makes
//! an interrupted quickstart resumable.

use std::path::{Path, PathBuf};
use std::time::Instant;

use aerie_hub::assets::{Asset, AssetStore};
use aerie_train::metrics::Summary;
use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use crate::cmd::common::reports::{self, DecodeBrief, EvalLossReport, RegenerateBrief};
use crate::cmd::common::stages::{self, Argv, Runner, StageTime, latest_checkpoint};

/// The training recipe, with `@WORK@` standing for the work directory.
const RECIPE: &str = include_str!("../../../../configs/quickstart-smollm2.toml");

/// Drafts per verify step of the held-out evaluation: the target is τ ≥ 2.0 at k = 3
/// (SGLang's `--speculative-num-steps 3`).
const EVAL_K: usize = 3;

/// Whose answers the drafter is trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Answers {
    /// SmolLM2's own greedy answers to ShareGPT's prompts (`aerie regenerate`): what the
    /// drafter must predict at decode time.
    Target,
    /// ShareGPT's own (GPT-3.5) answers.
    Dataset,
}

/// Arguments of `aerie quickstart`.
#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// Work directory for every intermediate and final output.
    #[arg(long, default_value = "aerie-quickstart")]
    pub workdir: PathBuf,
    /// Train on the target's own answers (`target`, regenerated first) or on the dataset's.
    #[arg(long, value_enum, default_value = "target")]
    pub answers: Answers,
    /// ShareGPT conversations to prepare (`--answers dataset`; 2000) or to regenerate
    /// (`--answers target`; default: enough for the captured samples).
    #[arg(long)]
    pub conversations: Option<u64>,
    /// Sequences SmolLM2 decodes at once while regenerating.
    #[arg(long, default_value_t = 32)]
    pub regenerate_batch: usize,
    /// New tokens per regenerated answer at most (prompt plus answer stay within
    /// `--max-length`).
    #[arg(long, default_value_t = 256)]
    pub regenerate_max_new_tokens: usize,
    /// Maximum tokens per sample.
    #[arg(long, default_value_t = 384)]
    pub max_length: usize,
    /// Draft vocabulary size.
    #[arg(long, default_value_t = 4096)]
    pub draft_vocab: usize,
    /// Training samples to capture, ≈ 360 tokens each with the dataset's answers, ≈ 220 with
    /// the target's (one regenerated turn): the quickstart's budget knob (default 320 with
    /// `--answers dataset`, 240 with `--answers target`, whose regeneration also takes time).
    /// With ShareGPT's answers on 2 cores, 320 samples took 13.8 minutes in all (held-out
    /// τ(k=3) 1.43; 160 gave 1.35).
    #[arg(long)]
    pub train_samples: Option<usize>,
    /// Held-out samples to capture for evaluation.
    #[arg(long, default_value_t = 16)]
    pub eval_samples: usize,
    /// MT-Bench questions (both turns) decoded speculatively and plainly by `eval decode` at the
    /// end (0 skips the stage).
    #[arg(long, default_value_t = 4)]
    pub decode_prompts: usize,
    /// New tokens per answer of the `eval decode` stage.
    #[arg(long, default_value_t = 64)]
    pub decode_max_new_tokens: usize,
    /// Draft chain lengths decoded by `eval decode`, one run each (comma-separated): the report
    /// names the fastest. A weak drafter can pay at k = 1 and lose at k = 3, where a verify pass
    /// checks four tokens.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub decode_k: Vec<usize>,
    /// Extra `--set key=value` overrides for the training recipe.
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Print the final report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    workdir: PathBuf,
    /// Whose answers the drafter was trained on.
    answers: Answers,
    /// `aerie regenerate`'s report (`--answers target`), whole.
    regenerate: Option<serde_json::Value>,
    /// What the summary prints of it.
    #[serde(skip)]
    regenerate_brief: Option<RegenerateBrief>,
    /// Wall time of the whole quickstart (stages skipped because their output existed cost ~0).
    total_seconds: f64,
    stages: Vec<StageTime>,
    /// Draft steps of the held-out evaluation (`eval loss --ttt-length`): τ is the simulated
    /// accept length of a chain of `eval_k` drafts, in [1, eval_k + 1].
    eval_k: usize,
    /// `eval loss` of the initial drafter (0 training steps) on the held-out shards.
    eval_before: EvalLossReport,
    /// `eval loss` of the trained drafter on the same shards.
    eval_after: EvalLossReport,
    /// Token positions trained on and the training throughput (from the run's `summary.json`).
    train_tokens: f64,
    train_tokens_per_s: f64,
    drafter: PathBuf,
    sglang_export: PathBuf,
    /// The training curves (`aerie plot` of the run).
    curves: PathBuf,
    /// `eval decode` of the exported drafter on MT-Bench at the fastest of the `--decode-k`
    /// chain lengths: real speculative decoding beside plain decoding, greedy (the whole
    /// report, as `decode-k{K}.json` holds it).
    decode: Option<serde_json::Value>,
    /// The chain length of `decode`.
    decode_k: Option<usize>,
    /// What the summary prints of `decode`.
    #[serde(skip)]
    decode_brief: Option<DecodeBrief>,
    /// Every `--decode-k` run in brief (`decode-k{K}.json` holds each whole).
    decode_by_k: Vec<DecodeAtK>,
}

/// One chain length of the `eval decode` stage.
#[derive(Debug, Serialize)]
struct DecodeAtK {
    k: usize,
    tau: Option<f64>,
    speedup: Option<f64>,
    /// Plain decode step and verify pass of k + 1 tokens, ms.
    t_d_ms: Option<f64>,
    t_v_ms: Option<f64>,
    greedy_identical: Option<bool>,
    /// Plain decoding of the same answers all at once, tokens/s end to end (first k only).
    plain_batched_tokens_per_s: Option<f64>,
}

/// Run `aerie quickstart`.
pub fn run(mut args: QuickstartArgs) -> Result<()> {
    let train_samples = args.train_samples.unwrap_or(match args.answers {
        Answers::Target => 240,
        Answers::Dataset => 320,
    });
    args.train_samples = Some(train_samples);
    let work = std::path::absolute(&args.workdir)?;
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let mut r = Runner::new("quickstart")?;

    let start = Instant::now();
    let store = AssetStore::from_env();
    let mut fetched = Vec::new();
    for asset in [Asset::Smollm2, Asset::Sharegpt, Asset::Mtbench] {
        eprintln!("== assets: {asset}");
        fetched.push(store.fetch(asset.spec(), &mut |_, _| {}).with_context(|| format!("fetching asset {asset}"))?);
    }
    r.record("assets", start);
    let (gguf, sharegpt, mtbench) = (fetched[0].path.clone(), fetched[1].path.clone(), fetched[2].path.clone());

    let target = work.join("smollm2");
    r.stage(
        "import",
        &target.join("config.json"),
        &Argv::new(&["import", "gguf"]).arg(gguf).flag("--out", target.clone()),
        false,
    )?;
    // The chat data the drafter learns from: SmolLM2's own answers to ShareGPT prompts, or
    // ShareGPT's. Regeneration is bounded by --max-length like the samples, so no answer token
    // is generated that prepare would cut.
    let (chat, conversations, regenerate) = match args.answers {
        Answers::Dataset => (sharegpt.clone(), args.conversations.unwrap_or(2000), None),
        Answers::Target => {
            let want = args.conversations.unwrap_or(((train_samples + args.eval_samples) as u64) * 21 / 20 + 8);
            let regen = work.join("regenerated.jsonl");
            r.stage(
                "regenerate",
                &regen,
                &Argv::new(&["regenerate"])
                    .flag("--target", target.clone())
                    .flag("--data", sharegpt.clone())
                    .flag("--out", regen.clone())
                    .flag("--max-samples", want.to_string())
                    .flag("--max-length", args.max_length.to_string())
                    .flag("--max-new-tokens", args.regenerate_max_new_tokens.to_string())
                    .flag("--batch-size", args.regenerate_batch.to_string())
                    .flag("--max-turns", "1"),
                false,
            )?;
            let path = aerie_capture::regenerate::report_path(&regen);
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let brief: RegenerateBrief = reports::parse(&path, &text)?;
            let whole: serde_json::Value = reports::parse(&path, &text)?;
            (regen, want, Some((brief, whole)))
        }
    };
    // Enough held-out samples for --eval-samples whatever the data size (at least 5%).
    let total = (train_samples + args.eval_samples) as f64;
    let eval_fraction = (args.eval_samples as f64 * 1.25 / total.min(conversations as f64)).clamp(0.05, 0.5);
    let prepared = work.join("prepared");
    r.stage(
        "prepare",
        &prepared.join("report.json"),
        &Argv::new(&["data", "prepare"])
            .flag("--data", chat)
            .flag("--tokenizer", target.clone())
            .flag("--out", prepared.clone())
            .flag("--max-length", args.max_length.to_string())
            .flag("--max-samples", conversations.to_string())
            .flag("--split", format!("eval={eval_fraction:.3}")),
        false,
    )?;
    let vocab = work.join("vocab.safetensors");
    r.stage(
        "vocab",
        &vocab,
        &Argv::new(&["vocab", "build"])
            .arg(prepared.clone())
            .flag("--draft-vocab", args.draft_vocab.to_string())
            .flag("--out", vocab.clone()),
        false,
    )?;
    for (split, n) in [("train", train_samples), ("eval", args.eval_samples)] {
        let out = work.join("shards").join(split);
        stages::capture(&mut r, &format!("capture {split}"), &target, &prepared, split, Some(n), &out, false)?;
    }

    let config = work.join("train.toml");
    std::fs::write(&config, RECIPE.replace("@WORK@", &work.to_string_lossy()))?;
    // Both runs leave the held-out evaluation to the `eval loss` stages below (one evaluation
    // each, before and after, with the same command and settings).
    let train_args = |extra: &[&str]| {
        let sets = args.set.iter().map(String::as_str).chain(["data.eval=[]"]).chain(extra.iter().copied());
        sets.fold(Argv::new(&["train"]).arg(config.clone()), |a, s| a.flag("--set", s))
    };
    // The initial drafter (0 steps, the same recipe and seed): the "before" of the report.
    let initial_dir = work.join("initial");
    let initial_out = initial_dir.to_string_lossy().into_owned();
    r.stage(
        "initial drafter",
        &initial_dir.join("summary.json"),
        &train_args(&["optim.max_steps=0", &format!("output_dir={initial_out}")]),
        false,
    )?;
    let initial = latest_checkpoint(&initial_dir)?;
    let run_dir = work.join("run");
    let mut main_args = train_args(&[]);
    if !run_dir.join("summary.json").exists() && latest_checkpoint(&run_dir).is_ok() {
        // An interrupted training run: continue it from its newest checkpoint.
        main_args = main_args.flag("--resume", run_dir.clone());
    }
    r.stage("train", &run_dir.join("summary.json"), &main_args, false)?;
    let drafter = latest_checkpoint(&run_dir)?;
    // The training curves, as `tensorboard --logdir RUN` shows them from the run's event file.
    let curves = work.join("curves.png");
    r.stage("plot", &curves, &Argv::new(&["plot"]).arg(run_dir.clone()).flag("--out", curves.clone()), false)?;
    let training: Summary = reports::read(&run_dir.join("summary.json"))?;

    let eval = |r: &mut Runner, name: &str, drafter: &Path| -> Result<EvalLossReport> {
        let out = r.stage(
            name,
            Path::new(""),
            &Argv::new(&["eval", "loss"])
                .flag("--drafter", drafter)
                .flag("--data", work.join("shards/eval"))
                .flag("--target-head", target.clone())
                .flag("--ttt-length", EVAL_K.to_string())
                .arg("--json"),
            true,
        )?;
        reports::parse(Path::new("`aerie eval loss --json` output"), out.trim())
    };
    let eval_before = eval(&mut r, "eval initial", &initial)?;
    let eval_after = eval(&mut r, "eval", &drafter)?;
    let export = work.join("drafter-sglang");
    r.stage(
        "export",
        &export.join("config.json"),
        &Argv::new(&["export"])
            .arg(drafter.clone())
            .flag("--to", aerie_model::checkpoint::Dialect::Sglang.name())
            .flag("--out", export.clone())
            .flag("--target", target.clone()),
        false,
    )?;

    let mut decode_by_k = Vec::new();
    let mut decode: Option<(usize, DecodeBrief, serde_json::Value)> = None;
    for &k in if args.decode_prompts > 0 { &args.decode_k[..] } else { &[] } {
        let (out, costs) = (work.join(format!("decode-k{k}.json")), work.join(format!("costs-k{k}.toml")));
        let mut decode_args = Argv::new(&["eval", "decode"])
            .flag("--target", target.clone())
            .flag("--drafter", export.clone())
            .flag("--prompts", mtbench.clone())
            .flag("--max-prompts", args.decode_prompts.to_string())
            .flag("--max-new-tokens", args.decode_max_new_tokens.to_string())
            .flag("--k", k.to_string())
            .flag("--out", out.clone())
            .flag("--costs-out", costs.clone());
        if k == args.decode_k[0] {
            // Once: the throughput of plain decoding with every answer in flight at once.
            decode_args = decode_args.flag("--plain-batch", (2 * args.decode_prompts).to_string());
        }
        // `eval decode` writes the report, then the costs file: the costs file marks it done.
        r.stage(&format!("eval decode k={k}"), &costs, &decode_args, false)?;
        let text = std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
        let d: DecodeBrief = reports::parse(&out, &text)?;
        decode_by_k.push(DecodeAtK {
            k,
            tau: Some(d.tau),
            speedup: Some(d.speedup),
            t_d_ms: d.costs.t_d_ms,
            t_v_ms: d.costs.t_v_ms.get(&(k + 1)).copied(),
            greedy_identical: d.greedy_identical,
            plain_batched_tokens_per_s: d.plain_batched.as_ref().map(|b| b.tokens_per_s),
        });
        if decode.as_ref().is_none_or(|(_, best, _)| d.speedup > best.speedup) {
            decode = Some((k, d, reports::parse(&out, &text)?));
        }
    }

    let report = Report {
        workdir: work,
        answers: args.answers,
        regenerate: regenerate.as_ref().map(|(_, whole)| whole.clone()),
        regenerate_brief: regenerate.map(|(brief, _)| brief),
        total_seconds: start.elapsed().as_secs_f64(),
        stages: r.stages,
        eval_k: EVAL_K,
        eval_before,
        eval_after,
        train_tokens: training.tokens,
        train_tokens_per_s: training.tokens_per_s,
        drafter,
        sglang_export: export,
        curves,
        decode_k: decode.as_ref().map(|(k, _, _)| *k),
        decode_brief: decode.as_ref().map(|(_, brief, _)| brief.clone()),
        decode: decode.map(|(_, _, whole)| whole),
        decode_by_k,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!("\naerie quickstart: {}", r.workdir.display());
    match &r.regenerate_brief {
        Some(g) => println!(
            "  trained on SmolLM2's own answers: {} conversations regenerated, {} tokens at {:.1} tokens/s (batch {})",
            g.records, g.tokens_generated, g.tokens_per_second, g.batch_size
        ),
        None => println!("  trained on the dataset's answers (ShareGPT)"),
    }
    for s in &r.stages {
        println!(
            "  {:<16} {}",
            s.stage,
            if s.skipped { "skipped (output exists)".into() } else { format!("{:.1} s", s.seconds) }
        );
    }
    println!("  {:<16} {:.1} s ({:.1} min)", "total", r.total_seconds, r.total_seconds / 60.0);
    println!("  trained on {:.0} token positions ({:.0} tokens/s)", r.train_tokens, r.train_tokens_per_s);
    let tau = |v: &EvalLossReport| v.metrics.simulated_accept_length;
    let acc = |v: &EvalLossReport| {
        let a: Vec<String> = v.metrics.acc_per_step.iter().map(|x| format!("{x:.3}")).collect();
        a.join(", ")
    };
    let k = r.eval_k;
    println!("  held-out simulated accept length at k = {k} (τ in [1, {}], teacher-forced):", k + 1);
    println!("    before training: {:.3}   acc per step [{}]", tau(&r.eval_before), acc(&r.eval_before));
    println!("    after training:  {:.3}   acc per step [{}]", tau(&r.eval_after), acc(&r.eval_after));
    let f = |v: Option<f64>| v.unwrap_or(f64::NAN);
    for d in &r.decode_by_k {
        println!(
            "  MT-Bench decoding at k = {}: τ {:.3}, speedup {:.2}x (T_d {:.1} ms, T_v({}) {:.1} ms)",
            d.k,
            f(d.tau),
            f(d.speedup),
            f(d.t_d_ms),
            d.k + 1,
            f(d.t_v_ms)
        );
        if let Some(rate) = d.plain_batched_tokens_per_s {
            println!("    plain decoding of the same answers all at once: {rate:.1} tokens/s end to end");
        }
    }
    if let (Some(k), Some(d)) = (r.decode_k, &r.decode_brief) {
        println!(
            "  MT-Bench, real speculative decoding at the fastest k = {k} (greedy): τ {:.3}, {:.1} vs {:.1} tokens/s plain, speedup {:.2}x, output identical to plain greedy: {}",
            d.tau,
            d.speculative.decode_tokens_per_s,
            d.plain.decode_tokens_per_s,
            d.speedup,
            d.greedy_identical.map_or("n/a".into(), |g| g.to_string())
        );
    }
    println!("  drafter: {}", r.drafter.display());
    println!("  SGLang export: {}  (--speculative-draft-model-path)", r.sglang_export.display());
    println!(
        "  training curves: {}  (or `tensorboard --logdir {}`)",
        r.curves.display(),
        r.workdir.join("run").display()
    );
}
