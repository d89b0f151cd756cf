//! `aerie data prepare`: chat data (ShareGPT JSON, JSONL, parquet) → tokenised samples with
//! loss masks (`train.parquet`, `eval.parquet`, `report.json`), via `aerie_data::prepare`.

use std::path::PathBuf;

use aerie_data::prepare::{PrepareOptions, PrepareProgress, PrepareReport, prepare};
use aerie_data::readers::ProgressUnit;
use aerie_data::template::{EncodeOptions, TemplateChoice};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cmd::common::ChatInputArgs;

/// `aerie data ...`
#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Tokenise chat data with the model's chat template and loss masks over assistant turns.
    Prepare(PrepareArgs),
    /// Print prepared samples with the trained (loss-masked) tokens marked: colour on a
    /// terminal, `[[...]]` otherwise.
    Show(ShowArgs),
}

/// Arguments of `aerie data show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A prepared dataset directory (`aerie data prepare --out`).
    pub prepared: PathBuf,
    /// Only the sample with this `sample_id` (turn-chain samples: record index × 65,536 + chain).
    #[arg(long)]
    pub sample: Option<i64>,
    /// At most this many samples.
    #[arg(long, default_value_t = 3)]
    pub limit: usize,
    /// Split to read (`train` or `eval`).
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Tokenizer to decode with (default: the one recorded in the report).
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub tokenizer: Option<PathBuf>,
    /// Mark with brackets even on a terminal.
    #[arg(long)]
    pub no_colour: bool,
}

/// Arguments of `aerie data prepare`.
#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// Chat data: ShareGPT JSON array, JSONL, or parquet (file or HF dataset directory).
    #[arg(long)]
    pub data: PathBuf,
    /// Tokenizer directory (tokenizer.json, or tiktoken.model of the Kimi family; tokenizer_config.json,
    /// optionally config.json) or hub
    /// id `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub tokenizer: PathBuf,
    /// Output directory for the prepared dataset.
    #[arg(long)]
    pub out: PathBuf,
    /// `auto` (the tokenizer's own template), a built-in (`chatml`, `llama3`, `kimi-k2`), a named
    /// template of the tokenizer, or a .jinja file.
    #[arg(long, default_value = "auto")]
    pub template: String,
    /// Keep at most this many tokens per sample (the head); 0 for no limit.
    #[arg(long, default_value_t = 2048)]
    pub max_length: usize,
    /// Stop after this many kept samples.
    #[arg(long)]
    pub max_samples: Option<u64>,
    /// Held-out split by source-id hash, e.g. `eval=0.02`.
    #[arg(long)]
    pub split: Option<String>,
    /// How chat records are read.
    #[command(flatten)]
    pub input: ChatInputArgs,
    /// System prompt to add to conversations that have none.
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// With --system-prompt: replace existing system prompts too.
    #[arg(long, requires = "system_prompt")]
    pub replace_system_prompt: bool,
    /// A template variable, `NAME=VALUE` (repeatable): VALUE is read as JSON when it parses
    /// (`thinking=false`, `n=3`, `x={"a":1}`), else as a string. K2.5's thinking switch is
    /// `thinking`, Qwen3's `enable_thinking`.
    #[arg(long = "template-kwarg", value_name = "NAME=VALUE")]
    pub template_kwargs: Vec<String>,
    /// Target vocabulary size to record (default: config.json's vocab_size, else the tokenizer's).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Replace a prepared dataset already in --out.
    #[arg(long)]
    pub overwrite: bool,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Parse `eval=0.02` (or a bare `0.02`) into the eval fraction.
fn parse_split(s: &str) -> Result<f64> {
    let value = match s.split_once('=') {
        Some(("eval", v)) => v,
        Some((name, _)) => bail!("--split {s}: only an `eval=FRACTION` split is supported, not `{name}`"),
        None => s,
    };
    let f: f64 = value
        .parse()
        .with_context(|| format!("--split {s}: `{value}` is not a number; write `eval=FRACTION`, e.g. `eval=0.02`"))?;
    if !(0.0..1.0).contains(&f) {
        bail!("--split {s}: the fraction must be in [0, 1)");
    }
    Ok(f)
}

impl PrepareArgs {
    /// Validate and convert into library options.
    fn to_options(&self) -> Result<PrepareOptions> {
        let mut opts = PrepareOptions::new(&self.data, &self.tokenizer, &self.out);
        opts.template = self.template.parse::<TemplateChoice>()?;
        opts.read = self.input.read_options()?;
        opts.normalize = self.input.normalize_options();
        opts.encode = EncodeOptions {
            max_length: (self.max_length > 0).then_some(self.max_length),
            system_prompt: self.system_prompt.clone(),
            replace_system_prompt: self.replace_system_prompt,
            template_kwargs: crate::cmd::common::parse_template_kwargs(&self.template_kwargs)?,
        };
        opts.max_samples = self.max_samples;
        opts.eval_fraction = self.split.as_deref().map(parse_split).transpose()?.unwrap_or(0.0);
        opts.overwrite = self.overwrite;
        opts.vocab_size = self.vocab_size;
        Ok(opts)
    }
}

/// Run `aerie data`.
pub fn run(cmd: DataCommand) -> Result<()> {
    match cmd {
        DataCommand::Prepare(args) => run_prepare(&args),
        DataCommand::Show(args) => run_show(&args),
    }
}

fn run_show(args: &ShowArgs) -> Result<()> {
    use std::io::IsTerminal;

    use aerie_data::prepare::PreparedDataset;
    use aerie_data::prepare::show::{Marking, marked_text};
    use aerie_data::tokenizer::TokenizerFiles;

    let ds = PreparedDataset::open(&args.prepared)?;
    let tok_dir = args.tokenizer.clone().unwrap_or_else(|| ds.report().tokenizer.clone());
    let tok = TokenizerFiles::load(&tok_dir)
        .with_context(|| format!("the tokenizer of {} (give another with --tokenizer)", args.prepared.display()))?;
    if tok.digest != ds.report().tokenizer_digest {
        bail!(
            "{}: tokenizer digest {} is not the prepared dataset's {}: the ids would decode wrongly",
            tok.file().display(),
            tok.digest,
            ds.report().tokenizer_digest
        );
    }
    let marking = if !args.no_colour && std::io::stdout().is_terminal() { Marking::Colour } else { Marking::Brackets };
    let mut shown = 0;
    for sample in ds.samples(&args.split)? {
        let s = sample?;
        if args.sample.is_some_and(|id| id != s.sample_id) {
            continue;
        }
        let trained = s.loss_mask.iter().filter(|&&m| m != 0).count();
        println!(
            "== sample {} (source {}): {} tokens, {} trained",
            s.sample_id,
            s.source_id,
            s.input_ids.len(),
            trained
        );
        println!("{}", marked_text(&tok.tokenizer, &s.input_ids, &s.loss_mask, marking));
        shown += 1;
        if shown >= args.limit {
            break;
        }
    }
    if shown == 0 {
        bail!(
            "{}: no sample{} in split `{}`",
            args.prepared.display(),
            args.sample.map(|i| format!(" {i}")).unwrap_or_default(),
            args.split
        );
    }
    Ok(())
}

fn run_prepare(args: &PrepareArgs) -> Result<()> {
    let opts = args.to_options()?;
    let pb = ProgressBar::new(0);
    let mut styled = None;
    let start = std::time::Instant::now();
    let report = prepare(&opts, &mut |p: &PrepareProgress| {
        if styled != Some(p.unit) {
            let tmpl = match p.unit {
                ProgressUnit::Bytes => {
                    "prepare [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta}) {msg}"
                }
                ProgressUnit::Rows => {
                    "prepare [{elapsed_precise}] {wide_bar} {pos}/{len} rows ({per_sec}, ETA {eta}) {msg}"
                }
            };
            pb.set_style(ProgressStyle::with_template(tmpl).expect("valid template"));
            pb.set_length(p.total);
            styled = Some(p.unit);
        }
        pb.set_position(p.done);
        pb.set_message(format!("{} samples", p.samples));
    })
    .with_context(|| format!("preparing {}", args.data.display()))?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    for w in &report.read.warnings {
        eprintln!("warning: {w}");
    }
    if report.read.warnings_omitted > 0 {
        eprintln!("warning: ... and {} more", report.read.warnings_omitted);
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, secs);
    }
    Ok(())
}

fn print_report(r: &PrepareReport, secs: f64) {
    let c = &r.conversations;
    println!("data        {} ({} records read)", r.data.display(), r.read.records);
    println!("template    {}", r.template);
    println!("kept        {} of {} conversations", c.kept, c.conversations);
    for (mode, n) in &r.samples_per_mode {
        println!("  samples   {n:>8}  {mode}");
    }
    for (how, n) in &r.samples_with_tools {
        println!("  tools     {n:>8}  declared as {how}");
    }
    for (reason, n) in &c.dropped {
        println!("  dropped   {n:>8}  {}", reason.as_str());
    }
    for (reason, n) in &c.trimmed {
        println!("  trimmed   {n:>8}  {}", reason.as_str());
    }
    for (name, s) in &r.splits {
        println!(
            "split       {name}: {} samples, {} tokens, {} masked ({})",
            s.samples, s.tokens, s.masked_tokens, s.file
        );
    }
    println!(
        "tokens      {} ({} masked, {:.1}%), {:.0} tokens/s over {:.1}s",
        r.tokens,
        r.masked_tokens,
        100.0 * r.masked_tokens as f64 / r.tokens.max(1) as f64,
        r.tokens as f64 / secs.max(1e-9),
        secs
    );
    for e in r.rejection_examples.iter().take(3) {
        println!("  e.g.      {e}");
    }
}
