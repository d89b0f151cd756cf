//! Batched generation on the real target and real prompts: SmolLM2-135M (imported from the
//! pinned GGUF asset) answering MT-Bench's first turns, whose rendered prompts range from a few
//! dozen to a few hundred tokens, so long and short prompts share one batch. Batch 12 (above the
//! 8 rows where the matmul switches kernel) gives every sequence the tokens batch 1 gives.
//!
//! Runs when the assets are cached (`aerie assets fetch smollm2 mtbench`) or under `CI=true`
//! (which fetches them); skipped with a note otherwise.

mod common;

use std::path::PathBuf;

use common::{aerie, ok, ok_json, s};

#[test]
fn batch_12_generates_the_batch_1_tokens_on_mt_bench() {
    let home = std::env::var_os("AERIE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/aerie"));
    let gguf = home.join("assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mtbench = home.join("assets/mtbench/question.jsonl");
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !(gguf.exists() && mtbench.exists()) {
        if !ci {
            println!("note: skipped: run `aerie assets fetch smollm2` and `aerie assets fetch mtbench` first");
            return;
        }
        ok(aerie(&["assets", "fetch", "smollm2"]));
        ok(aerie(&["assets", "fetch", "mtbench"]));
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("smollm2");
    ok(aerie(&["import", "gguf", s(&gguf), "--out", s(&target)]));
    let report = ok_json(aerie(&[
        "bench",
        "generate",
        "--target",
        s(&target),
        "--prompts",
        s(&mtbench),
        "--batch",
        "1,12",
        "--num-prompts",
        "12",
        "--max-new-tokens",
        "12",
        "--json",
    ]));
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["batch"], 12);
    assert_eq!(runs[1]["tokens"], 12 * 12, "eos is ignored: every sequence decodes its budget");
    assert_eq!(runs[1]["identical_to_batch_1"], 12, "batch 12 differs from batch 1: {report}");
    assert!(report["step_weight_bytes"].as_u64().unwrap() > 500_000_000, "{report}");
    assert!(report["flops_per_token"].as_f64().unwrap() > 2.5e8, "{report}");
}
