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
mod runs;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use aerie_engine::Engine;
pub use aerie_engine::launch::{EngineLaunch, RunningEngine, ServedDrafter};
pub use answers::{
    Answer, COUNTED_ALL, COUNTED_WITHIN_ANSWERS, COUNTED_WITHIN_ANSWERS_AGAINST_ALL, FirstDifference, PassTimings,
    compare_answers, pass_acceptance, pass_cycle, run_pass,
};
pub use predict::{check_predict_shards, predict, predict_from_shards};

use runs::{RunResult, one_run, places, plain_serve, speculative_run};

use crate::accept::{AcceptReport, AcceptRule};
use crate::cost::{Costs, Provenance, speedup};
use crate::engine_acceptance::RunAcceptance;
use crate::profile::AcceptanceProfile;
use crate::prompts::Prompt;
use crate::surface::{Context, SurfaceCell, SurfacePoint};
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
    /// Conversations in flight at once, one pass per value (`--concurrency 1,4,16`); the first
    /// is the report's primary place.
    pub concurrency: Vec<usize>,
    /// Prompt lengths, one pass per value (`--context short,long`); the first is primary.
    pub contexts: Vec<Context>,
    /// Words of the passage before each long-context prompt
    /// ([`crate::prompts::long_context`]).
    pub long_context_words: usize,
    /// SGLang only: the accept length every verify cycle is made to report
    /// ([`aerie_engine::simulate::sglang_simulated_acceptance`]), for the cycle at a chosen τ apart from the drafter's quality.
    pub simulate_accept_length: Option<f64>,
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
    /// This drafter at this k at every place of the sweep (`--concurrency`, `--context`), the
    /// primary place (the figures above) first; empty for a single place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cells: Vec<SurfaceCell>,
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
    /// The accept length SGLang was told to simulate in every speculative run
    /// (`--simulate-accept-length`): τ then is the engine's fixed one, the cycle the cost at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_accept_length: Option<f64>,
    /// The plain run (at the primary place: the first concurrency and context).
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
    /// The cost surface: the plain T_d at every place, and the cycle, τ and speedup of the first
    /// drafter run at each k there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surface: Vec<SurfacePoint>,
}

impl ServeReport {
    /// The engine's measured costs as a costs file for `aerie project --costs`: T_d, and the
    /// cycle at each k from the first drafter run at it (the cycle depends on the drafter's
    /// shape and k, not on its weights); T_v(1) = T_d is derived, by definition. A figure that is
    /// not a positive number is an error, never a NaN in the file.
    pub fn costs(&self, when: &str) -> Result<Costs> {
        let mut measured = vec!["t_d_ms (the plain pass's decode time over its decode tokens)".to_string()];
        let mut firsts = std::collections::BTreeSet::new();
        for r in self.runs.iter().filter(|r| firsts.insert(r.k)) {
            measured.push(format!(
                "cycle_ms.{} (drafter {}: the pass's decode time over the engine's count of draft+verify cycles)",
                r.k, r.drafter
            ));
        }
        if self.surface.len() > 1 {
            measured.push("surface (the same, at every concurrency and context of the sweep)".into());
        }
        let places: Vec<String> = self.surface.iter().map(|p| format!("{} {}", p.concurrency, p.context)).collect();
        let sim = self
            .simulated_accept_length
            .map_or(String::new(), |s| format!(", SGLang's accept length simulated at {s}"));
        let provenance = Provenance {
            measured_where: format!(
                "aerie eval serve: {} {}, {} answers of at most {} tokens, concurrency and context {}{sim}",
                self.engine,
                self.engine_version,
                self.answers,
                self.max_new_tokens,
                places.join(", ")
            ),
            when: when.to_string(),
            by: "aerie eval serve".into(),
            measured,
            ..Default::default()
        };
        let name = format!("{} {} on {}", self.engine, self.engine_version, self.target.display());
        let mut surface = self.surface.clone();
        if surface.is_empty() {
            // A report from before surfaces: its one place.
            let mut p = SurfacePoint::plain(self.concurrency, Context::Short, self.plain.t_d_ms);
            for r in self.runs.iter().rev() {
                p.add(r.k, r.cycle_ms, Some(r.tau), Some(r.speedup));
            }
            surface.push(p);
        }
        Costs::from_surface(name, surface, provenance)
            .map_err(|e| Error::Report(format!("the engine's costs are not a costs file: {e}")))
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
    if opts.concurrency.is_empty() || opts.concurrency.contains(&0) || opts.contexts.is_empty() {
        return Err(Error::Incompatible("eval serve needs at least one concurrency (>= 1) and one context".into()));
    }
    if opts.simulate_accept_length.is_some() && opts.launch.engine != Engine::Sglang {
        return Err(Error::Incompatible(
            "--simulate-accept-length is SGLang's (SGLANG_SIMULATE_ACC_LEN): give --engine sglang".into(),
        ));
    }
    let version = aerie_engine::launch::engine_version(&opts.launch)?;
    let mut warnings: Vec<String> = drafters.iter().filter_map(|d| d.warning.clone()).collect();
    if let Some(&c) = opts.concurrency.iter().find(|&&c| c > 1) {
        warnings.push(format!(
            "concurrency {c}: step times are those of a batch of up to {c} sequences, not of one (T_d and the cycle \
             per sequence; the speedup the ratio of per-sequence decode rates)"
        ));
    }
    if let Some(len) = opts.simulate_accept_length {
        warnings.push(format!(
            "SGLang simulated an accept length of {len} in every speculative run: τ is the simulation's, not the \
             drafter's, and answers may differ from the plain ones; the cycle is the engine's cost at that τ"
        ));
    }
    let plain_runs = one_run(opts, "plain", None, progress)?;
    let mut plains = Vec::with_capacity(plain_runs.len());
    let mut surface = Vec::with_capacity(plain_runs.len());
    for r in &plain_runs {
        let p = plain_serve(r.timings.clone(), r.startup_s)?;
        progress.finished(&format!(
            "plain{}: {:.1} tokens/s (T_d {:.2} ms), TTFT {:.0} ms",
            place(opts, r),
            p.tokens_per_s,
            p.t_d_ms,
            p.ttft_ms
        ));
        let mut point = SurfacePoint::plain(r.concurrency, r.context, p.t_d_ms);
        point.simulated_accept_length = opts.simulate_accept_length;
        surface.push(point);
        plains.push(p);
    }
    let mut runs = Vec::new();
    for d in drafters {
        for &k in &opts.ks {
            let label = format!("{}@k{k}", d.name);
            let passes = one_run(opts, &label, Some((d.dir.clone(), k)), progress)?;
            let mut first: Option<ServeRun> = None;
            let mut cells = Vec::new();
            for (i, r) in passes.iter().enumerate() {
                warnings.extend(r.warnings.iter().cloned());
                let acc = r.acceptance.as_ref().expect("a speculative run reads its acceptance");
                let engine = (opts.launch.engine, version.as_str());
                let run = speculative_run(d, k, engine, &plains[i], &plain_runs[i].answers, r, acc)?;
                progress.finished(&format!(
                    "{label}{}: τ {:.4}, {:.1} tokens/s, speedup {:.3}× (measured), cycle {:.2} ms (measured), break-even τ {:.3} (derived), greedy identical {}/{}",
                    place(opts, r),
                    run.tau,
                    run.speculative_tokens_per_s,
                    run.speedup,
                    run.cycle_ms,
                    run.break_even_tau,
                    run.greedy_identical,
                    run.answers
                ));
                let point = &mut surface[i];
                if !point.cycle_ms.contains_key(&k.to_string()) {
                    point.add(k, run.cycle_ms, Some(run.tau), Some(run.speedup));
                }
                cells.push(SurfaceCell {
                    k,
                    concurrency: r.concurrency,
                    context: r.context,
                    simulated_accept_length: opts.simulate_accept_length,
                    t_d_ms: run.t_d_ms,
                    cycle_ms: run.cycle_ms,
                    break_even_tau: run.break_even_tau,
                    tau: Some(run.tau),
                    speedup: Some(run.speedup),
                });
                first.get_or_insert(run);
            }
            let mut run = first.expect("at least one place");
            if cells.len() > 1 {
                run.cells = cells;
            }
            runs.push(run);
        }
    }
    let plain_run = &plain_runs[0];
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
        concurrency: opts.concurrency[0],
        simulated_accept_length: opts.simulate_accept_length,
        plain: plains.swap_remove(0),
        plain_answers,
        runs,
        workdir: opts.workdir.clone(),
        warnings,
        how: HOW.iter().map(|s| s.to_string()).collect(),
        surface,
    })
}

/// ` (concurrency C, context X)` in progress lines when the sweep has more than one place.
fn place(opts: &ServeOptions, r: &RunResult) -> String {
    if places(opts).len() > 1 {
        format!(" (concurrency {}, context {})", r.concurrency, r.context)
    } else {
        String::new()
    }
}
