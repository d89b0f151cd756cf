//! `aerie project`: an acceptance curve (from `eval accept` or `measure`) through a costs file
//! (eagle3.md §7): S(k), projected tokens/s, break-even τ, best k, and the verify cost at which
//! the drafter stops paying. Without a curve, the break-even τ at each k: what a drafter must
//! reach to pay in the engine whose costs these are (`eval serve --costs-out` measures them).

use std::path::PathBuf;

use aerie_eval::cost::{Costs, CycleSource, Projection, break_even, load_curve, project};
use aerie_eval::surface::Context;
use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

/// Arguments of `aerie project`.
#[derive(Debug, Args)]
pub struct ProjectArgs {
    /// The --json output of `aerie eval accept` or `aerie measure` (its `curve`); without it,
    /// only the break-even τ of each k is shown.
    #[arg(long)]
    pub accept: Option<PathBuf>,
    /// Costs file (configs/costs/*.toml, or one written by `eval serve --costs-out` or
    /// `measure --out`).
    #[arg(long)]
    pub costs: PathBuf,
    /// The place of the cost surface to read (with --context): the costs measured at this
    /// concurrency. Without either, the file's top level: concurrency 1, short prompts where
    /// the surface has them (what `project` read before surfaces).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// The prompt length of the surface's place to read: short or long (with --concurrency;
    /// default short).
    #[arg(long)]
    pub context: Option<Context>,
    /// Without --accept: show k = 1..=N (and every measured k).
    #[arg(long, default_value_t = 4)]
    pub max_k: usize,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie project`.
pub fn run(args: ProjectArgs) -> Result<()> {
    if args.max_k == 0 {
        bail!("--max-k 0 asks for no chain length: give 1 or more (the break-even τ of k = 1..=N drafts)");
    }
    let costs = Costs::load(&args.costs).context("reading the costs file")?;
    let costs = if args.concurrency.is_some() || args.context.is_some() {
        costs
            .at(args.concurrency.unwrap_or(1), args.context.unwrap_or(Context::Short))
            .map_err(|e| anyhow!("{}: {e}", args.costs.display()))?
    } else {
        costs
    };
    let Some(accept) = &args.accept else {
        let rows = break_even(&costs, args.max_k)?;
        if args.json {
            let v = serde_json::json!({"costs": costs.name, "t_d_ms": costs.t_d_ms, "break_even": rows});
            println!("{}", serde_json::to_string(&v)?);
        } else {
            println!(
                "costs      {} (T_d {} ms: {:.1} tok/s without speculation)",
                costs.name,
                costs.t_d_ms,
                1000.0 / costs.t_d_ms
            );
            println!("k  cycle ms  (source)  break-even τ");
            for r in &rows {
                let src = match r.cycle_source {
                    CycleSource::Measured => "measured",
                    CycleSource::Model => "model",
                };
                println!("{:<2} {:<9.2} {:<9} {:.3}", r.k, r.cycle_ms, src, r.break_even_tau);
            }
            if rows.is_empty() {
                println!("no k has a measured cycle or a cost model (T_s and T_v) in this costs file");
            }
        }
        return Ok(());
    };
    let curve = load_curve(accept).context("reading the acceptance curve")?;
    let p = project(&curve, &costs);
    if args.json {
        println!("{}", serde_json::to_string(&p)?);
    } else {
        print_projection(&p);
    }
    Ok(())
}

/// The human rendering of a projection.
pub fn print_projection(p: &Projection) {
    println!("costs      {} (T_d {} ms: {:.1} tok/s without speculation)", p.costs, p.t_d_ms, p.baseline_tokens_per_s);
    println!("k  tokens  τ(k)    cycle   (ms)     S       tok/s   break-even τ  margin   max cycle  max verify");
    for r in &p.rows {
        let src = match r.cycle_source {
            CycleSource::Measured => "measured",
            CycleSource::Model => "model",
        };
        println!(
            "{:<2} {:<7} {:<7.3} {:<7.2} {:<8} {:<7.3} {:<7.1} {:<13.3} {:<+8.3} {:<10.2} {}",
            r.k,
            r.verify_tokens,
            r.tau,
            r.cycle_ms,
            src,
            r.speedup,
            r.tokens_per_s,
            r.break_even_tau,
            r.margin_tau,
            r.max_cycle_ms,
            r.max_verify_ms.map_or("–".into(), |v| format!("{v:.2}"))
        );
    }
    for s in &p.skipped {
        println!("skipped    {s}");
    }
    match p.rows.iter().find(|r| Some(r.k) == p.best_k) {
        Some(b) if p.pays => println!(
            "best k     {} : {:.1}% faster than plain decoding (τ {:.3} vs break-even {:.3})",
            b.k,
            100.0 * (b.speedup - 1.0),
            b.tau,
            b.break_even_tau
        ),
        Some(b) => println!(
            "best k     {} : still {:.1}% SLOWER than plain decoding; needs τ {:.3} (has {:.3}) or a cycle under {:.2} ms",
            b.k,
            100.0 * (1.0 - b.speedup),
            b.break_even_tau,
            b.tau,
            b.max_cycle_ms
        ),
        None => println!("no k of the curve has a cycle cost in this costs file"),
    }
}
