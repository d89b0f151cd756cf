//! Unit tests of `eval serve`'s pure reductions.
use super::*;

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
    RunResult { answers: Vec::new(), timings: t, acceptance: None, cycle, startup_s: 1.0, warnings: Vec::new() }
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
    let report = ServeReport {
        engine: Engine::Vllm,
        engine_version: "0.32".into(),
        dtype: "float32".into(),
        target: "/t".into(),
        prompts: "/p".into(),
        answers: 1,
        max_new_tokens: 8,
        concurrency: 1,
        plain,
        plain_answers: Vec::new(),
        runs: vec![r.clone()],
        workdir: "/w".into(),
        warnings: Vec::new(),
        how: Vec::new(),
    };
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
