//! `aerie eval serve`: drafters evaluated inside the serving engine that will run them.
//!
//! The engine is started by aerie (a loopback port, its log in the work directory), once without
//! speculation and once per drafter and draft length k; each time the same prompts are answered
//! greedily through its chat endpoint (its own chat template), streamed so that the first token
//! and every later one are timed. Acceptance comes from the engine's own speculative counters
//! read before and after the pass ([`crate::engine_acceptance`]), speed from the streamed timings,
//! and the verdict from both: the measured speedup, and the break-even τ derived from the engine's
//! measured cycle. aerie's own decoder can be run on the same prompts beside it ([`Prediction`]),
//! so the distance between what aerie predicts and what the engine does is a number, not a guess.
//!
//! Measured and derived figures are named as such ([`HOW`]): T_d is the plain pass's decode time
//! over its decode tokens, the cycle the speculative pass's decode time over the engine's own
//! count of draft+verify cycles, the speedup the ratio of the two decode rates; the break-even τ
//! (cycle / T_d) and a projected speedup (τ · T_d / cycle) are derived from them.

pub mod answers;
mod predict;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use aerie_engine::Engine;
pub use aerie_engine::launch::{EngineLaunch, RunningEngine, ServedDrafter};
pub use answers::{
    Answer, COUNTED_ALL, COUNTED_WITHIN_ANSWERS, COUNTED_WITHIN_ANSWERS_AGAINST_ALL, FirstDifference, PassTimings,
    compare_answers, pass_acceptance, pass_cycle, run_pass,
};
pub use predict::{predict, predict_from_shards};

use aerie_engine::counters::vllm_counters;
use aerie_engine::meta::Endpoint;

use crate::accept::{AcceptReport, AcceptRule};
use crate::cost::{Costs, Provenance, VerifyCost, break_even_tau, speedup};
use crate::engine_acceptance::RunAcceptance;
use crate::measure::{MeasureOptions, TimedCycles};
use crate::profile::AcceptanceProfile;
use crate::prompts::Prompt;
use crate::{Error, Result};

/// How each figure of a report is obtained, measured or derived (printed with the report and
/// recorded in its JSON, so no derived number passes for a measurement).
pub const HOW: [&str; 5] = [
    "t_d_ms (measured): the plain pass's decode time over its decode tokens (after each answer's first chunk)",
    "speedup (measured): the speculative pass's decode rate over the plain pass's, same prompts and answers length",
    "cycle_ms (measured): the speculative pass's decode time over the engine's own count of draft+verify cycles, of the same answers (SGLang: each answer's own count; an answer whose first chunk held a cycle's tokens is left out of both)",
    "break_even_tau (derived): cycle_ms / t_d_ms, the τ at which that cycle pays",
    "projected_speedup (derived): aerie's τ × t_d_ms / cycle_ms",
];

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
    /// Derived: the speedup that τ projects through the engine's measured T_d and cycle
    /// (τ · T_d / cycle).
    pub projected_speedup: f64,
    /// The engine's τ minus aerie's.
    pub tau_difference: f64,
    /// The engine's measured speedup minus the projected one.
    pub speedup_difference: f64,
    /// Whether aerie's speculative answers equalled its plain ones, where that was compared
    /// (`--predict`: aerie's decoder ran both); `None` where it was not (`--predict-from`: the walk
    /// decodes nothing, its answers are the captured ones).
    #[serde(default)]
    pub greedy_identical: Option<bool>,
    /// The shards whose cycles were walked (`--predict-from`), when the prediction is `eval
    /// accept`'s cycle walk over the engine's own answers rather than aerie's decoder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<PathBuf>,
    /// The walk's verify cycles, to set against the engine's count (`drafts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycles: Option<u64>,
    /// The walk's accepted drafts, to set against the engine's accepted drafts within the answers
    /// ([`ServeRun::accepted_within_answers`]), count for count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_drafts: Option<u64>,
    /// Which accepted drafts the prediction's τ counts, so which engine τ `tau_difference` uses:
    /// [`COUNTED_ALL`], [`COUNTED_WITHIN_ANSWERS`] or [`COUNTED_WITHIN_ANSWERS_AGAINST_ALL`].
    #[serde(default)]
    pub counted: String,
    /// The prediction's acceptance profile, counted as `counted` says: `eval decode`'s (the
    /// verdicts, as the engine counts) or the walk's, to set against the run's `profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<AcceptanceProfile>,
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
    pub engine: Engine,
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
    /// The engine's accepted drafts that are answer tokens (`accepted_per_pos` also counts those
    /// past an answer's end), what the cycle walk counts ([`answers::accepted_within_answers`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_within_answers: Option<u64>,
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
    /// The engine's plain decode step, ms (measured, the plain run's).
    pub t_d_ms: f64,
    /// One draft+verify cycle, ms, measured: the pass's decode time over the engine's count of
    /// cycles, both of the same answers ([`timed_cycles`]).
    pub cycle_ms: f64,
    /// Derived: the τ at which this cycle breaks even with plain decoding, cycle_ms / t_d_ms.
    pub break_even_tau: f64,
    /// Seconds from start to the engine answering.
    pub startup_s: f64,
    /// aerie's own prediction, with `--predict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
    /// The acceptance profile ([`crate::profile`]): the engine's rates, and τ by output position
    /// from the stream's chunks where they are exactly its cycles (the reason where not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<AcceptanceProfile>,
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
        r.profile = self.profile.clone();
        r
    }

    /// Attach aerie's own τ for the same drafter, prompts and k.
    pub fn predict(&mut self, tau: f64, greedy_identical: Option<bool>) {
        let projected = speedup(tau, self.t_d_ms, self.cycle_ms);
        self.prediction = Some(Prediction {
            tau,
            projected_speedup: projected,
            tau_difference: self.tau - tau,
            speedup_difference: self.speedup - projected,
            greedy_identical,
            shards: None,
            cycles: None,
            accepted_drafts: None,
            counted: COUNTED_ALL.into(),
            profile: None,
        });
    }
}

/// The result of `aerie eval serve` (its `--json` output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServeReport {
    /// `vllm` or `sglang`.
    pub engine: Engine,
    /// The engine's version.
    pub engine_version: String,
    /// The dtype the engine served in ([`EngineLaunch::served_dtype`]): `float32` where aerie
    /// chose it (an engine on a CPU), the user's `--dtype`, or `auto` (the engine's default: the
    /// checkpoint's own dtype). Greedy identity with the plain answers holds exactly only in f32.
    #[serde(default)]
    pub dtype: String,
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
    /// The plain run's answers, in prompt-file order (each turn after the engine's own earlier
    /// answers): what `--predict-from` checks its shards against.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plain_answers: Vec<AnswerText>,
    /// One per drafter and k, in the order run.
    pub runs: Vec<ServeRun>,
    /// Where the engine logs are.
    pub workdir: PathBuf,
    /// Caveats.
    pub warnings: Vec<String>,
    /// How each figure is obtained, measured or derived ([`HOW`]).
    pub how: Vec<String>,
}

impl ServeReport {
    /// The engine's measured costs as a costs file for `aerie project --costs`: T_d, and the
    /// cycle at each k from the first drafter run at it (the cycle depends on the drafter's
    /// shape and k, not on its weights); T_v(1) = T_d is derived, by definition. A figure that is
    /// not a positive number is an error, never a NaN in the file.
    pub fn costs(&self, when: &str) -> Result<Costs> {
        let mut cycle_ms = std::collections::BTreeMap::new();
        let mut measured = vec!["t_d_ms (the plain pass's decode time over its decode tokens)".to_string()];
        for r in &self.runs {
            if let std::collections::btree_map::Entry::Vacant(e) = cycle_ms.entry(r.k.to_string()) {
                e.insert(r.cycle_ms);
                measured.push(format!(
                    "cycle_ms.{} (drafter {}: the pass's decode time over the engine's count of draft+verify cycles)",
                    r.k, r.drafter
                ));
            }
        }
        let costs = Costs {
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
                derived: vec!["t_v.table.1 (= t_d_ms: one verify pass over one token is a decode step)".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        costs.validate().map_err(|m| Error::Report(format!("the engine's costs are not a costs file: {m}")))?;
        Ok(costs)
    }
}

/// One of the engine's answers, as the report keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerText {
    /// The prompt's id.
    pub prompt: String,
    /// The turn (0-based).
    pub turn: usize,
    /// The answer's text, as the chat endpoint returned it.
    pub text: String,
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
        api: Some(opts.launch.engine),
    }
}

/// What one engine run gave.
struct RunResult {
    answers: Vec<Answer>,
    timings: PassTimings,
    acceptance: Option<RunAcceptance>,
    /// The decode time and the cycles of the same answers (speculative runs).
    cycle: Option<TimedCycles>,
    startup_s: f64,
    warnings: Vec<String>,
}

/// Start the engine for one run, answer every prompt, stop it.
fn one_run(
    opts: &ServeOptions,
    label: &str,
    speculative: Option<(PathBuf, usize)>,
    progress: &dyn ServeProgress,
) -> Result<RunResult> {
    // Drafter names are unique and hold no path separator (`aerie_hub::served`): one directory
    // per run.
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
    let counted = k.is_some() && opts.launch.engine == Engine::Vllm;
    let before = if counted { Some(vllm_counters(engine.base_url())?) } else { None };
    let m = measure_options(opts, engine.base_url(), label);
    let engine_lock = std::sync::Mutex::new(&mut engine);
    let check = || engine_lock.lock().expect("no poisoned lock").check_alive().map_err(Error::from);
    let (answers, timings) = run_pass(&opts.prompts, &m, &|n| progress.answered(n), &check)?;
    let engine = engine_lock.into_inner().expect("no poisoned lock");
    let mut warnings = Vec::new();
    let acceptance = match k {
        Some(k) => Some(pass_acceptance(label, k, before, engine.base_url(), &answers, &mut warnings)?),
        None => None,
    };
    // The cycle's time and cycles over the same answers (vLLM's one count for the run: all).
    let run_cycles = |acc: &RunAcceptance| (opts.launch.engine == Engine::Vllm).then_some(acc.drafts);
    let cycle =
        acceptance.as_ref().map(|acc| pass_cycle(label, &answers, run_cycles(acc), &mut warnings)).transpose()?;
    engine.stop(Duration::from_secs(20));
    Ok(RunResult { answers, timings, acceptance, cycle, startup_s, warnings })
}

/// The plain run's figures; an error when it timed no decode step.
fn plain_serve(t: PassTimings, startup_s: f64) -> Result<PlainServe> {
    if t.decode_tokens == 0 || t.decode_s <= 0.0 {
        return Err(Error::Incompatible(
            "the plain run timed no decode step (every answer was one chunk): raise --max-new-tokens".into(),
        ));
    }
    Ok(PlainServe {
        tokens_per_s: t.decode_tokens_per_s,
        t_d_ms: 1000.0 / t.decode_tokens_per_s,
        ttft_ms: t.ttft_ms,
        timings: t,
        startup_s,
    })
}

/// One speculative run's figures against the plain run (pure). A run that timed no decode step
/// is an error naming it: its speedup would read 0 and its cycle NaN.
fn speculative_run(
    d: &ServedDrafter,
    k: usize,
    engine: (Engine, &str),
    plain: &PlainServe,
    plain_answers: &[Answer],
    run: &RunResult,
    acc: &RunAcceptance,
) -> Result<ServeRun> {
    let t = &run.timings;
    if t.decode_tokens == 0 || t.decode_s <= 0.0 || acc.drafts == 0 {
        return Err(Error::Incompatible(format!(
            "{}@k{k}: the speculative run timed no decode step ({} decode tokens in {:.3} s, {} cycles counted): \
             no speedup or cycle can be measured; raise --max-new-tokens",
            d.name, t.decode_tokens, t.decode_s, acc.drafts
        )));
    }
    let (identical, first_difference) = compare_answers(plain_answers, &run.answers);
    let cycle_ms = run.cycle.as_ref().and_then(TimedCycles::cycle_ms).ok_or_else(|| {
        let why = format!("no answer's decode time could be set against its cycles ({:?})", run.cycle);
        Error::Incompatible(format!("{}@k{k}: {why}: no cycle can be measured", d.name))
    })?;
    let accepted_within_answers = answers::accepted_within_answers(&run.answers, acc.drafts, acc.accepted);
    let streamed: Vec<_> = run.answers.iter().map(|a| a.result.streamed()).collect();
    let counted = match engine.0 {
        Engine::Vllm => crate::measure::COUNTED_BY_DIFFERENCE,
        _ => crate::measure::COUNTED_PER_RESPONSE,
    };
    Ok(ServeRun {
        drafter: d.name.clone(),
        drafter_dir: d.dir.clone(),
        layout: d.layout.clone(),
        k,
        engine: engine.0,
        engine_version: engine.1.to_string(),
        tau: acc.tau,
        accept_rate_conditional: acc.accept_rate_conditional.clone(),
        accept_rate_unconditional: acc.accept_rate_unconditional.clone(),
        drafts: acc.drafts,
        accepted_per_pos: acc.accepted_per_pos.clone(),
        accepted_within_answers,
        plain_tokens_per_s: plain.tokens_per_s,
        speculative_tokens_per_s: t.decode_tokens_per_s,
        speedup: t.decode_tokens_per_s / plain.tokens_per_s,
        ttft_ms: t.ttft_ms,
        plain_ttft_ms: plain.ttft_ms,
        greedy_identical: identical,
        answers: run.answers.len(),
        first_difference,
        t_d_ms: plain.t_d_ms,
        cycle_ms,
        break_even_tau: break_even_tau(cycle_ms, plain.t_d_ms),
        startup_s: run.startup_s,
        prediction: None,
        profile: Some(
            acc.profile(&streamed, "eval serve", counted)
                .condition("engine", format!("{} {}", engine.0, engine.1))
                .condition("drafter", &d.name)
                .condition("answers", run.answers.len()),
        ),
    })
}

/// Evaluate `drafters` in the engine against one plain run of the same prompts.
pub fn evaluate(opts: &ServeOptions, drafters: &[ServedDrafter], progress: &dyn ServeProgress) -> Result<ServeReport> {
    if opts.prompts.is_empty() || opts.max_new_tokens == 0 || opts.ks.is_empty() || drafters.is_empty() {
        return Err(Error::Incompatible(
            "eval serve needs at least one prompt, one drafter, one k and max_new_tokens >= 1".into(),
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    if let Some(d) = drafters.iter().find(|d| !names.insert(d.name.as_str())) {
        return Err(Error::Incompatible(format!("two drafters are named `{}`: each run needs its own name", d.name)));
    }
    let version = aerie_engine::launch::engine_version(&opts.launch)?;
    let mut warnings: Vec<String> = drafters.iter().filter_map(|d| d.warning.clone()).collect();
    if opts.concurrency > 1 {
        warnings.push(format!(
            "concurrency {}: step times are those of a batch of up to {} sequences, not of one",
            opts.concurrency, opts.concurrency
        ));
    }
    let plain_run = one_run(opts, "plain", None, progress)?;
    let plain = plain_serve(plain_run.timings.clone(), plain_run.startup_s)?;
    progress.finished(&format!(
        "plain: {:.1} tokens/s (T_d {:.2} ms), TTFT {:.0} ms",
        plain.tokens_per_s, plain.t_d_ms, plain.ttft_ms
    ));
    let mut runs = Vec::new();
    for d in drafters {
        for &k in &opts.ks {
            let label = format!("{}@k{k}", d.name);
            let r = one_run(opts, &label, Some((d.dir.clone(), k)), progress)?;
            warnings.extend(r.warnings.iter().cloned());
            let acc = r.acceptance.as_ref().expect("a speculative run reads its acceptance");
            let run = speculative_run(d, k, (opts.launch.engine, &version), &plain, &plain_run.answers, &r, acc)?;
            progress.finished(&format!(
                "{label}: τ {:.4}, {:.1} tokens/s, speedup {:.3}× (measured), cycle {:.2} ms (measured), break-even τ {:.3} (derived), greedy identical {}/{}",
                run.tau,
                run.speculative_tokens_per_s,
                run.speedup,
                run.cycle_ms,
                run.break_even_tau,
                run.greedy_identical,
                run.answers
            ));
            runs.push(run);
        }
    }
    let plain_answers = plain_run
        .answers
        .iter()
        .map(|a| AnswerText { prompt: a.prompt.clone(), turn: a.turn, text: a.result.answer.clone() })
        .collect();
    Ok(ServeReport {
        engine: opts.launch.engine,
        engine_version: version,
        dtype: opts.launch.served_dtype(),
        target: opts.launch.target.clone(),
        prompts: opts.prompts_path.clone(),
        answers: plain_run.answers.len(),
        max_new_tokens: opts.max_new_tokens,
        concurrency: opts.concurrency,
        plain,
        plain_answers,
        runs,
        workdir: opts.workdir.clone(),
        warnings,
        how: HOW.iter().map(|s| s.to_string()).collect(),
    })
}

#[cfg(test)]
mod tests;
