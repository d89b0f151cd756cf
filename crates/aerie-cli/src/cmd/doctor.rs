//! `aerie doctor`: read a running SGLang or vLLM server's own configuration and the drafter's,
//! and flag the known failures of speculative serving, each with what to change and the public
//! report it comes from; say what could not be read. Exit 2 when an error was found (warnings,
//! infos and what could not be read do not fail it), 1 when the server cannot be read at all.

use std::path::{Path, PathBuf};

use aerie_engine::doctor::{Diagnosis, Options, Severity, diagnose, read_server};
use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `aerie doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Server base URL, e.g. http://127.0.0.1:30000.
    #[arg(long)]
    pub server: String,
    /// The server's engine: auto (detected as `aerie measure` does), sglang or vllm.
    #[arg(long, default_value = "auto")]
    pub api: String,
    /// The drafter to check against the server (directory or hub id `org/name[@revision]`);
    /// default: the server's own drafter, when its path is a directory on this machine.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub drafter: Option<PathBuf>,
    /// Requests the server will run at once in your measurement or deployment (default: the
    /// server's own batch limit): the CUDA-graph check compares it with the captured batch sizes.
    #[arg(long)]
    pub concurrency: Option<u64>,
    /// Print the diagnosis as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run `aerie doctor`; returns the exit code (2 when an error-severity finding is present).
pub fn run(args: DoctorArgs) -> Result<i32> {
    let api = aerie_engine::parse_api(&args.api).map_err(anyhow::Error::msg)?;
    let mut server =
        read_server(&args.server, api).with_context(|| format!("reading the configuration of {}", args.server))?;
    let drafter = match &args.drafter {
        Some(dir) => Some(
            aerie_hub::doctor::drafter(dir)
                .with_context(|| format!("reading the drafter's config in {}", dir.display()))?,
        ),
        None => match server.draft_model_path.clone() {
            Some(p) if Path::new(&p).join("config.json").is_file() => match aerie_hub::doctor::drafter(Path::new(&p)) {
                Ok(d) => Some(d),
                Err(e) => {
                    server.unread(format!("the server's drafter {p}"), e.to_string());
                    None
                }
            },
            Some(p) => {
                server.unread(
                    format!("the server's drafter {p}"),
                    "not a directory with a config.json on this machine: give --drafter",
                );
                None
            }
            None => None,
        },
    };
    let diagnosis = diagnose(server, drafter, Options { concurrency: args.concurrency });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&diagnosis)?);
    } else {
        print_human(&diagnosis);
    }
    Ok(diagnosis.exit_code())
}

fn print_human(d: &Diagnosis) {
    let s = &d.server;
    let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
    println!("{} {} at {}  (model {})", s.engine, or(&s.version), s.url, or(&s.model));
    if !s.read.is_empty() {
        println!("read       {}", s.read.join("; "));
    }
    match (s.speculating, &s.algorithm) {
        (Some(false), _) => println!("spec       off"),
        (_, Some(a)) => {
            let n = |v: Option<u64>| v.map_or("?".into(), |n| n.to_string());
            println!(
                "spec       {a}: {} steps, topk {}, {} draft tokens; drafter {}",
                n(s.num_steps),
                n(s.eagle_topk),
                n(s.num_draft_tokens),
                or(&s.draft_model_path)
            );
        }
        (_, None) => println!("spec       unknown"),
    }
    if let Some(dr) = &d.drafter {
        println!(
            "drafter    {}  ({} layout, {} attention, {}, aux ids {:?} {}, model_type {})",
            dr.path,
            dr.layout,
            if dr.mla { "MLA" } else { "Llama" },
            dr.quantization.as_deref().map_or("unquantized".into(), |q| format!("quantized {q}")),
            dr.aux_ids,
            dr.aux_convention.as_str(),
            dr.model_type.as_deref().unwrap_or("-")
        );
    } else {
        println!("drafter    not read (give --drafter DIR)");
    }
    for u in &s.unread {
        println!("unread     {}: {}", u.what, u.why);
    }
    for f in &d.findings {
        let tag = match f.severity {
            Severity::Error => "ERROR",
            Severity::Warning => "WARNING",
            Severity::Info => "INFO",
        };
        println!("\n{tag} [{}] {}", f.rule, f.what);
        println!("  fix:    {}", f.fix);
        println!("  source: {}", f.source);
    }
    for n in &d.not_checked {
        println!("not checked [{}]: {}", n.rule, n.why);
    }
    let count = |sev| d.findings.iter().filter(|f| f.severity == sev).count();
    println!(
        "\n{} error(s), {} warning(s), {} info; {} rule(s) not checked; exit {}",
        count(Severity::Error),
        count(Severity::Warning),
        count(Severity::Info),
        d.not_checked.len(),
        d.exit_code()
    );
}
