//! `aerie measure`: τ, acceptance by position, tokens/s, inter-token latency and the implied
//! cycle cost of a running SGLang or vLLM server; against a plain server (any OpenAI-compatible
//! one too), T_d for a costs file. Lists of `--concurrency` and `--context` sweep the cost
//! surface against the one server; its k is the server's own (a server started at another k
//! extends the same file).

use std::path::{Path, PathBuf};
use std::time::Duration;

use aerie_engine::meta::Endpoint;
use aerie_eval::cost::{Costs, Provenance};
use aerie_eval::measure::{MeasureOptions, MeasureReport, costs_from_sweep, measure};
use aerie_eval::prompts::{long_context, read_prompts, select};
use aerie_eval::surface::Context;
use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::progress;

/// Arguments of `aerie measure`.
#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// Server base URL, e.g. http://127.0.0.1:30000.
    #[arg(long)]
    pub server: String,
    /// The server's engine: auto (asked: SGLang when /get_model_info answers, vLLM when
    /// /v1/models says `owned_by: vllm`, else OpenAI-compatible), sglang, vllm or openai.
    #[arg(long, default_value = "auto")]
    pub api: String,
    /// JSONL prompts: MT-Bench (`turns`: each conversation's first turn is sent), `{"prompt": ...}`
    /// or `{"messages": [...]}`; or a named set (`mtbench`), fetched into `$AERIE_HOME` when
    /// missing.
    #[arg(long, value_parser = crate::cmd::assets::parse_prompts)]
    pub prompts: PathBuf,
    /// Use only the first N prompts.
    #[arg(long)]
    pub max_prompts: Option<usize>,
    /// Requests in flight at once; a list (`1,4,16,64`) measures each in turn against the same
    /// server (the cost surface; k is the server's own).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub concurrency: Vec<usize>,
    /// Prompt lengths, comma-separated: `short` (the prompts as given), `long` (each behind a
    /// passage of --long-context-words words).
    #[arg(long = "context", value_delimiter = ',', default_value = "short")]
    pub contexts: Vec<Context>,
    /// Words of the passage before each `long` prompt.
    #[arg(long, default_value_t = aerie_eval::prompts::LONG_CONTEXT_WORDS)]
    pub long_context_words: usize,
    /// Tokens per request (greedy, temperature 0).
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Name of this measurement (stored in the report and the costs file).
    #[arg(long, default_value = "")]
    pub label: String,
    /// `generate` (/generate, raw text) or `chat` (/v1/chat/completions, the server's template).
    #[arg(long, default_value = "chat")]
    pub endpoint: Endpoint,
    /// `model` field of chat requests.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Do not stream: no per-token timing (ITL, T_d and the cycle then include prefill).
    #[arg(long)]
    pub no_stream: bool,
    /// Fail unless the server speculates (SGLang's meta_info or vLLM's counters show it).
    #[arg(long)]
    pub expect_spec: bool,
    /// Whole-request timeout, seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    /// Retries per request on connection errors, timeouts, 429 and 5xx (with backoff).
    #[arg(long, default_value_t = 2)]
    pub retries: usize,
    /// Costs file to write (plain server: T_d at each concurrency and context) or extend
    /// (speculative server: its k's cycle, τ and speedup at the same places).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the run's acceptance profile (`speculation_profile.json`: per-position rates, τ by
    /// output position) here, atomically. A speculative server only.
    #[arg(long)]
    pub profile_out: Option<PathBuf>,
    /// Draw the surface of `--out` (break-even τ, and the speedup where measured, over k ×
    /// concurrency) as a `.png` or `.svg`; needs a speculative run.
    #[arg(long, requires = "out")]
    pub heatmap: Option<PathBuf>,
    /// Provenance: where this was measured (machine, engine, flags).
    #[arg(long, default_value = "")]
    pub measured_where: String,
    /// Provenance: who measured.
    #[arg(long, default_value = "aerie measure")]
    pub by: String,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie measure`: one run per place (concurrency × context), each scoped to itself (SGLang's
/// per-response counts; vLLM's counters read before and after it).
pub fn run(args: MeasureArgs) -> Result<()> {
    let short = select(read_prompts(&args.prompts)?, args.max_prompts)?;
    crate::cmd::common::sweep_list("--concurrency", &args.concurrency)?;
    crate::cmd::common::sweep_list("--context", &args.contexts)?;
    if args.concurrency.contains(&0) {
        bail!("--concurrency must be at least 1");
    }
    if args.profile_out.is_some() && args.concurrency.len() * args.contexts.len() > 1 {
        bail!("--profile-out writes one run's profile: give one --concurrency and one --context with it");
    }
    // Everything written after the sweep is checked before it: a sweep at concurrency 64 on a
    // node takes many minutes, and a costs file that cannot be written or extended would lose it.
    for (flag, path) in [("--out", &args.out), ("--heatmap", &args.heatmap), ("--profile-out", &args.profile_out)] {
        if let Some(path) = path {
            crate::cmd::common::writable(path).with_context(|| flag.to_string())?;
        }
    }
    if let Some(out) = args.out.as_deref().filter(|p| p.exists()) {
        Costs::load(out).context("--out: reading the costs file to extend")?;
    }
    let long = long_context(&short, args.long_context_words);
    let api = aerie_engine::parse_api(&args.api).map_err(|e| anyhow::anyhow!("--api: {e}"))?;
    let mut reports = Vec::new();
    for &context in &args.contexts {
        let prompts: Vec<_> = match context {
            Context::Short => &short,
            Context::Long => &long,
        }
        .iter()
        .map(|p| p.first_request())
        .collect();
        for &concurrency in &args.concurrency {
            let opts = MeasureOptions {
                server: args.server.clone(),
                endpoint: args.endpoint,
                concurrency,
                max_new_tokens: args.max_new_tokens,
                stream: !args.no_stream,
                expect_speculation: args.expect_spec,
                timeout: Duration::from_secs(args.timeout_s.max(1)),
                retries: args.retries,
                backoff: Duration::from_millis(500),
                label: args.label.clone(),
                model: args.model.clone(),
                // Asked once: every later place talks to the same server.
                api: reports.first().map(|r: &MeasureReport| r.api).or(api),
            };
            let pb = progress::bar(prompts.len() as u64, "measure", "requests");
            let result = measure(&prompts, &opts, &|done, _| pb.set_position(done as u64));
            pb.finish_and_clear();
            let mut report = result.with_context(|| {
                format!("measuring {} at concurrency {concurrency}, context {context}", args.server)
            })?;
            report.context = context;
            reports.push(report);
        }
    }
    let costs = match &args.out {
        Some(out) => Some(write_costs(&args, &reports, out)?),
        None => None,
    };
    if let (Some(costs), Some(path)) = (&costs, &args.heatmap) {
        aerie_eval::plot::surface_heatmap(&aerie_eval::surface::cells(&costs.surface), path)
            .with_context(|| format!("drawing {}", path.display()))?;
    }
    if let Some(path) = &args.profile_out {
        let Some(profile) = reports.first().and_then(|r| r.profile.as_ref()) else {
            anyhow::bail!(
                "--profile-out {}: {} did not speculate (or sent no per-position counts), so there is no acceptance profile",
                path.display(),
                args.server
            );
        };
        profile.write(path)?;
    }
    if args.json {
        match reports.as_slice() {
            [one] => println!("{}", serde_json::to_string(one)?),
            all => println!("{}", serde_json::to_string(&serde_json::json!({"runs": all}))?),
        }
    } else {
        for r in &reports {
            print_report(r);
        }
        if let Some(out) = &args.out {
            println!("costs      written to {}", out.display());
        }
        if let Some(path) = &args.heatmap {
            println!("heatmap    written to {}", path.display());
        }
    }
    Ok(())
}

fn write_costs(args: &MeasureArgs, reports: &[MeasureReport], out: &Path) -> Result<Costs> {
    let existing =
        if out.exists() { Some(Costs::load(out).context("reading the costs file to extend")?) } else { None };
    let speculative = reports.iter().any(|r| r.speculative);
    if existing.is_some() && !speculative {
        bail!(
            "{}: already exists; a plain-server run starts a new costs file (remove it or pick another path)",
            out.display()
        );
    }
    let concurrency: Vec<String> = args.concurrency.iter().map(usize::to_string).collect();
    let contexts: Vec<String> = args.contexts.iter().map(Context::to_string).collect();
    let measured_where = if args.measured_where.is_empty() {
        format!(
            "{} ({} endpoint, concurrency {}, context {}, {} new tokens)",
            args.server,
            args.endpoint.path(),
            concurrency.join(","),
            contexts.join(","),
            args.max_new_tokens
        )
    } else {
        args.measured_where.clone()
    };
    let provenance =
        Provenance { measured_where, when: aerie_eval::cost::today(), by: args.by.clone(), ..Default::default() };
    let costs = costs_from_sweep(reports, existing, provenance)?;
    aerie_data::atomic::write_bytes(out, costs.to_toml()?.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(costs)
}

fn print_report(r: &MeasureReport) {
    let opt = |v: Option<f64>, d: usize| v.map_or("–".to_string(), |x| format!("{x:.d$}"));
    println!(
        "server     {} ({}, {}), {} requests, concurrency {}, context {}",
        r.server,
        r.api,
        r.endpoint.path(),
        r.requests,
        r.concurrency,
        r.context
    );
    println!(
        "output     {} tokens in {:.2} s: {:.1} tok/s (server), {:.1} tok/s per request",
        r.completion_tokens, r.wall_s, r.output_tokens_per_s, r.request_tokens_per_s
    );
    println!("latency    TTFT {} ms, ITL {} ms", opt(r.ttft_ms, 1), opt(r.itl_ms, 2));
    if r.speculative {
        println!(
            "τ          {} (1 + accepted drafts per verify cycle); {} tokens per verify (completion / verify)",
            opt(r.tau, 3),
            opt(r.tokens_per_verify, 3)
        );
        if let (Some(a), Some(u)) = (&r.accept_rate_conditional, &r.accept_rate_unconditional) {
            println!("position   α_i (conditional)   r_i (unconditional)");
            for (i, (a, u)) in a.iter().zip(u).enumerate() {
                println!("{:<10} {:<19.4} {:.4}", i + 1, a, u);
            }
        }
        if let Some(p) = &r.profile {
            println!("by output  {}", p.bucket_line());
        }
        println!("cycle      {} ms per draft+verify (implied)", opt(r.implied_cycle_ms, 2));
        println!("counted    {}", r.counted);
    } else {
        println!("speculation none: T_d {} ms per decode step", opt(r.t_d_ms, 2));
    }
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn today_is_a_date() {
        let t = aerie_eval::cost::today();
        assert_eq!(t.len(), 10);
        assert!(t.starts_with("20"));
    }
}
