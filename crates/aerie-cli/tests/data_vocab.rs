//! End-to-end runs of `aerie data prepare` and `aerie vocab build` on a small ShareGPT file cut
//! mid-record, with a tiny byte-level tokenizer written by the test: the JSON reports, the
//! files, the truncation warning, and the refusal to replace a drafter's mapping.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::PathBuf;

use common::{aerie, ok_json, s};
use serde_json::json;

/// A scratch directory holding the fixture's byte-level tokenizer in `tok/` (its config names
/// the eos only: no chat template) and `text` as `sharegpt.json`: (dir, data, tokenizer, out),
/// `out` being `prepared/`, not yet written.
fn inputs(text: &str) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("tok");
    fixture::write_tokenizer_json(&tok);
    std::fs::write(tok.join("tokenizer_config.json"), json!({"eos_token": "<|im_end|>"}).to_string()).unwrap();
    let data = dir.path().join("sharegpt.json");
    std::fs::write(&data, text).unwrap();
    let out = dir.path().join("prepared");
    (dir, data, tok, out)
}

/// `n` one-exchange ShareGPT records `c{i}` as JSON text: "question {i}", "answer {i % answers}".
fn sharegpt_records(n: usize, answers: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            json!({"id": format!("c{i}"), "conversations": [
                {"from": "human", "value": format!("question {i}")},
                {"from": "gpt", "value": format!("answer {}", i % answers)}]})
            .to_string()
        })
        .collect()
}

#[test]
fn prepare_then_build_the_draft_vocabulary() {
    let recs = sharegpt_records(50, 5);
    let (dir, data, tok, out) = inputs(&format!("[{}, {{\"id\": \"cut\", \"conv", recs.join(", ")));
    let root = dir.path();
    let (d, t, o) = (s(&data), s(&tok), s(&out));

    // No template in the tokenizer: auto fails and names the built-ins.
    let fail = aerie(&["data", "prepare", "--data", d, "--tokenizer", t, "--out", o]);
    assert!(!fail.status.success());
    let err = String::from_utf8_lossy(&fail.stderr);
    assert!(err.contains("no chat template") && err.contains("chatml"), "{err}");

    let args = ["data", "prepare", "--data", d, "--tokenizer", t, "--out", o, "--template", "chatml"];
    let prepared = aerie(&[&args[..], &["--split", "eval=0.1", "--json"]].concat());
    let stderr = String::from_utf8_lossy(&prepared.stderr).into_owned();
    let report = ok_json(prepared);
    assert!(stderr.contains("warning:") && stderr.contains("50 complete records"), "{stderr}");
    assert_eq!(report["format"], "aerie-prepared/1");
    assert_eq!(report["samples"], 50);
    assert_eq!(report["vocab_size"], 258);
    assert_eq!(report["read"]["truncated"]["complete_records"], 50);
    assert!(report["splits"]["eval"]["samples"].as_u64().unwrap() > 0);
    for f in ["train.parquet", "eval.parquet", "report.json"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    // A second run into the same directory is refused without --overwrite.
    let again = aerie(&args);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a prepared dataset"));

    let vocab = root.join("vocab.safetensors");
    let v = vocab.to_str().unwrap();
    let built = ok_json(aerie(&["vocab", "build", o, "--draft-vocab", "32", "--out", v, "--json"]));
    assert_eq!(built["source"], "built");
    assert_eq!(built["draft_vocab_size"], 32);
    assert_eq!(built["coverage"], 1.0);
    assert!(root.join("vocab.json").is_file());

    // Keeping that mapping works; asking for another size with it is refused.
    let kept_out = root.join("kept.safetensors");
    let k = kept_out.to_str().unwrap();
    let kept = ok_json(aerie(&["vocab", "build", o, "--keep-from", v, "--out", k, "--split", "eval", "--json"]));
    assert_eq!(kept["source"], "kept");
    assert_eq!(kept["draft_vocab_size"], 32);
    let refused = aerie(&["vocab", "build", o, "--keep-from", v, "--draft-vocab", "16", "--out", k]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("must keep its mapping"));
}

#[test]
fn data_show_marks_the_trained_tokens() {
    let recs = sharegpt_records(3, 3);
    let (_dir, data, tok, out) = inputs(&format!("[{}]", recs.join(", ")));
    let (d, t, o) = (s(&data), s(&tok), s(&out));
    let report = ok_json(aerie(&[
        "data",
        "prepare",
        "--data",
        d,
        "--tokenizer",
        t,
        "--out",
        o,
        "--template",
        "chatml",
        "--json",
    ]));
    assert_eq!(report["samples_per_mode"], json!({"conversation": 3}));

    // Not a terminal: brackets around each run of trained tokens, history unmarked.
    let shown = common::ok(aerie(&["data", "show", o, "--sample", "1"]));
    assert!(shown.starts_with("== sample 1 (source c1):"), "{shown}");
    assert!(
        shown.contains("<|im_start|>user\nquestion 1<|im_end|>\n<|im_start|>assistant\n[[answer 1<|im_end|>]]\n"),
        "{shown}"
    );
    assert_eq!(shown.matches("[[").count(), 1, "{shown}");
    let two = common::ok(aerie(&["data", "show", o, "--limit", "2"]));
    assert_eq!(two.matches("== sample").count(), 2, "{two}");
    let missing = aerie(&["data", "show", o, "--sample", "99"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no sample 99"));
}
