//! `aerie eval serve`: drafters evaluated inside the serving engine that will run them.
//!
//! The engine is started by aerie (a loopback port, its log in the work directory), once without
//! speculation and once per drafter and draft length k; each time the same prompts are answered
//! greedily through its chat endpoint (its own chat template), streamed so that the first token
//! and every later one are timed. Acceptance comes from the engine's own speculative counters
//! read before and after the pass ([`crate::counters`]), speed from the streamed timings, and the
//! verdict from both: the measured speedup, and the break-even τ at the engine's measured cycle
//! cost. aerie's own decoder can be run on the same prompts beside it ([`Prediction`]), so the
//! distance between what aerie predicts and what the engine does is a number, not a guess.

pub mod answers;
pub mod engine;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use crate::counters::{RunAcceptance, SpecCounters};
pub use answers::{Answer, FirstDifference, PassTimings, compare_answers, run_pass};
pub use engine::{EngineKind, EngineLaunch, RunningEngine};

use crate::accept::{AcceptReport, AcceptRule};
use crate::cost::{Costs, Provenance, VerifyCost, break_even_tau, speedup};
use crate::measure::MeasureOptions;
use crate::prompts::Prompt;
use crate::server_api::{ServerApi, settled_vllm_counters};
use crate::sglang::Endpoint;
use crate::{Error, Result};

/// A drafter as the engine will load it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedDrafter {
    /// Short name for reports.
    pub name: String,
    /// The directory given by the user.
    pub source: PathBuf,
    /// The directory the engine loads (the source, or its export to the engine's layout).
    pub dir: PathBuf,
    /// How the layout was prepared for the engine, or the warning that it was not.
    pub layout: String,
}

/// Everything about one evaluation but the drafters.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How to start the engine; `speculative` is set per run.
    pub launch: EngineLaunch,
    /// The prompts.
    pub prompts: Vec<Prompt>,
    /// The prompt file, for the report.
    pub prompts_path: PathBuf,
    /// Draft lengths to run each drafter at.
    pub ks: Vec<usize>,
    /// Tokens per answer at most.
    pub max_new_tokens: usize,
    /// Conversations in flight at once.
    pub concurrency: usize,
    /// Where each run's engine log goes (`<dir>/<run>/engine.log`).
    pub workdir: PathBuf,
    /// Whole-request timeout.
    pub request_timeout: Duration,
}

/// The plain (no speculation) run every speculative run is compared with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlainServe {
    /// Decode tokens/s of one sequence.
    pub tokens_per_s: f64,
    /// The engine's plain decode step T_d, ms (1000 / tokens_per_s).
    pub t_d_ms: f64,
    /// Mean time to first token, ms.
    pub ttft_ms: f64,
    /// The pass's totals.
    pub timings: PassTimings,
    /// Seconds from start to the engine's first answer to `/v1/models`.
    pub startup_s: f64,
}

/// aerie's offline prediction for the same drafter, prompts and k.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// τ of aerie's own decoder (`eval decode`) on the same prompts.
    pub tau: f64,
    /// The speedup that τ projects through the engine's measured T_d and cycle.
    pub projected_speedup: f64,
    /// The engine's τ minus aerie's.
    pub tau_difference: f64,
    /// The engine's measured speedup minus the projected one.
    pub speedup_difference: f64,
    /// Whether aerie's speculative answers equalled its plain ones.
    pub greedy_identical: bool,
}

/// One drafter at one k, measured in the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServeRun {
    /// The drafter's name.
    pub drafter: String,
    /// The directory the engine loaded.
    pub drafter_dir: PathBuf,
    /// How its layout was prepared (or the warning that it was served as is).
    pub layout: String,
    /// Draft steps.
    pub k: usize,
    /// `vllm` or `sglang`.
    pub engine: EngineKind,
    /// The engine's version.
    pub engine_version: String,
    /// Accept length: tokens per draft+verify cycle, bonus included.
    pub tau: f64,
    /// α_i = P(draft i accepted | drafts before it accepted).
    pub accept_rate_conditional: Vec<f64>,
    /// r_i = P(at least i drafts accepted).
    pub accept_rate_unconditional: Vec<f64>,
    /// Draft+verify cycles counted.
    pub drafts: u64,
    /// Accepted drafts at each position.
    pub accepted_per_pos: Vec<u64>,
    /// Plain decode tokens/s (the shared plain run).
    pub plain_tokens_per_s: f64,
    /// Speculative decode tokens/s.
    pub speculative_tokens_per_s: f64,
    /// speculative / plain.
    pub speedup: f64,
    /// Mean time to first token with speculation, ms.
    pub ttft_ms: f64,
    /// Mean time to first token without, ms.
    pub plain_ttft_ms: f64,
    /// Answers identical to the plain run's (greedy speculation must change nothing).
    pub greedy_identical: usize,
    /// Answers compared.
    pub answers: usize,
    /// The first answer that differs.
    pub first_difference: Option<FirstDifference>,
    /// The engine's plain decode step, ms.
    pub t_d_ms: f64,
    /// One draft+verify cycle, ms: the speculative inter-token time × τ.
    pub cycle_ms: f64,
    /// τ at which this cycle cost breaks even with plain decoding (cycle / T_d).
    pub break_even_tau: f64,
    /// Seconds from start to the engine answering.
    pub startup_s: f64,
    /// aerie's own prediction, with `--predict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
}

impl ServeRun {
    /// The engine's acceptance as aerie's acceptance report (τ, rates, curve τ(k' ≤ k)), so
    /// `compare` tabulates and plots it like an offline or decoding evaluation.
    pub fn accept_report(&self) -> AcceptReport {
        let accepted: u64 = self.accepted_per_pos.iter().sum();
        let acc = RunAcceptance {
            drafts: self.drafts,
            draft_tokens: self.drafts * self.k as u64,
            accepted,
            accepted_per_pos: self.accepted_per_pos.clone(),
            tau: self.tau,
            accept_rate_unconditional: self.accept_rate_unconditional.clone(),
            accept_rate_conditional: self.accept_rate_conditional.clone(),
        };
        let mut r = AcceptReport::from_counter(&acc.counter(), AcceptRule::Greedy, None, 0.0);
        r.samples = self.answers;
        r
    }

    /// Attach aerie's own τ for the same drafter, prompts and k.
    pub fn predict(&mut self, tau: f64, greedy_identical: bool) {
        let projected = speedup(tau, self.t_d_ms, self.cycle_ms);
        self.prediction = Some(Prediction {
            tau,
            projected_speedup: projected,
            tau_difference: self.tau - tau,
            speedup_difference: self.speedup - projected,
            greedy_identical,
        });
    }
}

/// The result of `aerie eval serve` (its `--json` output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServeReport {
    /// `vllm` or `sglang`.
    pub engine: EngineKind,
    /// The engine's version.
    pub engine_version: String,
    /// The target directory served.
    pub target: PathBuf,
    /// The prompt file.
    pub prompts: PathBuf,
    /// Answers per pass (prompts × turns).
    pub answers: usize,
    /// Tokens per answer at most.
    pub max_new_tokens: usize,
    /// Conversations in flight at once.
    pub concurrency: usize,
    /// The plain run.
    pub plain: PlainServe,
    /// One per drafter and k, in the order run.
    pub runs: Vec<ServeRun>,
    /// Where the engine logs are.
    pub workdir: PathBuf,
    /// Caveats.
    pub warnings: Vec<String>,
}

impl ServeReport {
    /// The engine's measured costs as a costs file for `aerie project --costs`: T_d, and the
    /// cycle at each k from the first drafter run at it (the cycle depends on the drafter's
    /// shape and k, not on its weights).
    pub fn costs(&self, when: &str) -> Costs {
        let mut cycle_ms = std::collections::BTreeMap::new();
        let mut measured = vec!["t_d_ms".to_string(), "t_v.table.1 (= t_d_ms)".to_string()];
        for r in &self.runs {
            if let std::collections::btree_map::Entry::Vacant(e) = cycle_ms.entry(r.k.to_string()) {
                e.insert(r.cycle_ms);
                measured.push(format!("cycle_ms.{} (drafter {})", r.k, r.drafter));
            }
        }
        Costs {
            name: format!("{} {} on {}", self.engine, self.engine_version, self.target.display()),
            t_d_ms: self.plain.t_d_ms,
            t_v: Some(VerifyCost { table: [("1".to_string(), self.plain.t_d_ms)].into(), ..Default::default() }),
            cycle_ms,
            provenance: Provenance {
                measured_where: format!(
                    "aerie eval serve: {} {}, {} answers of at most {} tokens, concurrency {}",
                    self.engine, self.engine_version, self.answers, self.max_new_tokens, self.concurrency
                ),
                when: when.to_string(),
                by: "aerie eval serve".into(),
                measured,
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

/// What `evaluate` reports as it goes.
pub trait ServeProgress: Sync {
    /// A run (`plain`, or `drafter@k`) starts its engine.
    fn starting(&self, run: &str);
    /// The engine answers; `answers` requests follow.
    fn serving(&self, run: &str, answers: usize);
    /// One more answer of the current run.
    fn answered(&self, done: usize);
    /// A run finished; `line` summarises it.
    fn finished(&self, line: &str);
}

fn measure_options(opts: &ServeOptions, base_url: &str, label: &str) -> MeasureOptions {
    MeasureOptions {
        server: base_url.to_string(),
        endpoint: Endpoint::Chat,
        concurrency: opts.concurrency,
        max_new_tokens: opts.max_new_tokens,
        stream: true,
        expect_speculation: false,
        timeout: opts.request_timeout,
        retries: 0,
        backoff: Duration::from_millis(500),
        label: label.to_string(),
        model: opts.launch.served_name.clone(),
        api: Some(match opts.launch.kind {
            EngineKind::Vllm => ServerApi::Vllm,
            EngineKind::Sglang => ServerApi::Sglang,
        }),
    }
}

/// Start the engine for one run, answer every prompt, stop it.
fn one_run(
    opts: &ServeOptions,
    label: &str,
    speculative: Option<(PathBuf, usize)>,
    progress: &dyn ServeProgress,
) -> Result<(Vec<Answer>, PassTimings, Option<RunAcceptance>, f64)> {
    let dir = opts.workdir.join(label.replace(['/', '@'], "_"));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
    let mut launch = opts.launch.clone();
    let k = speculative.as_ref().map(|(_, k)| *k);
    launch.speculative = speculative;
    launch.log = dir.join("engine.log");
    progress.starting(label);
    let t0 = Instant::now();
    let mut engine = launch.start()?;
    let startup_s = t0.elapsed().as_secs_f64();
    let answers_total: usize = opts.prompts.iter().map(Prompt::turns).sum();
    progress.serving(label, answers_total);
    let counted = k.is_some() && opts.launch.kind == EngineKind::Vllm;
    let before = if counted { Some(engine::spec_counters(engine.base_url(), opts.launch.kind)?) } else { None };
    let m = measure_options(opts, engine.base_url(), label);
    let engine_lock = std::sync::Mutex::new(&mut engine);
    let check = || engine_lock.lock().expect("no poisoned lock").check_alive();
    let (answers, timings) = run_pass(&opts.prompts, &m, &|n| progress.answered(n), &check)?;
    let engine = engine_lock.into_inner().expect("no poisoned lock");
    let acceptance = match (k, before) {
        (Some(k), Some(before)) => {
            let after = settled_vllm_counters(engine.base_url())?;
            Some(RunAcceptance::between(&before, &after, k)?)
        }
        // SGLang reports each response's accepted-drafts histogram instead of counters.
        (Some(k), None) => {
            let mut hist = vec![0u64; k + 1];
            for h in answers.iter().filter_map(|a| a.result.meta.histogram.as_ref()) {
                hist.iter_mut().zip(h).for_each(|(a, b)| *a += b);
            }
            Some(RunAcceptance::from_histogram(&hist)?)
        }
        _ => None,
    };
    engine.stop(Duration::from_secs(20));
    Ok((answers, timings, acceptance, startup_s))
}

/// Evaluate `drafters` in the engine against one plain run of the same prompts.
pub fn evaluate(opts: &ServeOptions, drafters: &[ServedDrafter], progress: &dyn ServeProgress) -> Result<ServeReport> {
    if opts.prompts.is_empty() || opts.max_new_tokens == 0 || opts.ks.is_empty() || drafters.is_empty() {
        return Err(Error::Incompatible(
            "eval serve needs at least one prompt, one drafter, one k and max_new_tokens >= 1".into(),
        ));
    }
    let version = engine::engine_version(&opts.launch)?;
    let mut warnings = Vec::new();
    if opts.concurrency > 1 {
        warnings.push(format!(
            "concurrency {}: step times are those of a batch of up to {} sequences, not of one",
            opts.concurrency, opts.concurrency
        ));
    }
    let (plain_answers, plain_t, _, plain_startup) = one_run(opts, "plain", None, progress)?;
    if plain_t.decode_tokens == 0 {
        return Err(Error::Incompatible(
            "the plain run timed no decode step (every answer was one chunk): raise --max-new-tokens".into(),
        ));
    }
    let plain = PlainServe {
        tokens_per_s: plain_t.decode_tokens_per_s,
        t_d_ms: 1000.0 / plain_t.decode_tokens_per_s,
        ttft_ms: plain_t.ttft_ms,
        timings: plain_t,
        startup_s: plain_startup,
    };
    progress.finished(&format!(
        "plain: {:.1} tokens/s (T_d {:.2} ms), TTFT {:.0} ms",
        plain.tokens_per_s, plain.t_d_ms, plain.ttft_ms
    ));
    let mut runs = Vec::new();
    for d in drafters {
        for &k in &opts.ks {
            let label = format!("{}@k{k}", d.name);
            let (answers, t, acc, startup_s) = one_run(opts, &label, Some((d.dir.clone(), k)), progress)?;
            let acc = acc.expect("a speculative run reads its counters");
            let (identical, first_difference) = compare_answers(&plain_answers, &answers);
            let spec_rate = t.decode_tokens_per_s;
            let cycle_ms = if spec_rate > 0.0 { 1000.0 * acc.tau / spec_rate } else { f64::NAN };
            let run = ServeRun {
                drafter: d.name.clone(),
                drafter_dir: d.dir.clone(),
                layout: d.layout.clone(),
                k,
                engine: opts.launch.kind,
                engine_version: version.clone(),
                tau: acc.tau,
                accept_rate_conditional: acc.accept_rate_conditional.clone(),
                accept_rate_unconditional: acc.accept_rate_unconditional.clone(),
                drafts: acc.drafts,
                accepted_per_pos: acc.accepted_per_pos.clone(),
                plain_tokens_per_s: plain.tokens_per_s,
                speculative_tokens_per_s: spec_rate,
                speedup: spec_rate / plain.tokens_per_s,
                ttft_ms: t.ttft_ms,
                plain_ttft_ms: plain.ttft_ms,
                greedy_identical: identical,
                answers: answers.len(),
                first_difference,
                t_d_ms: plain.t_d_ms,
                cycle_ms,
                break_even_tau: break_even_tau(cycle_ms, plain.t_d_ms),
                startup_s,
                prediction: None,
            };
            progress.finished(&format!(
                "{label}: τ {:.4}, {:.1} tokens/s, speedup {:.3}×, break-even τ {:.3}, greedy identical {}/{}",
                run.tau,
                run.speculative_tokens_per_s,
                run.speedup,
                run.break_even_tau,
                run.greedy_identical,
                run.answers
            ));
            runs.push(run);
        }
    }
    Ok(ServeReport {
        engine: opts.launch.kind,
        engine_version: version,
        target: opts.launch.target.clone(),
        prompts: opts.prompts_path.clone(),
        answers: plain_answers.len(),
        max_new_tokens: opts.max_new_tokens,
        concurrency: opts.concurrency,
        plain,
        runs,
        workdir: opts.workdir.clone(),
        warnings,
    })
}
