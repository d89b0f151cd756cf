//! aerie against the real SGLang (0.5.23, python/requirements-sglang.txt; helpers shared with the
//! vLLM tests in `common/engine.rs`) on the CPU, serving the quickstart's SmolLM2-135M imported from the assets'
//! GGUF, with the trained fixture drafter (`tests/fixtures/smollm2-135m-eagle3`, τ ≈ 1.35).
//!
//! Through `$AERIE_SGLANG_PYTHON` (skipped with a note when unset or without SGLang, failing when
//! `CI=true`). SGLang's CPU attention comes from the test-only `sgl_kernel` stand-in
//! (python/tests/sglang_cpu): everything else is SGLang's own, its EAGLE-3 worker and acceptance
//! accounting included. Each start costs 50-115 s on two cores, so the tests start as few as they
//! can: one start that SGLang refuses (the speculators layout), one `eval serve` (plain and two
//! drafters), one `compare --engine sglang` (plain and the same two drafters), one speculative
//! server shared by `measure` and `regenerate`. Speed is meaningless through the stand-in and
//! never looked at.

mod common;
#[path = "common/engine.rs"]
mod engine;
#[path = "common/proxy.rs"]
mod proxy;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{aerie, aerie_cmd, kill_once_a_record_is_durable, ok, ok_json, s};
use engine::{
    Engine, EngineServer, assets_dir, engine_python, fixture_drafter, python_dir, sglang_engine_args,
    sglang_engine_args_sized_by_aerie, sglang_env, target_and_prompts,
};
use serde_json::{Value, json};

/// A copy of the fixture drafter that reads other aux layers than SGLang's default ones:
/// `eagle_aux_hidden_state_layer_ids` [2, 13, 25] instead of [1, 14, 26] (which equal SGLang's
/// defaults for a 30-layer target). Its drafts are worse, but they are the same drafts in every
/// engine only if every engine reads the layers the same way.
fn moved_layers_drafter(dir: &Path) -> PathBuf {
    let out = dir.join("drafter-moved-layers");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(fixture_drafter().join("model.safetensors"), out.join("model.safetensors")).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_drafter().join("config.json")).unwrap()).unwrap();
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = json!([2, 13, 25]);
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    out
}

/// The command lines of the engines aerie started under `dir` (each run's `engine.json`).
fn engine_commands(dir: &Path) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(engine_commands(&path));
        } else if path.file_name().is_some_and(|n| n == "engine.json") {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            out.push(v["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect());
        }
    }
    out
}

/// SGLang's own counts for the prompts of `prompts` (first turns, as `aerie measure` sends them),
/// asked by the test itself: each prompt unstreamed through the chat endpoint with
/// `return_meta_info`, Σ `spec_verify_ct` and Σ `spec_num_correct_drafts` of the responses.
fn raw_sglang_counts(url: &str, prompts: &Path, max_tokens: usize) -> (u64, u64) {
    let agent = ureq::Agent::new_with_defaults();
    let (mut cycles, mut accepted) = (0, 0);
    for line in std::fs::read_to_string(prompts).unwrap().lines() {
        let p: Value = serde_json::from_str(line).unwrap();
        let body = json!({"model": "target", "messages": [{"role": "user", "content": p["prompt"]}],
            "max_tokens": max_tokens, "temperature": 0, "return_meta_info": true});
        let r: Value =
            agent.post(&format!("{url}/v1/chat/completions")).send_json(body).unwrap().body_mut().read_json().unwrap();
        let meta = &r["choices"][0]["meta_info"];
        println!("SGLang's meta_info: {meta}");
        cycles += meta["spec_verify_ct"].as_u64().unwrap_or_else(|| panic!("spec_verify_ct in {r}"));
        accepted +=
            meta["spec_num_correct_drafts"].as_u64().unwrap_or_else(|| panic!("spec_num_correct_drafts in {r}"));
    }
    (cycles, accepted)
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().expect("an id list").iter().map(|x| x.as_u64().expect("an integer id")).collect()
}

/// The stand-in kernels against their references, the launcher's seam and the capture engine's
/// seam check (`check_api()` finds every name it uses) in the real SGLang
/// (python/tests/test_sgl_kernel_standin.py, test_aerie_serve_sglang.py, test_sglang_pure.py), in
/// SGLang's venv.
#[test]
fn sglang_test_kernels_and_launcher_pass_their_checks_in_sglangs_venv() {
    let Some(python) =
        engine_python(Engine::Sglang, "sglang_test_kernels_and_launcher_pass_their_checks_in_sglangs_venv")
    else {
        return;
    };
    let mut c = Command::new(&python);
    sglang_env(&mut c).current_dir(python_dir().join("tests")).args([
        "-m",
        "unittest",
        "-v",
        "test_sgl_kernel_standin",
        "test_aerie_serve_sglang",
        "test_sglang_pure",
    ]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python unittest failed:\n{err}");
    assert!(!err.contains("skipped"), "nothing may be skipped where SGLang is installed:\n{err}");
    println!("{}", err.lines().filter(|l| l.starts_with("Ran ")).collect::<String>());
}

#[test]
fn eval_serve_and_compare_in_sglang_match_aerie_and_feed_measure_and_regenerate() {
    let Some(python) =
        engine_python(Engine::Sglang, "eval_serve_and_compare_in_sglang_match_aerie_and_feed_measure_and_regenerate")
    else {
        return;
    };
    let t_all = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (target, prompts) = target_and_prompts(dir.path(), 4);
    let fixture = fixture_drafter();
    let moved = moved_layers_drafter(dir.path());

    // The speculators layout: SGLang refuses it at start (its draft config goes through
    // transformers' AutoConfig, which needs the `model_type` that layout lacks), and `inspect
    // --engine sglang` says so as an error; the SGLang layout inspects clean.
    let speculators = dir.path().join("drafter-speculators");
    ok(aerie(&["export", s(&fixture), "--to", "speculators", "--target", s(&target), "--out", s(&speculators)]));
    let spec_draft = |drafter: &Path| -> Vec<String> {
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", s(drafter)]
            .into_iter()
            .chain([
                "--speculative-num-steps",
                "2",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "3",
            ])
            .map(str::to_owned)
            .collect()
    };
    let args = spec_draft(&speculators);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    let refused = EngineServer::try_start(Engine::Sglang, &python, &target, dir.path(), "sglang-speculators", &args);
    let log = std::fs::read_to_string(dir.path().join("sglang-speculators.log")).unwrap_or_default();
    assert!(refused.is_err(), "SGLang loaded the speculators layout: inspect --engine sglang must say what it does");
    assert!(log.contains("Should have a `model_type` key"), "SGLang's refusal, as inspect quotes it:\n{log}");
    println!("SGLang refused the speculators layout in {:.0} s", t0.elapsed().as_secs_f64());
    let insp = aerie(&["inspect", s(&speculators), "--target", s(&target), "--engine", "sglang"]);
    let text = String::from_utf8_lossy(&insp.stdout);
    assert_eq!(insp.status.code(), Some(2), "a refusal is an error, without --strict: {text}");
    assert!(text.contains("Error[layout-engine]") && text.contains("refuses"), "{text}");
    assert!(text.contains("Should have a `model_type` key"), "{text}");
    let clean = aerie(&["inspect", s(&fixture), "--target", s(&target), "--engine", "sglang", "--strict"]);
    assert_eq!(clean.status.code(), Some(0), "{}", String::from_utf8_lossy(&clean.stdout));

    // eval serve: plain, then each drafter at k = 2, beside aerie's own decoder (f32 everywhere).
    let work = dir.path().join("serve");
    let t0 = Instant::now();
    let mut c = aerie_cmd();
    sglang_env(&mut c)
        .args(["eval", "serve", "--engine", "sglang", "--python", s(&python), "--target", s(&target)])
        .args(["--prompts", s(&prompts), "--drafter", s(&fixture), "--drafter", s(&moved)])
        .args(["--names", "fixture,moved-layers", "--k", "2", "--max-new-tokens", "32", "--predict"])
        .args(["--workdir", s(&work), "--json"])
        .args(sglang_engine_args());
    let v = ok_json(c.output().unwrap());
    println!("eval serve in SGLang in {:.0} s: {v}", t0.elapsed().as_secs_f64());
    assert_eq!(v["engine"], "sglang");
    assert_eq!(v["engine_version"], "0.5.23");
    // Issue 44 §2: `--device cpu` among the engine arguments: aerie served it in f32.
    assert_eq!(v["dtype"], "float32");
    assert_eq!(v["answers"], 4);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        let tau = r["tau"].as_f64().unwrap();
        assert!(tau > 1.0, "SGLang accepted drafts: {r}");
        assert_eq!(
            r["greedy_identical"], r["answers"],
            "greedy speculation changed an answer: {}",
            r["first_difference"]
        );
        assert_eq!(r["accept_rate_unconditional"].as_array().unwrap().len(), 2);
        let measured = common::check_profile(&r["profile"], 2, r["drafts"].as_u64().unwrap());
        println!("SGLang τ by output position measured: {measured}: {}", r["profile"]);
        // The same drafts, accepted the same way: SGLang's accounting equals aerie's decoder.
        let p = &r["prediction"];
        let (pred, diff) = (p["tau"].as_f64().unwrap(), p["tau_difference"].as_f64().unwrap());
        println!("{}: τ in SGLang {tau:.4}, aerie's decoder {pred:.4}", r["drafter"]);
        assert!(diff.abs() <= 1e-9, "τ in SGLang {tau} vs aerie's decoder {pred} for {}", r["drafter"]);
        assert_eq!(p["greedy_identical"], true);
    }
    // The moved layers are read where aerie reads them (output of layer i = SGLang's capture at
    // i + 1), or τ could not equal aerie's above; and they are other drafts than the fixture's.
    assert_ne!(runs[0]["tau"], runs[1]["tau"], "a drafter reading other layers drafts otherwise");
    let tau_serve = runs[0]["tau"].as_f64().unwrap();

    // compare --engine sglang: the same two candidates ranked by SGLang's measurement, with
    // SGLang's τ for each, equal to eval serve's on the same prompts. Its engines run on aerie's
    // own KV-cache sizing (`aerie_engine::kv::KvCache::for_run`: one conversation of the default
    // --max-model-len 4096, × 1.25 = 5120 tokens), with no `--max-total-tokens` of the test's
    // (issue 44 §2.4).
    let report = dir.path().join("compare");
    let mut c = aerie_cmd();
    sglang_env(&mut c)
        .args(["compare", s(&moved), s(&fixture), "--names", "moved-layers,fixture", "--engine", "sglang"])
        .args(["--python", s(&python), "--target", s(&target), "--prompts", s(&prompts), "--k", "2"])
        .args(["--max-new-tokens", "32", "--out", s(&report), "--json"])
        .args(["--workdir", s(&dir.path().join("compare-work"))])
        .args(sglang_engine_args_sized_by_aerie());
    let cmp = ok_json(c.output().unwrap());
    let started = engine_commands(&dir.path().join("compare-work"));
    assert_eq!(started.len(), 3, "plain and two drafters: {started:?}");
    for command in &started {
        let sizes: Vec<&str> =
            command.windows(2).filter(|w| w[0] == "--max-total-tokens").map(|w| w[1].as_str()).collect();
        assert_eq!(sizes, ["5120"], "aerie's KV sizing alone: {command:?}");
    }
    println!("compare in SGLang: {cmp}");
    let rows = cmp["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{cmp}");
    // Ranked by SGLang's measured speedup (speeds through the stand-in are noise, so the order is
    // checked against the measurement, not against τ).
    let speedups: Vec<f64> = rows.iter().map(|r| r["measured_speedup"].as_f64().unwrap()).collect();
    assert!(speedups[0] >= speedups[1] && speedups[1] > 0.0, "{cmp}");
    for r in rows {
        let name = r["name"].as_str().unwrap();
        let served = runs.iter().find(|x| x["drafter"] == name).unwrap_or_else(|| panic!("{name} in {runs:?}"));
        let (a, b) = (r["tau"].as_f64().unwrap(), served["tau"].as_f64().unwrap());
        println!("compare in SGLang: {name} τ {a:.4} (eval serve {b:.4}), measured speedup {}", r["measured_speedup"]);
        assert!((a - b).abs() <= 1e-9, "{name}: compare's τ {a} is eval serve's {b} on the same prompts");
    }
    assert!(report.join("compare.md").is_file() && report.join("compare.parquet").is_file());

    // The cost surface apart from the drafter (issue 46 §1): SGLang told to accept 2 tokens per
    // cycle (SGLANG_SIMULATE_ACC_LEN, which its CPU path honours), k 1,2 × concurrency 1,2 on
    // two prompts: the cycle at τ 2 with any drafter, the costs file with the surface, its picture.
    let costs = dir.path().join("sglang-surface.toml");
    let heatmap = dir.path().join("sglang-surface.png");
    let t0 = Instant::now();
    let mut c = aerie_cmd();
    sglang_env(&mut c)
        .args(["eval", "serve", "--engine", "sglang", "--python", s(&python), "--target", s(&target)])
        .args(["--prompts", s(&prompts), "--max-prompts", "2", "--drafter", s(&fixture), "--names", "fixture"])
        .args(["--k", "1,2", "--concurrency", "1,2", "--max-new-tokens", "16", "--simulate-accept-length", "2"])
        .args(["--costs-out", s(&costs), "--heatmap", s(&heatmap), "--json"])
        .args(["--workdir", s(&dir.path().join("surface-work"))])
        .args(sglang_engine_args());
    let sim = ok_json(c.output().unwrap());
    println!("the simulated surface in SGLang in {:.0} s: {sim}", t0.elapsed().as_secs_f64());
    assert_eq!(sim["simulated_accept_length"], 2.0);
    let sim_runs = sim["runs"].as_array().unwrap();
    assert_eq!(sim_runs.len(), 2, "{sim}");
    for r in sim_runs {
        for cell in r["cells"].as_array().unwrap() {
            // Every cycle accepted exactly one draft: τ is the simulation's, not the fixture's 1.3.
            let tau = cell["tau"].as_f64().unwrap();
            assert!((tau - 2.0).abs() < 1e-9, "SGLang simulated τ 2: {cell}");
            assert_eq!(cell["simulated_accept_length"], 2.0);
            assert!(cell["cycle_ms"].as_f64().unwrap() > 0.0, "{cell}");
        }
        assert_eq!(r["cells"].as_array().unwrap().len(), 2, "concurrency 1 and 2: {r}");
    }
    let text = std::fs::read_to_string(&costs).unwrap();
    println!("the simulated cost surface in SGLang:\n{text}");
    assert!(text.contains("simulated_accept_length = 2.0") && text.contains("concurrency = 2"), "{text}");
    assert!(std::fs::metadata(&heatmap).unwrap().len() > 1000);
    let at2 = ok_json(aerie(&["project", "--costs", s(&costs), "--concurrency", "2", "--json"]));
    assert_eq!(at2["break_even"].as_array().unwrap().len(), 2, "k 1 and 2 at concurrency 2: {at2}");

    // One speculative server for measure and regenerate.
    let mut spec_args = spec_draft(&fixture);
    spec_args.extend(["--served-model-name".to_owned(), "target".to_owned()]);
    let spec_args: Vec<&str> = spec_args.iter().map(String::as_str).collect();
    let server = EngineServer::start(Engine::Sglang, &python, &target, dir.path(), "sglang-eagle3", &spec_args);

    // measure: SGLang detected, streamed by default (SGLang refuses return_meta_info on a stream),
    // τ by the one convention, equal to eval serve's.
    let measure = |more: &[&str]| {
        let base = ["measure", "--server", &server.url, "--prompts", s(&prompts), "--model", "target"];
        ok_json(aerie(&[&base[..], &["--max-new-tokens", "32", "--json"], more].concat()))
    };
    let m = measure(&[]);
    println!("aerie measure: {m}");
    assert_eq!(m["api"], "sglang");
    assert_eq!(m["stream"], true);
    assert_eq!(m["speculative"], true);
    assert_eq!(m["steps"], 2);
    let tau_m = m["tau"].as_f64().unwrap();
    assert!((tau_m - tau_serve).abs() <= 1e-9, "measure τ {tau_m} vs eval serve τ {tau_serve}");
    // τ against SGLang's raw verify counts (issue 44 §2.1), read by this test from SGLang's own
    // unstreamed responses to the same requests: Σ spec_verify_ct and Σ spec_num_correct_drafts.
    let (raw_cycles, raw_accepted) = raw_sglang_counts(&server.url, &prompts, 32);
    println!("SGLang's raw counts: {raw_cycles} verify cycles, {raw_accepted} drafts accepted; measure τ {tau_m}");
    assert_eq!(m["spec_verify_ct"].as_u64(), Some(raw_cycles), "{m}");
    assert_eq!(m["accepted_drafts"].as_u64(), Some(raw_accepted), "{m}");
    let tau_raw = 1.0 + raw_accepted as f64 / raw_cycles as f64;
    assert!((tau_m - tau_raw).abs() <= 1e-12, "measure τ {tau_m} vs SGLang's raw counts' {tau_raw}");
    let hist: u64 = m["accept_histogram"].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).sum();
    assert_eq!(hist, raw_cycles, "the histogram counts SGLang's verify cycles: {m}");
    // Scoped to this run: each response's own statistics, not the server's running averages.
    assert!(m["counted"].as_str().unwrap().contains("each response's own"), "{m}");
    assert!(m["tokens_per_verify"].as_f64().unwrap() > tau_m, "completion / verify counts the first tokens too");
    assert!(m["itl_ms"].as_f64().unwrap() > 0.0 && m["implied_cycle_ms"].as_f64().unwrap() > 0.0);
    common::check_profile(&m["profile"], 2, m["spec_verify_ct"].as_u64().unwrap());
    let unstreamed = measure(&["--no-stream"]);
    assert_eq!(unstreamed["spec_verify_ct"], m["spec_verify_ct"], "the same prompts, the same cycles");
    assert_eq!(unstreamed["tau"], m["tau"]);
    // SGLang's own `/generate` (raw text, streamed): other prompts, the same accounting.
    let generate = measure(&["--endpoint", "generate"]);
    assert_eq!((&generate["speculative"], &generate["steps"]), (&json!(true), &json!(2)), "{generate}");
    assert!(generate["tau"].as_f64().unwrap() > 1.0, "{generate}");
    let (g_cycles, g_accepted) = (generate["spec_verify_ct"].as_f64().unwrap(), generate["accepted_drafts"].as_f64());
    let g_tau = 1.0 + g_accepted.expect("SGLang's spec_num_correct_drafts") / g_cycles;
    assert!((generate["tau"].as_f64().unwrap() - g_tau).abs() <= 1e-12, "τ from the raw counts: {generate}");
    assert_eq!(generate["accept_rate_unconditional"].as_array().map(Vec::len), Some(2), "{generate}");

    // regenerate --api sglang through a logging pass-through: ids in, ids out, each answer SGLang's
    // own greedy answer for the same ids; kill -9 and rerun byte-identical.
    let mt = dir.path().join("mt.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(assets_dir().join("mtbench/question.jsonl"))
        .unwrap()
        .lines()
        .take(2)
        .map(str::to_owned)
        .collect();
    std::fs::write(&mt, lines.join("\n") + "\n").unwrap();
    let (proxy_url, log_all) = proxy::start_proxy(server.port);
    let log = log_all.clone();
    let regen = |url: &str, out: &Path, extra: &[&str]| {
        let mut c = aerie_cmd();
        c.args(["regenerate", "--server", url, "--tokenizer", s(&target), "--data", s(&mt), "--out", s(out)])
            .args(["--max-new-tokens", "24", "--json"])
            .args(extra);
        if !extra.contains(&"--concurrency") {
            c.args(["--concurrency", "1"]);
        }
        c
    };
    let a = dir.path().join("a.jsonl");
    let report = ok_json(regen(&proxy_url, &a, &["--api", "sglang", "--concurrency", "2"]).output().unwrap());
    assert_eq!(report["records"], 2, "{report}");
    assert_eq!(report["server"]["api"], "sglang");
    assert_eq!(report["turns_regenerated"], 4);
    let ends = report["stopped_by_eos"].as_u64().unwrap() + report["stopped_by_max_new_tokens"].as_u64().unwrap();
    assert_eq!(ends, 4, "{report}");
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 4, "two records of two turns: {log:?}");
    // A second turn's prompt continues the first turn's (aerie renders the conversation with the
    // earlier answer, decoded from SGLang's output ids, and tokenises it again: the rendered text
    // of turn 1 is a prefix of turn 2's and ends at a token boundary, `assistant\n`).
    let continued = log
        .iter()
        .filter(|(_, q2, _)| {
            log.iter().any(|(_, q1, _)| {
                let (p1, p2) = (ids(&q1["input_ids"]), ids(&q2["input_ids"]));
                p2.len() > p1.len() && p2.starts_with(&p1)
            })
        })
        .count();
    assert_eq!(continued, 2, "each record's second turn continues its first");
    let agent = ureq::Agent::new_with_defaults();
    for (path, req, resp) in &log {
        assert_eq!(path, "/generate");
        assert!(req["input_ids"].is_array() && req.get("text").is_none(), "ids in: {req}");
        let got = ids(&resp["output_ids"]);
        // SGLang's own greedy answer to the same ids: no aerie option but the length.
        let own: Value = agent
            .post(&format!("{}/generate", server.url))
            .send_json(json!({"input_ids": req["input_ids"], "sampling_params": {
                "max_new_tokens": req["sampling_params"]["max_new_tokens"], "temperature": 0}}))
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap();
        let own = ids(&own["output_ids"]);
        assert_eq!(got, own, "SGLang's answer to aerie's request equals its own greedy answer");
    }
    let text = std::fs::read_to_string(&a).unwrap();
    let b = dir.path().join("b.jsonl");
    let rb = ok_json(regen(&server.url, &b, &[]).output().unwrap());
    assert_eq!((rb["server"]["api"].as_str(), rb["server"]["api_source"].as_str()), (Some("sglang"), Some("detected")));
    assert_eq!(std::fs::read_to_string(&b).unwrap(), text);
    let c = dir.path().join("c.jsonl");
    kill_once_a_record_is_durable(regen(&server.url, &c, &["--api", "sglang"]), &c);
    let rc = ok_json(regen(&server.url, &c, &["--api", "sglang"]).output().unwrap());
    assert!(rc["resumed_records"].as_u64().unwrap() >= 1, "{rc}");
    assert_eq!(std::fs::read_to_string(&c).unwrap(), text, "resumed file differs from the uninterrupted one");
    // Sampling: SGLang takes aerie's options and its per-turn sampling_seed.
    let sampled = dir.path().join("sampled.jsonl");
    let n = log_all.lock().unwrap().len();
    let flags = ["--temperature", "0.7", "--top-p", "0.9", "--seed", "3", "--max-samples", "1"];
    ok_json(regen(&proxy_url, &sampled, &flags).output().unwrap());
    let q = log_all.lock().unwrap()[n].1.clone();
    assert!(q["sampling_params"]["sampling_seed"].as_u64().is_some(), "{q}");
    assert!((q["sampling_params"]["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6, "{q}");
    drop(server);
    println!("SGLang end to end in {:.0} s", t_all.elapsed().as_secs_f64());
}
