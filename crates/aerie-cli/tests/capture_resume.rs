//! `aerie capture` killed with SIGKILL (after its first shard is committed, and again at an
//! arbitrary moment of the rerun) and run again yields the dataset an uninterrupted capture
//! yields: the same samples in the same order, no duplicate, no gap, the same tensor bytes.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use aerie_data::shard::{ShardDataset, shard_file_name};
use common::{aerie_cmd, aerie_run, ok_json, s};
use serde_json::{Value, json};

/// Longer conversations than the fixture's default, so that each sample takes a while.
fn long_conversations(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let q = format!("Tell me about item {i}. ").repeat(4 + i % 5);
            let a = format!("Item {i} is a fine item, as items go. ").repeat(3 + i % 4);
            json!({"id": format!("c{i}"), "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]})
        })
        .collect()
}

fn assert_same_dataset(a: &Path, b: &Path) {
    let (a, b) = (ShardDataset::open(a).unwrap(), ShardDataset::open(b).unwrap());
    assert_eq!(a.len(), b.len(), "sample count");
    assert_eq!(a.num_tokens(), b.num_tokens());
    let mut ids = std::collections::HashSet::new();
    for i in 0..a.len() {
        let (x, y) = (a.sample(i).unwrap(), b.sample(i).unwrap());
        assert_eq!(x.sample_id(), y.sample_id(), "sample {i}: id");
        assert!(ids.insert(y.sample_id()), "sample {i}: duplicate id {:?}", y.sample_id());
        assert_eq!(x.input_ids(), y.input_ids(), "sample {i}: input ids");
        assert_eq!(x.loss_mask(), y.loss_mask(), "sample {i}: loss mask");
        assert_eq!(x.aux_hidden().as_bytes(), y.aux_hidden().as_bytes(), "sample {i}: aux_hidden bytes");
        assert_eq!(x.aux_hidden().scales_bytes(), y.aux_hidden().scales_bytes(), "sample {i}: aux_hidden scales");
        assert_eq!(
            x.final_hidden().map(|h| [h.as_bytes(), h.scales_bytes()].concat()),
            y.final_hidden().map(|h| [h.as_bytes(), h.scales_bytes()].concat()),
            "sample {i}: final_hidden bytes and scales"
        );
    }
    b.verify().unwrap();
}

#[test]
fn capture_killed_with_sigkill_resumes_to_the_uninterrupted_dataset() {
    killed_and_resumed("f32");
}

/// The same for a compact encoding (format 2: codes plus a scale per token and layer).
#[test]
fn fp8_capture_killed_with_sigkill_resumes_to_the_uninterrupted_dataset() {
    killed_and_resumed("fp8-e4m3");
}

fn killed_and_resumed(dtype: &str) {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, 128, 4, 21);
    let data = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&data, &long_conversations(48));
    let prepared = dir.path().join("prepared");
    ok_json(
        aerie_cmd()
            .args(["data", "prepare", "--data", s(&data), "--tokenizer", s(&target), "--out", s(&prepared), "--json"])
            .output()
            .unwrap(),
    );
    let flags = ["--aux-layers", "0,1,2", "--dtype", dtype, "--shard-tokens", "1500", "--json"];
    let capture = |out: &Path| aerie_run("capture", &target, &prepared, out, &flags);
    let t0 = Instant::now();
    let full = dir.path().join("full");
    let report = ok_json(capture(&full).output().unwrap());
    assert_eq!(report["captured_samples"], 48);
    let full_secs = t0.elapsed();

    // Kill once the first shard is committed.
    let out = dir.path().join("killed");
    let mut child = capture(&out).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let first = out.join(shard_file_name(0));
    let start = Instant::now();
    while !first.exists() {
        assert!(child.try_wait().unwrap().is_none(), "capture finished before it could be killed");
        assert!(start.elapsed() < Duration::from_secs(60), "no shard in 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Kill the rerun at an arbitrary moment (a third of an uninterrupted run's time).
    let mut child = capture(&out).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(full_secs / 3);
    let _ = child.kill();
    child.wait().unwrap();
    // The last run finishes the dataset.
    let report = ok_json(capture(&out).output().unwrap());
    let resumed = report["resumed_samples"].as_u64().unwrap();
    assert!(resumed > 0 && resumed < 48, "{report}");
    assert_eq!(resumed + report["captured_samples"].as_u64().unwrap(), 48);
    assert_same_dataset(&full, &out);
}
