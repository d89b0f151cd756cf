//! `aerie doctor` end to end against loopback servers that answer with SGLang 0.5.23's recorded
//! bodies (`crates/aerie-engine/tests/fixtures/doctor`) or as vLLM does: the engine detected, the
//! human and JSON reports, the exit code (2 on an error finding), what could not be read, and the
//! local command line found through `/proc` by the listening port. And once against the real
//! SGLang (0.5.23 on the CPU, `$AERIE_SGLANG_PYTHON`, skipped with a note when unset): started
//! with `--speculative-algorithm EAGLE` and the EAGLE-3 fixture drafter, it is flagged.

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;

use common::{aerie, s};
use engine::{Engine, EngineServer, doctor_errors, engine_python, fixture_drafter};
use serde_json::Value;

fn fixture(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../aerie-engine/tests/fixtures/doctor");
    std::fs::read_to_string(dir.join(name)).unwrap()
}

fn drafter() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2-135m-eagle3")
}

/// A loopback server answering `routes` (path → body, 200) and 404 otherwise; its base URL.
fn serve(routes: Vec<(&'static str, String)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { break };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            let (status, body) = routes
                .iter()
                .find(|r| r.0 == path)
                .map_or((404, r#"{"detail": "Not Found"}"#.to_string()), |r| (200, r.1.clone()));
            let head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(body.as_bytes());
        }
    });
    url
}

fn sglang(server_info: &str) -> String {
    let model_info = fixture("llama.model_info.json");
    serve(vec![
        ("/server_info", fixture(server_info)),
        ("/model_info", model_info.clone()),
        ("/get_model_info", model_info),
    ])
}

#[test]
fn doctor_flags_eagle_with_an_eagle3_drafter_and_exits_2() {
    let url = sglang("sglang-cpu-eagle.server_info.json");
    let out = aerie(&["doctor", "--server", &url, "--drafter", s(&drafter())]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("ERROR [eagle-not-eagle3]"), "{text}");
    assert!(text.contains("fix:    restart the server with --speculative-algorithm EAGLE3"), "{text}");
    assert!(text.contains("sgl-project/sglang#21272"), "{text}");
    assert!(text.contains("sglang 0.5.23"), "{text}");

    // The correct configuration: exit 0, and the JSON report names what it read.
    let url = sglang("sglang-cpu-eagle3.server_info.json");
    let out = aerie(&["doctor", "--server", &url, "--drafter", s(&drafter()), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["server"]["algorithm"], "EAGLE3");
    assert_eq!(v["server"]["read"], serde_json::json!(["GET /server_info", "GET /model_info"]));
    assert!(v["findings"].as_array().unwrap().iter().all(|f| f["severity"] != "error" && f["severity"] != "warning"));

    // Without --drafter: the server's drafter path is not on this machine, and it says so.
    let out = aerie(&["doctor", "--server", &url, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let unread = v["server"]["unread"].as_array().unwrap();
    assert!(unread.iter().any(|u| u["what"].as_str().unwrap().contains("/drafters/smollm2-135m-eagle3")), "{unread:?}");
    assert!(v["not_checked"].as_array().unwrap().iter().any(|n| n["rule"] == "aux-ids-convention"));
}

#[test]
fn doctor_reads_vllm_and_says_what_it_could_not() {
    let url = serve(vec![
        (
            "/v1/models",
            r#"{"object": "list", "data": [{"id": "target", "root": "/models/t", "owned_by": "vllm"}]}"#.into(),
        ),
        ("/version", r#"{"version": "0.32.0"}"#.into()),
        ("/metrics", "# HELP x\nvllm:spec_decode_num_drafts_total{engine=\"0\"} 12.0\n".into()),
    ]);
    let out = aerie(&["doctor", "--server", &url, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let server = &v["server"];
    assert_eq!((server["engine"].as_str(), server["version"].as_str()), (Some("vllm"), Some("0.32.0")));
    assert_eq!(server["speculating"], true);
    // The port is held by this test process: its command line is found through /proc.
    let read: Vec<&str> = server["read"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    let me = format!("the command line of process {}", std::process::id());
    assert!(read.iter().any(|r| r.starts_with(&me)), "{read:?}");
    // The development /server_info is not served, and the report says so.
    let unread = server["unread"].as_array().unwrap();
    assert!(unread.iter().any(|u| u["what"].as_str().unwrap().contains("VLLM_SERVER_DEV_MODE")), "{unread:?}");
}

/// A 30-layer Llama target with the fixture drafter's shapes, config only: SGLang serves it with
/// random weights (`--load-format dummy`) and no tokenizer, enough for a server whose
/// configuration is under test (no assets to fetch).
fn dummy_target(dir: &std::path::Path) -> PathBuf {
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_drafter().join("config.json")).unwrap()).unwrap();
    let o = cfg.as_object_mut().unwrap();
    for key in
        ["eagle_config", "draft_vocab_size", "target_hidden_size", "norm_before_residual", "fc_norm", "norm_output"]
    {
        o.remove(key);
    }
    o.insert("architectures".into(), serde_json::json!(["LlamaForCausalLM"]));
    o.insert("num_hidden_layers".into(), 30.into());
    o.insert("torch_dtype".into(), "float32".into());
    let out = dir.join("target");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    out
}

#[test]
fn doctor_flags_a_real_sglang_started_with_eagle_for_an_eagle3_drafter() {
    let test = "doctor_flags_a_real_sglang_started_with_eagle_for_an_eagle3_drafter";
    let Some(python) = engine_python(Engine::Sglang, test) else { return };
    let dir = tempfile::tempdir().unwrap();
    let target = dummy_target(dir.path());
    let drafter = fixture_drafter();
    let server = EngineServer::start(
        Engine::Sglang,
        &python,
        &target,
        dir.path(),
        "sglang-eagle",
        &[
            "--load-format",
            "dummy",
            "--skip-tokenizer-init",
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-draft-model-path",
            s(&drafter),
            "--speculative-draft-load-format",
            "auto",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ],
    );
    // No --drafter: the server's own drafter is a directory here, and the doctor reads it.
    let out = aerie(&["doctor", "--server", &server.url, "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors = doctor_errors(&v);
    assert_eq!(errors, ["eagle-not-eagle3"], "{:#}", v["findings"]);
    let srv = &v["server"];
    assert_eq!((srv["version"].as_str(), srv["algorithm"].as_str()), (Some("0.5.23"), Some("EAGLE")));
    assert_eq!(srv["read"], serde_json::json!(["GET /server_info", "GET /model_info"]));
    assert_eq!(v["drafter"]["path"].as_str(), Some(s(&drafter)));
    println!("{}", String::from_utf8_lossy(&aerie(&["doctor", "--server", &server.url]).stdout));
}
