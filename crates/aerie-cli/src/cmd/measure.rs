//! `aerie measure`: τ, acceptance by position, tokens/s, inter-token latency and the implied
//! cycle cost of a running SGLang or vLLM server; against a plain server (any OpenAI-compatible
//! one too), T_d for a costs file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aerie_engine::meta::Endpoint;
use aerie_eval::cost::{Costs, Provenance};
use aerie_eval::measure::{MeasureOptions, MeasureReport, costs_from_report, measure};
use aerie_eval::prompts::{read_prompts, select};
use anyhow::{Context, Result, bail};
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
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
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
    /// Costs file to write (plain server: T_d) or extend (speculative server: cycle_ms.k).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the run's acceptance profile (`speculation_profile.json`: per-position rates, τ by
    /// output position) here, atomically. A speculative server only.
    #[arg(long)]
    pub profile_out: Option<PathBuf>,
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

/// Run `aerie measure`.
pub fn run(args: MeasureArgs) -> Result<()> {
    let prompts: Vec<_> =
        select(read_prompts(&args.prompts)?, args.max_prompts)?.iter().map(|p| p.first_request()).collect();
    let api = aerie_engine::parse_api(&args.api).map_err(|e| anyhow::anyhow!("--api: {e}"))?;
    let opts = MeasureOptions {
        server: args.server.clone(),
        endpoint: args.endpoint,
        concurrency: args.concurrency,
        max_new_tokens: args.max_new_tokens,
        stream: !args.no_stream,
        expect_speculation: args.expect_spec,
        timeout: Duration::from_secs(args.timeout_s.max(1)),
        retries: args.retries,
        backoff: Duration::from_millis(500),
        label: args.label.clone(),
        model: args.model.clone(),
        api,
    };
    let pb = progress::bar(prompts.len() as u64, "measure", "requests");
    let result = measure(&prompts, &opts, &|done, _| pb.set_position(done as u64));
    pb.finish_and_clear();
    let report = result.with_context(|| format!("measuring {}", args.server))?;
    if let Some(out) = &args.out {
        write_costs(&args, &report, out)?;
    }
    if let Some(path) = &args.profile_out {
        let Some(profile) = &report.profile else {
            anyhow::bail!(
                "--profile-out {}: {} did not speculate (or sent no per-position counts), so there is no acceptance profile",
                path.display(),
                args.server
            );
        };
        profile.write(path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
        if let Some(out) = &args.out {
            println!("costs      written to {}", out.display());
        }
    }
    Ok(())
}

fn write_costs(args: &MeasureArgs, report: &MeasureReport, out: &Path) -> Result<()> {
    let existing =
        if out.exists() { Some(Costs::load(out).context("reading the costs file to extend")?) } else { None };
    if existing.is_some() && !report.speculative {
        bail!(
            "{}: already exists; a plain-server run starts a new costs file (remove it or pick another path)",
            out.display()
        );
    }
    let measured_where = if args.measured_where.is_empty() {
        format!(
            "{} ({} endpoint, concurrency {}, {} new tokens)",
            args.server,
            args.endpoint.path(),
            args.concurrency,
            args.max_new_tokens
        )
    } else {
        args.measured_where.clone()
    };
    let provenance =
        Provenance { measured_where, when: aerie_eval::cost::today(), by: args.by.clone(), ..Default::default() };
    let costs = costs_from_report(report, existing, provenance)?;
    aerie_data::atomic::write_bytes(out, costs.to_toml()?.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

fn print_report(r: &MeasureReport) {
    let opt = |v: Option<f64>, d: usize| v.map_or("–".to_string(), |x| format!("{x:.d$}"));
    println!(
        "server     {} ({}, {}), {} requests, concurrency {}",
        r.server,
        r.api,
        r.endpoint.path(),
        r.requests,
        r.concurrency
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
