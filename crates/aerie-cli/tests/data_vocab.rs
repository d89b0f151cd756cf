//! End-to-end runs of `aerie data prepare` and `aerie vocab build` on a small ShareGPT file cut
//! mid-record, with a tiny byte-level tokenizer written by the test: the JSON reports, the
//! files, the truncation warning, and the refusal to replace a drafter's mapping.

mod common;
use std::path::Path;

use common::{aerie, ok_json};
use serde_json::json;

/// A byte-level BPE tokenizer without merges (ids 0-255 are the bytes in GPT-2's printable
/// alphabet) plus the ChatML special tokens at 256 and 257.
fn write_tokenizer(dir: &Path) {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut vocab = serde_json::Map::new();
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if printable.contains(&b) {
            char::from_u32(b).unwrap()
        } else {
            printable.push(b);
            extra += 1;
            char::from_u32(255 + extra).unwrap()
        };
        vocab.insert(c.to_string(), json!(b));
    }
    let special = |id: u32, s: &str| {
        json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(256, "<|im_start|>"), special(257, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    });
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), json!({"eos_token": "<|im_end|>"}).to_string()).unwrap();
}

#[test]
fn prepare_then_build_the_draft_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tok = root.join("tok");
    write_tokenizer(&tok);
    let recs: Vec<String> = (0..50)
        .map(|i| {
            json!({"id": format!("c{i}"), "conversations": [
                {"from": "human", "value": format!("question {i}")},
                {"from": "gpt", "value": format!("answer {}", i % 5)}]})
            .to_string()
        })
        .collect();
    let text = format!("[{}, {{\"id\": \"cut\", \"conv", recs.join(", "));
    let data = root.join("sharegpt.json");
    std::fs::write(&data, &text).unwrap();
    let out = root.join("prepared");
    let (d, t, o) = (data.to_str().unwrap(), tok.to_str().unwrap(), out.to_str().unwrap());

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
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tok = root.join("tok");
    write_tokenizer(&tok);
    let recs: Vec<String> = (0..3)
        .map(|i| {
            json!({"id": format!("c{i}"), "conversations": [
                {"from": "human", "value": format!("question {i}")},
                {"from": "gpt", "value": format!("answer {i}")}]})
            .to_string()
        })
        .collect();
    let data = root.join("sharegpt.json");
    std::fs::write(&data, format!("[{}]", recs.join(", "))).unwrap();
    let out = root.join("prepared");
    let (d, t, o) = (data.to_str().unwrap(), tok.to_str().unwrap(), out.to_str().unwrap());
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
