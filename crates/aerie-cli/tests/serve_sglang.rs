//! aerie against the real SGLang (0.5.23, python/requirements-sglang.txt; helpers in
//! `common/sglang.rs`) on the CPU, serving the quickstart's SmolLM2-135M imported from the assets'
//! GGUF, with the trained fixture drafter (`tests/fixtures/smollm2-135m-eagle3`, τ ≈ 1.35).
//!
//! Through `$AERIE_SGLANG_PYTHON` (skipped with a note when unset or without SGLang, failing when
//! `CI=true`). SGLang's CPU attention comes from the test-only `sgl_kernel` stand-in
//! (python/tests/sglang_cpu): everything else is SGLang's own, its EAGLE-3 worker and acceptance
//! accounting included. Each start costs 50-115 s on two cores, so the tests start as few as they
//! can: one `eval serve` (plain and two drafters), one speculative server shared by `measure` and
//! `regenerate`. Speed is meaningless through the stand-in and never looked at.

mod common;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "common/sglang.rs"]
mod sglang;
#[path = "common/vllm.rs"]
mod vllm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{aerie, aerie_cmd, kill_once_a_record_is_durable, ok, ok_json, s};
use serde_json::{Value, json};
use sglang::{SglangServer, cpu_engine_args, sglang_env, sglang_python};
use vllm::{assets_dir, python_dir, smollm2};

/// The fixture drafter, in the SGLang layout aerie trains and exports by default.
fn fixture_drafter() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2-135m-eagle3")
}

/// The target (imported from the cached GGUF) and a prompt file of `n` MT-Bench first turns.
fn target_and_prompts(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    let target = smollm2(dir);
    ok(aerie(&["assets", "fetch", "mtbench"]));
    let questions = std::fs::read_to_string(assets_dir().join("mtbench/question.jsonl")).unwrap();
    let prompts = dir.join("prompts.jsonl");
    let lines: Vec<String> = questions
        .lines()
        .take(n)
        .map(|l| {
            let q: Value = serde_json::from_str(l).unwrap();
            json!({"id": q["question_id"], "prompt": q["turns"][0]}).to_string()
        })
        .collect();
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    (target, prompts)
}

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

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().expect("an id list").iter().map(|x| x.as_u64().expect("an integer id")).collect()
}

/// The stand-in kernels against their references, and the launcher's seam in the real SGLang
/// (python/tests/test_sgl_kernel_standin.py, test_aerie_serve_sglang.py), in SGLang's venv.
#[test]
fn sglang_test_kernels_and_launcher_pass_their_checks_in_sglangs_venv() {
    let Some(python) = sglang_python("sglang_test_kernels_and_launcher_pass_their_checks_in_sglangs_venv") else {
        return;
    };
    let mut c = Command::new(&python);
    sglang_env(&mut c).current_dir(python_dir().join("tests")).args([
        "-m",
        "unittest",
        "-v",
        "test_sgl_kernel_standin",
        "test_aerie_serve_sglang",
    ]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python unittest failed:\n{err}");
    assert!(!err.contains("skipped"), "nothing may be skipped where SGLang is installed:\n{err}");
    println!("{}", err.lines().filter(|l| l.starts_with("Ran ")).collect::<String>());
}

#[test]
fn eval_serve_in_sglang_matches_aerie_and_feeds_measure_and_regenerate() {
    let Some(python) = sglang_python("eval_serve_in_sglang_matches_aerie_and_feeds_measure_and_regenerate") else {
        return;
    };
    let t_all = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (target, prompts) = target_and_prompts(dir.path(), 4);
    let fixture = fixture_drafter();
    let moved = moved_layers_drafter(dir.path());

    // eval serve: plain, then each drafter at k = 2, beside aerie's own decoder (f32 everywhere).
    let work = dir.path().join("serve");
    let t0 = Instant::now();
    let mut c = aerie_cmd();
    sglang_env(&mut c)
        .args(["eval", "serve", "--engine", "sglang", "--python", s(&python), "--target", s(&target)])
        .args(["--prompts", s(&prompts), "--drafter", s(&fixture), "--drafter", s(&moved)])
        .args(["--names", "fixture,moved-layers", "--k", "2", "--max-new-tokens", "32", "--predict"])
        .args(["--workdir", s(&work), "--json"])
        .args(cpu_engine_args());
    let v = ok_json(c.output().unwrap());
    println!("eval serve in SGLang in {:.0} s: {v}", t0.elapsed().as_secs_f64());
    assert_eq!(v["engine"], "sglang");
    assert_eq!(v["engine_version"], "0.5.23");
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

    // One speculative server for measure and regenerate.
    let spec_args = [
        "--served-model-name",
        "target",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        s(&fixture),
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
    ];
    let server = SglangServer::start(&python, &target, dir.path(), "sglang-eagle3", &spec_args);

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
    assert_eq!(m["tau"], m["tau_from_histogram"]);
    assert!(m["tokens_per_verify"].as_f64().unwrap() > tau_m, "completion / verify counts the first tokens too");
    assert!(m["itl_ms"].as_f64().unwrap() > 0.0 && m["implied_cycle_ms"].as_f64().unwrap() > 0.0);
    let unstreamed = measure(&["--no-stream"]);
    assert_eq!(unstreamed["spec_verify_ct"], m["spec_verify_ct"], "the same prompts, the same cycles");
    assert_eq!(unstreamed["tau"], m["tau"]);

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
    let (proxy_url, log) = proxy::start_proxy(server.port);
    let regen = |url: &str, out: &Path, extra: &[&str]| {
        let mut c = aerie_cmd();
        c.args(["regenerate", "--server", url, "--tokenizer", s(&target), "--data", s(&mt), "--out", s(out)])
            .args(["--max-new-tokens", "24", "--concurrency", "1", "--json"])
            .args(extra);
        c
    };
    let a = dir.path().join("a.jsonl");
    let report = ok_json(regen(&proxy_url, &a, &["--api", "sglang"]).output().unwrap());
    assert_eq!(report["records"], 2, "{report}");
    assert_eq!(report["server"]["api"], "sglang");
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 4, "two records of two turns: {log:?}");
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
    drop(server);
    println!("SGLang end to end in {:.0} s", t_all.elapsed().as_secs_f64());
}
