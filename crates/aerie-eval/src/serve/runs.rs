//! One engine run of `eval serve` (plain, or one drafter at one k) and its passes: the engine
//! is started once and answers the prompts once per place of the surface (each concurrency of
//! `--concurrency`, each prompt length of `--context`), so a sweep costs no engine start more
//! than a single measurement. Each pass's acceptance is its own: SGLang's per-answer counts, or
//! vLLM's counters read before and after that pass (their difference).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use aerie_engine::counters::vllm_counters;
use aerie_engine::meta::Endpoint;

use super::{
    Answer, Engine, PassTimings, PlainServe, ServeOptions, ServeProgress, ServeRun, ServedDrafter, answers,
    compare_answers, pass_acceptance, pass_cycle, run_pass,
};
use crate::cost::break_even_tau;
use crate::engine_acceptance::RunAcceptance;
use crate::measure::{MeasureOptions, TimedCycles};
use crate::prompts::{Prompt, long_context};
use crate::surface::Context;
use crate::{Error, Result};

fn measure_options(opts: &ServeOptions, base_url: &str, label: &str, concurrency: usize) -> MeasureOptions {
    MeasureOptions {
        server: base_url.to_string(),
        endpoint: Endpoint::Chat,
        concurrency,
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

/// What one pass of an engine run gave, at one place of the surface.
pub(super) struct RunResult {
    pub concurrency: usize,
    pub context: Context,
    pub answers: Vec<Answer>,
    pub timings: PassTimings,
    pub acceptance: Option<RunAcceptance>,
    /// The decode time and the cycles of the same answers (speculative runs).
    pub cycle: Option<TimedCycles>,
    pub startup_s: f64,
    pub warnings: Vec<String>,
}

/// The places of the surface, in the order passed: the primary one (the first concurrency and
/// context, what the report's single figures are) first.
pub(super) fn places(opts: &ServeOptions) -> Vec<(usize, Context)> {
    opts.contexts.iter().flat_map(|&ctx| opts.concurrency.iter().map(move |&c| (c, ctx))).collect()
}

/// Start the engine for one run, answer every prompt at every place, stop it.
pub(super) fn one_run(
    opts: &ServeOptions,
    label: &str,
    speculative: Option<(PathBuf, usize)>,
    progress: &dyn ServeProgress,
) -> Result<Vec<RunResult>> {
    // Drafter names are unique and hold no path separator (`aerie_hub::served`): one directory
    // per run.
    let dir = opts.workdir.join(label.replace(['/', '@'], "_"));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
    let mut launch = opts.launch.clone();
    let k = speculative.as_ref().map(|(_, k)| *k);
    if let (Some(_), Some(len)) = (k, opts.simulate_accept_length) {
        // Every cycle reports `len` tokens whatever the drafter drafts: the cycle at that τ.
        launch.env.extend(aerie_engine::simulate::sglang_simulated_acceptance(len));
    }
    launch.speculative = speculative;
    launch.log = dir.join("engine.log");
    progress.starting(label);
    let t0 = Instant::now();
    let mut engine = launch.start()?;
    let startup_s = t0.elapsed().as_secs_f64();
    let long = opts.contexts.contains(&Context::Long).then(|| long_context(&opts.prompts, opts.long_context_words));
    let mut out = Vec::new();
    for (concurrency, context) in places(opts) {
        let prompts: &[Prompt] = match (context, &long) {
            (Context::Long, Some(l)) => l,
            _ => &opts.prompts,
        };
        let pass = if places(opts).len() > 1 { format!("{label} c{concurrency} {context}") } else { label.into() };
        progress.serving(&pass, prompts.iter().map(Prompt::turns).sum());
        let counted = k.is_some() && opts.launch.engine == Engine::Vllm;
        let before = if counted { Some(vllm_counters(engine.base_url())?) } else { None };
        let m = measure_options(opts, engine.base_url(), label, concurrency);
        let engine_lock = std::sync::Mutex::new(&mut engine);
        let check = || engine_lock.lock().expect("no poisoned lock").check_alive().map_err(Error::from);
        let (answers, timings) = run_pass(prompts, &m, &|n| progress.answered(n), &check)?;
        let engine = engine_lock.into_inner().expect("no poisoned lock");
        let mut warnings = Vec::new();
        let acceptance = match k {
            Some(k) => Some(pass_acceptance(&pass, k, before, engine.base_url(), &answers, &mut warnings)?),
            None => None,
        };
        // The cycle's time and cycles over the same answers (vLLM's one count for the pass: all).
        let run_cycles = |acc: &RunAcceptance| (opts.launch.engine == Engine::Vllm).then_some(acc.drafts);
        let cycle =
            acceptance.as_ref().map(|acc| pass_cycle(&pass, &answers, run_cycles(acc), &mut warnings)).transpose()?;
        out.push(RunResult { concurrency, context, answers, timings, acceptance, cycle, startup_s, warnings });
    }
    engine.stop(Duration::from_secs(20));
    Ok(out)
}

/// The plain run's figures; an error when it timed no decode step.
pub(super) fn plain_serve(t: PassTimings, startup_s: f64) -> Result<PlainServe> {
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
pub(super) fn speculative_run(
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
        cells: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::ServeReport;
    use crate::surface::SurfacePoint;

    fn drafter() -> ServedDrafter {
        ServedDrafter { name: "d".into(), source: "/d".into(), dir: "/d".into(), layout: "as is".into(), warning: None }
    }

    fn timings(decode_tokens: u64, decode_s: f64) -> PassTimings {
        PassTimings {
            answers: 1,
            completion_tokens: decode_tokens + 1,
            decode_tokens,
            decode_s,
            decode_tokens_per_s: if decode_s > 0.0 { decode_tokens as f64 / decode_s } else { 0.0 },
            ttft_ms: 50.0,
            wall_s: 1.0,
        }
    }

    fn run(t: PassTimings) -> RunResult {
        let cycle = Some(TimedCycles { decode_s: t.decode_s, cycles: 40, responses: 1, left_out: 0 });
        RunResult {
            concurrency: 1,
            context: Context::Short,
            answers: Vec::new(),
            timings: t,
            acceptance: None,
            cycle,
            startup_s: 1.0,
            warnings: Vec::new(),
        }
    }

    /// A one-answer report of `engine` with these runs and surface (the rest fixed).
    fn report(
        engine: (Engine, &str),
        plain: PlainServe,
        runs: Vec<ServeRun>,
        surface: Vec<SurfacePoint>,
    ) -> ServeReport {
        ServeReport {
            engine: engine.0,
            engine_version: engine.1.into(),
            dtype: "float32".into(),
            target: "/t".into(),
            prompts: "/p".into(),
            answers: 1,
            max_new_tokens: 8,
            concurrency: 1,
            simulated_accept_length: None,
            plain,
            plain_answers: Vec::new(),
            runs,
            workdir: "/w".into(),
            warnings: Vec::new(),
            how: Vec::new(),
            surface,
        }
    }

    /// Issue 34 §2: a speculative run with no timed decode used to report speedup 0 and a NaN
    /// cycle (written into the costs file); measured and derived figures are labelled.
    #[test]
    fn a_run_without_timed_decode_is_an_error_and_the_cycle_is_measured() {
        let plain = plain_serve(timings(100, 2.0), 1.0).unwrap();
        assert!((plain.t_d_ms - 20.0).abs() < 1e-12);
        assert!(plain_serve(timings(0, 0.0), 1.0).unwrap_err().to_string().contains("plain run timed no decode"));
        // 40 cycles accepting 60 drafts: τ 2.5, 100 tokens in 1.6 s.
        let acc = RunAcceptance::from_histogram(&[0, 20, 20]).unwrap();
        let engine = (Engine::Vllm, "0.32");
        let none = speculative_run(&drafter(), 2, engine, &plain, &[], &run(timings(0, 0.0)), &acc);
        let e = none.unwrap_err().to_string();
        assert!(e.contains("d@k2") && e.contains("timed no decode step"), "{e}");
        let r = speculative_run(&drafter(), 2, engine, &plain, &[], &run(timings(100, 1.6)), &acc).unwrap();
        // Measured: 1.6 s over the engine's 40 cycles = 40 ms; derived: break-even 40 / 20 = 2.
        assert!((r.cycle_ms - 40.0).abs() < 1e-9, "{}", r.cycle_ms);
        assert!((r.break_even_tau - 2.0).abs() < 1e-9);
        assert!((r.speedup - 62.5 / 50.0).abs() < 1e-9);
        let report = report((Engine::Vllm, "0.32"), plain.clone(), vec![r.clone()], Vec::new());
        let costs = report.costs("today").unwrap();
        let p = &costs.provenance;
        assert!(p.measured.iter().any(|m| m.starts_with("cycle_ms.2") && m.contains("count of draft+verify cycles")));
        assert!(p.derived.iter().any(|m| m.starts_with("t_v.table.1")), "{p:?}");
        assert!(!p.measured.iter().any(|m| m.starts_with("t_v")), "{p:?}");
        // A NaN never reaches a costs file.
        let mut bad = report.clone();
        bad.runs[0].cycle_ms = f64::NAN;
        assert!(bad.costs("today").is_err());
        let mut nan = costs.clone();
        nan.t_d_ms = f64::NAN;
        assert!(nan.to_toml().unwrap_err().to_string().contains("refusing"));
    }

    /// Issue 46 §1: a sweep's report writes its surface, each place its own T_d and cycles, the
    /// top level its concurrency-1 short point (what `project` read before surfaces).
    #[test]
    fn a_sweep_writes_its_surface_to_the_costs_file() {
        let plain = plain_serve(timings(100, 2.0), 1.0).unwrap();
        let acc = RunAcceptance::from_histogram(&[0, 20, 20]).unwrap();
        let r = speculative_run(&drafter(), 2, (Engine::Sglang, "0.5.23"), &plain, &[], &run(timings(100, 1.6)), &acc)
            .unwrap();
        let mut one = SurfacePoint::plain(1, Context::Short, 20.0);
        one.add(2, 40.0, Some(2.5), Some(1.25));
        let mut four = SurfacePoint::plain(4, Context::Short, 25.0);
        four.add(2, 45.0, Some(2.5), Some(1.4));
        let report = report((Engine::Sglang, "0.5.23"), plain, vec![r], vec![one, four]);
        let costs = report.costs("today").unwrap();
        assert_eq!((costs.t_d_ms, costs.cycle_ms.get("2")), (20.0, Some(&40.0)));
        assert!(costs.provenance.measured_where.contains("1 short, 4 short"), "{:?}", costs.provenance);
        let four = costs.at(4, Context::Short).unwrap();
        assert_eq!((four.t_d_ms, four.cycle_ms.get("2")), (25.0, Some(&45.0)));
        assert_eq!(crate::surface::cells(&costs.surface).len(), 2);
    }
}
