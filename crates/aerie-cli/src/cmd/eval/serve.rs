//! `aerie eval serve`: drafters evaluated inside the serving engine that will run them (vLLM
//! here; SGLang on a GPU host), against the same engine without speculation, with aerie's own
//! prediction beside it on request. The evaluation is `aerie_eval::serve`; this module parses,
//! puts each drafter in the engine's layout (`aerie_hub::export`), shows progress and prints.

use std::path::PathBuf;

use aerie_eval::cost::today;
use aerie_eval::decode::DecodeSession;
use aerie_eval::serve::{ServeReport, ServedDrafter, evaluate};
use aerie_model::native::TargetSpec;
use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;

use crate::cmd::common::engine::{Bars, EngineArgs, resolve_engine_dtype, serve_options, served_drafters, workdir};
use crate::cmd::common::writable;
use crate::device::{DeviceArg, with_backend};

/// Arguments of `aerie eval serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Target model directory (HF layout with safetensors, tokenizer and chat template; e.g. the
    /// quickstart's `target/`) or hub id `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: PathBuf,
    /// Drafter directories (an aerie checkpoint, an SGLang or a speculators export) or hub ids;
    /// repeat it.
    #[arg(long = "drafter", required = true, value_parser = crate::model_ref::parse)]
    pub drafters: Vec<PathBuf>,
    /// Names for the drafters, comma-separated, in order (default: directory names).
    #[arg(long, value_delimiter = ',')]
    pub names: Vec<String>,
    /// Prompt file, JSONL: MT-Bench (`turns`), `{"prompt": ...}` or `{"messages": [...]}`; or a
    /// named set (`mtbench`), fetched into `$AERIE_HOME` when missing.
    #[arg(long, value_parser = crate::cmd::assets::parse_prompts)]
    pub prompts: PathBuf,
    /// Draft steps k, comma-separated: each drafter is served once per k.
    #[arg(long = "k", value_delimiter = ',', default_value = "3")]
    pub ks: Vec<usize>,
    /// New tokens per answer at most (greedy).
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Use only the first N prompts.
    #[arg(long)]
    pub max_prompts: Option<usize>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Also decode the same prompts with aerie's own decoder on the native target and put its τ
    /// and the speedup it projects through the engine's measured costs beside the engine's.
    #[arg(long)]
    pub predict: bool,
    /// `--predict` for targets aerie's native engine cannot run (DeepSeek-V3, Kimi): instead of
    /// decoding, walk the verify cycles over these shards, captured from the engine's own greedy
    /// answers to the same prompts (`regenerate` through the engine with the same template and
    /// `--max-new-tokens`, `data prepare`, `capture`). Implies `--predict`.
    #[arg(long, value_name = "SHARDS")]
    pub predict_from: Option<PathBuf>,
    /// `--predict`: chat template (`auto`: the target's own, as the engine applies it).
    #[arg(long, default_value = "auto")]
    pub template: String,
    /// `--predict`: `cpu`, `cuda:N` or `wgpu:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Write the engine's measured T_d and cycle costs as a costs TOML for `aerie project`
    /// (with the surface: every concurrency and context measured).
    #[arg(long)]
    pub costs_out: Option<PathBuf>,
    /// Prompt lengths, comma-separated: `short` (the prompts as given), `long` (each behind a
    /// passage of --long-context-words words); each engine answers the prompts once per value.
    #[arg(long = "context", value_delimiter = ',', default_value = "short")]
    pub contexts: Vec<aerie_eval::surface::Context>,
    /// Words of the passage before each `long` prompt.
    #[arg(long, default_value_t = aerie_eval::prompts::LONG_CONTEXT_WORDS)]
    pub long_context_words: usize,
    /// SGLang only: make every verify cycle report this accept length
    /// (`SGLANG_SIMULATE_ACC_LEN`), so the cycle is measured at a chosen τ with any drafter;
    /// 1.0 measures the tax of speculation enabled with nothing accepted.
    #[arg(long)]
    pub simulate_accept_length: Option<f64>,
    /// Draw the surface (break-even τ and measured speedup over k × concurrency, a panel per
    /// context) as a `.png` or `.svg`.
    #[arg(long)]
    pub heatmap: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie eval serve`.
///
/// On the node one engine start costs 10-20 minutes and the runs hours, so nothing that can fail
/// is left for after them: every check runs before the first engine starts ([`preflight`],
/// [`serve_options`]), and the measured report and costs are on disk ([`save`]) before the
/// prediction, which runs after the engines, can fail.
pub fn run(args: ServeArgs) -> Result<()> {
    preflight(&args)?;
    let dir = workdir(args.engine.workdir.as_deref())?;
    let mut opts = serve_options(
        &args.engine,
        &args.target,
        &args.prompts,
        args.max_prompts,
        &args.ks,
        args.max_new_tokens,
        &dir,
    )?;
    let drafters = served_drafters(&args.engine, &args.target, &args.drafters, &args.names, &dir)?;
    resolve_engine_dtype(&args.engine, &mut opts)?;
    opts.contexts = args.contexts.clone();
    opts.long_context_words = args.long_context_words;
    opts.simulate_accept_length = args.simulate_accept_length;
    let bars = Bars::new();
    let result = evaluate(&opts, &drafters, &bars);
    bars.bar.finish_and_clear();
    let mut report =
        result.with_context(|| format!("evaluating in {} (engine logs in {})", args.engine.kind(), dir.display()))?;
    let saved = save(&args, &report, &dir)?;
    let predicted = if let Some(shards) = &args.predict_from {
        with_backend!(args.device, |B, dev| {
            aerie_eval::serve::predict_from_shards::<B>(
                &mut report,
                &drafters,
                shards,
                &args.target,
                args.max_new_tokens,
                &dev,
                &|_| {},
            )
        })
        .with_context(|| format!("predicting from the cycles of {}", shards.display()))
    } else if args.predict {
        with_backend!(args.device, |B, dev| predict::<B>(&args, &drafters, &mut report, &dev))
            .context("predicting with aerie's decoder")
    } else {
        Ok(())
    };
    predicted.with_context(|| {
        format!("the prediction failed after the engines ran; their measurements are saved: {saved}")
    })?;
    if args.predict || args.predict_from.is_some() {
        save(&args, &report, &dir)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
        println!("report     written to {}", dir.join("report.json").display());
        if let Some(p) = &args.costs_out {
            println!("costs      written to {} (aerie project --costs {})", p.display(), p.display());
        }
        if let Some(p) = &args.heatmap {
            println!("heatmap    written to {}", p.display());
        }
    }
    Ok(())
}

/// What can be refused before the first engine starts, is (the engine's own flags, the prompts
/// and the target directory in [`serve_options`]): `--predict` of a target aerie's native decoder
/// cannot run (by the decoder's own test, [`TargetSpec::of_dir`]) with the `--predict-from`
/// recipe instead, its tokenizer and chat template; `--predict-from` shards that are not a whole
/// capture, hold no sample, or come from another target or tokenizer
/// ([`aerie_eval::serve::check_predict_shards`]); a `--costs-out` that cannot be
/// written (a file created and removed beside it).
fn preflight(args: &ServeArgs) -> Result<()> {
    if let Some(shards) = &args.predict_from {
        aerie_eval::serve::check_predict_shards(shards, &args.target)?;
    } else if args.predict {
        if let Err(e) = TargetSpec::of_dir(&args.target) {
            bail!(
                "--predict decodes with aerie's native decoder, which cannot run the target {} ({e}). For such a \
                 target (DeepSeek-V3, Kimi) predict from the engine's own answers instead: `aerie regenerate \
                 --server URL` through the engine with the same prompts, template and --max-new-tokens, `aerie data \
                 prepare`, `aerie capture`, then `eval serve ... --predict-from SHARDS`",
                args.target.display()
            );
        }
        let template: aerie_data::template::TemplateChoice = args.template.parse()?;
        aerie_data::generation::PromptEncoder::load(&args.target, &template).with_context(|| {
            format!("--predict: loading the tokenizer and chat template of {}", args.target.display())
        })?;
    }
    if let Some(path) = &args.costs_out {
        writable(path).context("--costs-out")?;
    }
    if let Some(path) = &args.heatmap {
        writable(path).context("--heatmap")?;
        if !path.extension().is_some_and(|e| e == "png" || e == "svg") {
            bail!("--heatmap {}: give a .png or .svg file", path.display());
        }
    }
    crate::cmd::common::sweep_list("--context", &args.contexts)?;
    if args.contexts.contains(&aerie_eval::surface::Context::Long) && args.long_context_words == 0 {
        bail!("--long-context-words 0: a long context needs a passage");
    }
    if let Some(len) = args.simulate_accept_length {
        if args.engine.kind() != aerie_eval::serve::Engine::Sglang {
            bail!("--simulate-accept-length is SGLang's (SGLANG_SIMULATE_ACC_LEN): give --engine sglang");
        }
        if !(len >= 1.0 && len.is_finite()) {
            bail!("--simulate-accept-length {len}: an accept length counts the bonus token, at least 1");
        }
        if args.predict || args.predict_from.is_some() {
            bail!("--simulate-accept-length fixes the engine's τ: there is no drafter's τ to predict");
        }
    }
    Ok(())
}

/// Write the report as `WORKDIR/report.json` and, with `--costs-out`, the engine's costs; says
/// where (the error of a later step names it).
fn save(args: &ServeArgs, report: &ServeReport, dir: &std::path::Path) -> Result<String> {
    let json = dir.join("report.json");
    aerie_data::atomic::write_bytes(&json, serde_json::to_string_pretty(report)?.as_bytes())
        .with_context(|| format!("writing {}", json.display()))?;
    let mut saved = format!("the report in {}", json.display());
    // Each run's acceptance profile beside the report, named as `compare` names its own.
    for r in &report.runs {
        if let Some(p) = &r.profile {
            let path = dir.join(format!("{}@k{}.{}", r.drafter, r.k, aerie_eval::profile::PROFILE_FILE));
            p.write(&path).with_context(|| format!("{saved} (the acceptance profiles were not all written)"))?;
        }
    }
    if let Some(path) = &args.costs_out {
        // The report is on disk already: a failure here says so.
        let on_disk = || format!("{saved} (the costs were not written)");
        let costs = report.costs(&today()).with_context(on_disk)?;
        let toml = costs.to_toml().with_context(on_disk)?;
        aerie_data::atomic::write_bytes(path, toml.as_bytes())
            .with_context(|| format!("writing {}", path.display()))
            .with_context(on_disk)?;
        saved.push_str(&format!(", the costs in {}", path.display()));
    }
    if let Some(path) = &args.heatmap {
        let cells = aerie_eval::surface::cells(&report.costs(&today())?.surface);
        aerie_eval::plot::surface_heatmap(&cells, path).with_context(|| format!("drawing {}", path.display()))?;
        saved.push_str(&format!(", the heatmap in {}", path.display()));
    }
    Ok(saved)
}

/// aerie's own decoder on the same prompts, k and answers length, for each run
/// (`aerie_eval::serve::predict`), with a progress bar.
fn predict<B: Backend>(
    args: &ServeArgs,
    drafters: &[ServedDrafter],
    report: &mut ServeReport,
    device: &B::Device,
) -> Result<()> {
    let session = DecodeSession::<B>::load(&args.target, &args.prompts, args.max_prompts, &args.template, device)?;
    let pb = crate::progress::bar(
        (report.runs.len() * 2 * session.answers() * args.max_new_tokens) as u64,
        "predict",
        "tok",
    );
    let result =
        aerie_eval::serve::predict(report, drafters, &session, &args.target, args.max_new_tokens, device, &mut |n| {
            pb.inc(n as u64)
        });
    pb.finish_and_clear();
    Ok(result?)
}

fn print_report(r: &ServeReport) {
    println!("engine     {} {} serving {} in {}", r.engine, r.engine_version, r.target.display(), r.dtype);
    println!(
        "prompts    {} ({} answers of at most {} tokens, concurrency {})",
        r.prompts.display(),
        r.answers,
        r.max_new_tokens,
        r.concurrency
    );
    println!(
        "plain      {:.1} tokens/s: T_d {:.2} ms, TTFT {:.0} ms",
        r.plain.tokens_per_s, r.plain.t_d_ms, r.plain.ttft_ms
    );
    println!(
        "drafter              k  τ       α_i (conditional)        tok/s   speedup  cycle ms  break-even τ  identical"
    );
    for x in &r.runs {
        let alpha: Vec<String> = x.accept_rate_conditional.iter().map(|a| format!("{a:.3}")).collect();
        println!(
            "{:<20} {:<2} {:<7.4} {:<24} {:<7.1} {:<8.3} {:<9.2} {:<13.3} {}/{}",
            x.drafter,
            x.k,
            x.tau,
            alpha.join(" "),
            x.speculative_tokens_per_s,
            x.speedup,
            x.cycle_ms,
            x.break_even_tau,
            x.greedy_identical,
            x.answers
        );
        if let Some(p) = &x.profile {
            println!("  by output position: {}", p.bucket_line());
        }
        if let Some(p) = &x.prediction {
            let identical = p.greedy_identical.map_or("not compared".into(), |g| g.to_string());
            println!(
                "  aerie's prediction: τ {:.4} ({:+.4} in the engine), projected speedup {:.3} ({:+.3} measured), \
                 its greedy answers identical: {identical}",
                p.tau, p.tau_difference, p.projected_speedup, p.speedup_difference
            );
            if let (Some(c), Some(a), Some(shards)) = (p.cycles, p.accepted_drafts, &p.shards) {
                let engine: u64 = x.accepted_per_pos.iter().sum();
                println!(
                    "  cycles walked over {}: {c} cycles, {a} drafts accepted (the engine: {}, {engine})",
                    shards.display(),
                    x.drafts
                );
            }
        }
        if let Some(d) = &x.first_difference {
            println!(
                "  first difference: prompt {} turn {} at char {}: plain {:?} / speculative {:?}",
                d.prompt,
                d.turn + 1,
                d.at_char,
                d.plain,
                d.speculative
            );
        }
    }
    for x in &r.runs {
        let verdict = if x.speedup > 1.0 { "pays" } else { "does not pay" };
        println!(
            "verdict    {}@k{}: {verdict} in {} ({:+.1}%): τ {:.3} against break-even {:.3}",
            x.drafter,
            x.k,
            r.engine,
            100.0 * (x.speedup - 1.0),
            x.tau,
            x.break_even_tau
        );
    }
    if r.surface.len() > 1 {
        print_surface(r);
    }
    for h in &r.how {
        println!("how        {h}");
    }
    println!("logs       {}", r.workdir.display());
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
}

/// The surface, a line per cell: where the sweep says speculation pays and where it does not.
fn print_surface(r: &ServeReport) {
    println!("surface    drafter @k  concurrency  context  T_d ms  cycle ms  break-even τ  τ       speedup");
    for x in &r.runs {
        for c in &x.cells {
            println!(
                "           {:<10} {:<2} {:<12} {:<8} {:<7.2} {:<9.2} {:<13.3} {:<7} {}",
                x.drafter,
                c.k,
                c.concurrency,
                c.context,
                c.t_d_ms,
                c.cycle_ms,
                c.break_even_tau,
                c.tau.map_or("–".into(), |t| format!("{t:.3}")),
                c.speedup.map_or("–".into(), |s| format!("{s:.3}"))
            );
        }
    }
}
