//! The serving engine on the command line (`eval serve`, `compare --engine`): how to start it,
//! and each drafter put in its layout first (exported with `aerie_hub::export` when it is in the
//! other engine's), so both commands refuse and prepare the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aerie_eval::prompts::read_prompts;
use aerie_eval::serve::{EngineKind, EngineLaunch, ServeOptions, ServeProgress, ServedDrafter};
use aerie_hub::export::{ExportOptions, export};
use aerie_model::checkpoint::Dialect;
use aerie_model::checkpoint::config::read_config;
use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::ProgressBar;

/// How aerie starts a serving engine (`eval serve`, `compare --engine`).
#[derive(Debug, Args, Clone)]
pub struct EngineArgs {
    /// The serving engine: vllm (runs on this CPU with vLLM's CPU build; the default of `eval
    /// serve`) or sglang (`python -m aerie_serve sglang`; on a CPU with `--engine-arg=--device
    /// --engine-arg=cpu`). For `compare`, naming one compares inside it.
    #[arg(long)]
    pub engine: Option<EngineKind>,
    /// Python whose environment holds the engine; default `$AERIE_PYTHON`, else `python3`.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Loopback port for the engine (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Extra engine argument, passed as is (repeat it: `--engine-arg=--enforce-eager`).
    #[arg(long = "engine-arg", allow_hyphen_values = true)]
    pub engine_args: Vec<String>,
    /// Longest sequence the engine holds (prompt and answers).
    #[arg(long, default_value_t = 4096)]
    pub max_model_len: usize,
    /// Seconds to wait for the engine to answer after it starts.
    #[arg(long, default_value_t = 900)]
    pub startup_timeout_s: u64,
    /// Conversations in flight at once (1 times a single sequence's decode step).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
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
    pub fn kind(&self) -> EngineKind {
        self.engine.unwrap_or(EngineKind::Vllm)
    }
}

/// The largest k an engine is asked to draft: beyond it acceptance is ~0 and the verify batch
/// only grows (vLLM and SGLang serve EAGLE-3 at k ≤ 8 in practice).
const MAX_K: usize = 16;

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

fn default_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
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

/// Put each drafter in the engine's layout: served as is when it already is (or with
/// `--as-is`, with the warning), else exported into `<workdir>/drafters/`.
pub fn served_drafters(
    engine: &EngineArgs,
    target: &Path,
    drafters: &[PathBuf],
    names: &[String],
    workdir: &Path,
) -> Result<Vec<ServedDrafter>> {
    if !names.is_empty() && names.len() != drafters.len() {
        bail!("--names has {} entries for {} drafters", names.len(), drafters.len());
    }
    let native = Dialect::for_engine(engine.kind().name()).expect("aerie's engines have layouts");
    let mut out = Vec::with_capacity(drafters.len());
    for (i, src) in drafters.iter().enumerate() {
        let name = names.get(i).cloned().unwrap_or_else(|| default_name(src));
        let parsed = read_config(&src.join("config.json"), None)
            .with_context(|| format!("reading drafter {}", src.display()))?;
        let dialect = parsed.dialect;
        let warning = dialect.served_by_warning(engine.kind().name(), &parsed.config.aux_layers);
        let (dir, layout) = match warning {
            None => (src.clone(), format!("{} layout, served as is", dialect.engine())),
            Some(w) if engine.as_is => {
                eprintln!("warning: {}: {w}", src.display());
                (src.clone(), format!("served as is (--as-is): {w}"))
            }
            Some(_) => {
                let dest = workdir.join("drafters").join(format!("{name}-{}", native.name()));
                let opts = ExportOptions { target: Some(target.to_path_buf()), overwrite: true, ..Default::default() };
                let rep = export(src, native, &dest, opts)
                    .with_context(|| format!("exporting {} to {}'s layout", src.display(), engine.kind()))?;
                let layout = format!(
                    "{} layout exported to {}'s ({}, aux ids {:?} {}) in {}",
                    dialect.engine(),
                    native.engine(),
                    native.name(),
                    rep.aux_layer_ids,
                    rep.aux_convention.as_str(),
                    dest.display()
                );
                (dest, layout)
            }
        };
        out.push(ServedDrafter { name, source: src.clone(), dir, layout });
    }
    Ok(out)
}

/// The launch of `engine` for `target` (speculation set per run).
pub fn engine_launch(engine: &EngineArgs, target: &Path, workdir: &Path) -> EngineLaunch {
    let python = engine
        .python
        .clone()
        .or_else(|| std::env::var_os("AERIE_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"));
    EngineLaunch {
        kind: engine.kind(),
        python,
        package_dir: aerie_data::python::package_dir(),
        target: target.to_path_buf(),
        served_name: "target".into(),
        port: engine.port,
        speculative: None,
        max_model_len: engine.max_model_len,
        extra_args: engine.engine_args.clone(),
        env: Vec::new(),
        log: workdir.join("engine.log"),
        startup_timeout: Duration::from_secs(engine.startup_timeout_s.max(1)),
    }
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
    if let Some(&k) = ks.iter().find(|&&k| k == 0 || k > MAX_K) {
        bail!("--k {k}: draft steps must be between 1 and {MAX_K}");
    }
    if max_new_tokens < 2 {
        bail!("--max-new-tokens must be at least 2 (the first token is prefill; decode steps are timed after it)");
    }
    if engine.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if !target.join("config.json").is_file() {
        bail!("{}: not a model directory (no config.json): give the target as the engine loads it", target.display());
    }
    let mut list = read_prompts(prompts)?;
    if let Some(n) = max_prompts {
        list.truncate(n.max(1));
    }
    Ok(ServeOptions {
        launch: engine_launch(engine, target, workdir),
        prompts: list,
        prompts_path: prompts.to_path_buf(),
        ks: ks.to_vec(),
        max_new_tokens,
        concurrency: engine.concurrency,
        workdir: workdir.to_path_buf(),
        request_timeout: Duration::from_secs(1800),
    })
}
