//! `aerie inspect`: what a drafter directory holds and the lint of the failures serving engines
//! do not report (exit 2 on errors; warnings fail only with `--strict`).

use std::path::PathBuf;

use aerie_hub::inspect::{InspectReport, inspect};
use anyhow::Result;
use clap::Args;

/// Arguments of `aerie inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Drafter directory or hub id `org/name[@revision]`.
    #[arg(value_parser = crate::model_ref::parse)]
    pub dir: PathBuf,
    /// Target model directory or hub id (enables the checks against the target: layer count,
    /// context).
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Warnings fail too.
    #[arg(long)]
    pub strict: bool,
    /// The engine that will serve it (`vllm`, `sglang`): warn when it reads this layout's aux
    /// ids in the other convention.
    #[arg(long, value_parser = aerie_engine::parse_startable)]
    pub engine: Option<aerie_engine::Engine>,
}

/// Run `aerie inspect`; returns the exit code.
pub fn run(args: InspectArgs) -> Result<i32> {
    let mut report = inspect(&args.dir, args.target.as_deref())?;
    if let Some(engine) = args.engine {
        report.served_by(engine);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report);
    }
    Ok(report.exit_code(args.strict))
}

fn print_human(r: &InspectReport) {
    let c = &r.config;
    println!("{}  ({}, {})", r.dir.display(), r.dialect, r.architectures.join(","));
    println!("layout     for {} (its aux ids are read in {}'s convention)", r.engine, r.engine);
    if let Some(p) = &r.published_layout {
        println!("written as {p}");
    }
    println!(
        "shape      H {} (target {}), {} heads / {} KV of {}, I {}, eps {}",
        c.hidden_size,
        c.target_hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.intermediate_size,
        c.rms_norm_eps
    );
    println!(
        "dtype      {}  params: {} trainable, {} frozen (embedding: {:?}, counted from {:?})",
        r.weight_dtype.map_or("-".into(), |d| d.to_string()),
        r.trainable_params,
        r.frozen_params,
        r.embedding,
        r.params_from
    );
    let v = &r.vocab;
    println!(
        "vocab      V {}  Vd {}  d2t {}  t2d {}",
        v.vocab_size,
        v.draft_vocab_size,
        if v.has_d2t { "yes" } else { "no" },
        if v.has_t2d { "yes" } else { "no" }
    );
    if let Some(d) = &v.d2t {
        println!("d2t        {}", serde_json::to_string(d).unwrap_or_default());
    }
    println!(
        "aux        output-of-layer {:?}  input-of-layer {:?}  (config: {:?}{})",
        r.aux.output_of_layer,
        r.aux.input_of_layer,
        r.aux.convention_in_config,
        r.aux.target_num_layers.map_or(String::new(), |n| format!(", target has {n} layers"))
    );
    println!(
        "rope       theta {} {:?}  max_position_embeddings {}",
        r.rope.theta, r.rope.scaling, c.max_position_embeddings
    );
    for t in &r.tensors {
        println!("  {:<44} {:<5} {:?}", t.file_key, t.dtype.to_string(), t.shape);
    }
    for n in &r.notes {
        println!("note: {n}");
    }
    for f in &r.findings {
        println!("{:?}[{}]: {}", f.severity, f.code, f.message);
    }
    println!("{} error(s), {} warning(s)", r.errors(), r.warnings());
}
