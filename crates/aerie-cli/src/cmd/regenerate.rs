//! `aerie regenerate`: replace every assistant turn of a chat dataset by the target's own answer
//! (self-distillation data), via `aerie_capture::regenerate` (the native target) or
//! `aerie_capture::regenerate_server` (`--server URL`: SGLang or any OpenAI-compatible server).
//! Resumable after `kill -9`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use aerie_capture::regenerate::{Sampling, ServerOptions, report_path};
use aerie_capture::{RegenerateOptions, RegenerateProgress, RegenerateReport, regenerate, regenerate_server};
use aerie_data::readers::ProgressUnit;
use aerie_data::template::TemplateChoice;
use aerie_model::TargetModel;
use anyhow::{Context, Result};
use burn::tensor::backend::Backend;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::cmd::common::{ChatInputArgs, parse_template_kwargs};
use crate::device::{DeviceArg, with_backend};

/// Arguments of `aerie regenerate`.
#[derive(Debug, Args)]
pub struct RegenerateArgs {
    /// Target model: HF directory or hub id `org/name[@revision]` (not with --server).
    #[arg(long, value_parser = crate::model_ref::parse, required_unless_present = "server", conflicts_with = "server")]
    pub target: Option<PathBuf>,
    /// Generate through this running serving engine (`http://host:port`) instead of the native
    /// target; needs --tokenizer (the served model's).
    #[arg(long)]
    pub server: Option<String>,
    /// The server's dialect: `sglang` (`/generate`, token ids in and out), `vllm`
    /// (`/v1/completions` with token ids in and `return_token_ids` out), `openai`
    /// (`/v1/chat/completions`, text), or `auto` (SGLang when `GET /get_model_info` answers,
    /// vLLM when `/v1/models` says `owned_by: vllm`, else OpenAI-compatible).
    #[arg(long, default_value = "auto", requires = "server")]
    pub api: String,
    /// `model` of OpenAI chat requests (default: the first id `GET /v1/models` lists).
    #[arg(long, requires = "server")]
    pub model: Option<String>,
    /// Requests in flight at once (with --server).
    #[arg(long, default_value_t = 8, requires = "server")]
    pub concurrency: usize,
    /// Seconds one request may take (with --server).
    #[arg(long, default_value_t = 600.0, requires = "server")]
    pub timeout: f64,
    /// Retries per request on connection errors, timeouts, 429 and 5xx (with --server);
    /// backoff from 1 s, doubled per retry.
    #[arg(long, default_value_t = 3, requires = "server")]
    pub retries: usize,
    /// Chat data: ShareGPT JSON array, JSONL, or parquet (file or HF dataset directory).
    #[arg(long)]
    pub data: PathBuf,
    /// Output JSONL (ShareGPT records); `OUT.partial` while running, resumed by a rerun.
    #[arg(long)]
    pub out: PathBuf,
    /// Tokenizer directory or hub id (default: the target's).
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub tokenizer: Option<PathBuf>,
    /// `auto` (the tokenizer's own template), a built-in (`chatml`, `llama3`, `kimi-k2`), a named
    /// template of the tokenizer, or a .jinja file.
    #[arg(long, default_value = "auto")]
    pub template: String,
    /// A template variable, `NAME=VALUE` (repeatable; VALUE as JSON when it parses): K2.5's
    /// thinking switch is `thinking`, Qwen3's `enable_thinking`. With --api openai it is sent as
    /// `chat_template_kwargs` (vLLM and SGLang read it).
    #[arg(long = "template-kwarg", value_name = "NAME=VALUE")]
    pub template_kwargs: Vec<String>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1] (with --temperature > 0).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Sampling seed; each record and turn draws from its own stream, so resumes reproduce.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// New tokens per assistant turn at most.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    /// Prompt plus answer at most this many tokens (a longer prompt ends the conversation); 0
    /// for no limit.
    #[arg(long, default_value_t = 2048)]
    pub max_length: usize,
    /// Stop once the output holds this many records.
    #[arg(long)]
    pub max_samples: Option<u64>,
    /// Assistant turns regenerated per conversation at most (later turns are cut).
    #[arg(long)]
    pub max_turns: Option<usize>,
    /// Sequences the native target decodes at once (continuous batching; greedy outputs are
    /// batch 1's, see `aerie bench generate`).
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// How chat records are read.
    #[command(flatten)]
    pub input: ChatInputArgs,
    /// Replace a finished --out, and start over when OUT.partial was made with other options.
    #[arg(long)]
    pub overwrite: bool,
    /// `cpu`, `cuda:N` or `wgpu:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

impl RegenerateArgs {
    fn to_options(&self) -> Result<RegenerateOptions> {
        let mut o = RegenerateOptions::new(&self.data, &self.out);
        o.tokenizer = self.tokenizer.clone();
        o.target_name = match (&self.target, &self.server) {
            (Some(t), _) => t.display().to_string(),
            (None, _) => self.tokenizer.as_ref().map(|t| t.display().to_string()).unwrap_or_default(),
        };
        o.template_kwargs = parse_template_kwargs(&self.template_kwargs)?;
        o.read = self.input.read_options()?;
        o.normalize = self.input.normalize_options();
        o.template = self.template.parse::<TemplateChoice>()?;
        o.sampling = Sampling { temperature: self.temperature, top_p: self.top_p, seed: self.seed };
        o.max_new_tokens = self.max_new_tokens;
        o.max_length = (self.max_length > 0).then_some(self.max_length);
        o.max_samples = self.max_samples;
        o.batch_size = self.batch_size;
        o.max_turns = self.max_turns;
        o.overwrite = self.overwrite;
        Ok(o)
    }

    fn server_options(&self, url: &str, opts: &RegenerateOptions) -> Result<ServerOptions> {
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            anyhow::bail!("--timeout {} must be a positive number of seconds", self.timeout);
        }
        // Bounded before it becomes a Duration (1e300 s panicked there).
        const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;
        if self.timeout > MAX_TIMEOUT_S {
            anyhow::bail!("--timeout {} is past the limit of {MAX_TIMEOUT_S} seconds (a week)", self.timeout);
        }
        let mut s = ServerOptions::new(url);
        s.api = aerie_engine::parse_api(&self.api).map_err(|e| anyhow::anyhow!("--api: {e}"))?;
        s.model = self.model.clone();
        s.concurrency = self.concurrency;
        s.timeout = Duration::from_secs_f64(self.timeout);
        s.retries = self.retries;
        s.template_kwargs = opts.template_kwargs.clone();
        Ok(s)
    }
}

/// Run `aerie regenerate`.
pub fn run(args: RegenerateArgs) -> Result<()> {
    let opts = args.to_options()?;
    match (&args.server, &args.target) {
        (Some(url), _) => {
            let server = args.server_options(url, &opts)?;
            let report = with_progress(|p| regenerate_server(&server, &opts, p)).with_context(|| {
                format!("regenerating {} through {url} into {}", args.data.display(), args.out.display())
            })?;
            finish(&args, &report)
        }
        (None, Some(target)) => with_backend!(args.device, |B, dev| run_on::<B>(&args, target, &opts, &dev)),
        (None, None) => anyhow::bail!("give --target DIR (native) or --server URL"),
    }
}

fn run_on<B: Backend>(
    args: &RegenerateArgs,
    target_dir: &std::path::Path,
    opts: &RegenerateOptions,
    device: &B::Device,
) -> Result<()> {
    let target = TargetModel::<B>::load(target_dir, device)
        .with_context(|| format!("loading target {}", target_dir.display()))?;
    let report = with_progress(|p| regenerate(&target, target_dir, opts, p))
        .with_context(|| format!("regenerating {} into {}", args.data.display(), args.out.display()))?;
    finish(args, &report)
}

/// Run `job` with a progress bar fed by its progress callback.
fn with_progress<E>(
    job: impl FnOnce(&mut dyn FnMut(&RegenerateProgress)) -> std::result::Result<RegenerateReport, E>,
) -> std::result::Result<RegenerateReport, E> {
    let pb = ProgressBar::new(0);
    let mut styled = false;
    let start = Instant::now();
    let report = job(&mut |p: &RegenerateProgress| {
        if !styled {
            let tmpl = match (p.max_samples, p.unit) {
                (Some(_), _) => "regenerate [{elapsed_precise}] {wide_bar} {pos}/{len} records (ETA {eta}) {msg}",
                (None, ProgressUnit::Bytes) => {
                    "regenerate [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} of input (ETA {eta}) {msg}"
                }
                (None, ProgressUnit::Rows) => {
                    "regenerate [{elapsed_precise}] {wide_bar} {pos}/{len} input rows (ETA {eta}) {msg}"
                }
            };
            pb.set_style(ProgressStyle::with_template(tmpl).expect("valid template"));
            styled = true;
        }
        match p.max_samples {
            Some(m) => {
                pb.set_length(m);
                pb.set_position(p.records);
            }
            None => {
                pb.set_length(p.input_total);
                pb.set_position(p.input_done);
            }
        }
        let tps = p.tokens as f64 / start.elapsed().as_secs_f64().max(1e-9);
        pb.set_message(format!("{} records, {} tokens, {tps:.1} tokens/s", p.records, p.tokens));
    });
    pb.finish_and_clear();
    report
}

fn finish(args: &RegenerateArgs, report: &RegenerateReport) -> Result<()> {
    for w in &report.read.warnings {
        eprintln!("warning: {w}");
    }
    if report.read.warnings_omitted > 0 {
        eprintln!("warning: ... and {} more", report.read.warnings_omitted);
    }
    if args.json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print_report(report);
    }
    Ok(())
}

fn print_report(r: &RegenerateReport) {
    println!(
        "out          {} ({} records; {} resumed, {} written now)",
        r.out.display(),
        r.records,
        r.resumed_records,
        r.written_records
    );
    println!("report       {}", report_path(&r.out).display());
    println!(
        "turns        {} regenerated, {} tokens in {:.1} s ({:.1} tokens/s), {} prompt tokens",
        r.turns_regenerated, r.tokens_generated, r.seconds, r.tokens_per_second, r.prompt_tokens
    );
    if r.server.is_none() {
        println!(
            "speed        prefill {:.1} tokens/s ({:.1} s), decode {:.1} tokens/s",
            r.prefill_tokens_per_second, r.prefill_seconds, r.decode_tokens_per_second
        );
    }
    println!(
        "stopped by   eos {}, max-new-tokens {}, max-length {}",
        r.stopped_by_eos, r.stopped_by_max_new_tokens, r.stopped_by_max_length
    );
    if let Some(s) = &r.server {
        println!(
            "server       {} ({}, {}{}), {} requests, {} retried {:?}, concurrency {}, {:.2} s per request",
            s.url,
            s.api,
            s.api_source,
            s.model.as_deref().map(|m| format!(", model {m}")).unwrap_or_default(),
            s.requests,
            s.retries,
            s.retried,
            s.concurrency,
            s.mean_request_seconds
        );
    }
    for (reason, n) in &r.dropped {
        println!("  dropped    {n:>8}  {reason}");
    }
    for (reason, n) in &r.cut {
        println!("  cut        {n:>8}  {reason}");
    }
}
