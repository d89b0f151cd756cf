//! The offline prediction walks the cycles of decoding (docs/decoding.md): on the quickstart's
//! SmolLM2-135M (the assets' GGUF imported by aerie) and the trained fixture drafter
//! (`tests/fixtures/smollm2-135m-eagle3`, τ ≈ 1.3), `aerie eval accept` on shards captured in f32
//! from the target's own greedy answers counts exactly the cycles and accepted drafts of `aerie
//! eval decode` on the same prompts, template, budget and k, at k = 1, 2, 3. 148 s in CI's suite
//! beside other tests (2026-12-04): the native engine decodes every answer three times plainly and
//! three times speculatively.

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::path::Path;

use common::{aerie, ok, ok_json, s};
use engine::{assets_dir, smollm2};
use serde_json::Value;

/// New tokens per answer: short enough for CI, long enough that most answers are cut by it (the
/// case where the template's end-of-turn token is not the target's).
const BUDGET: &str = "48";

#[test]
fn eval_accept_counts_the_cycles_of_eval_decode() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let target = smollm2(root);
    let drafter = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2-135m-eagle3");
    ok(aerie(&["assets", "fetch", "mtbench"]));
    // The first turns of four MT-Bench questions: as prompts for decoding, and as conversations
    // whose answers regenerate replaces with the target's own greedy ones.
    let questions = std::fs::read_to_string(assets_dir().join("mtbench/question.jsonl")).unwrap();
    let (mut prompts, mut convs) = (String::new(), String::new());
    for line in questions.lines().take(4) {
        let q: Value = serde_json::from_str(line).unwrap();
        let (id, turn) = (q["question_id"].to_string(), q["turns"][0].clone());
        prompts += &format!("{}\n", serde_json::json!({"id": id, "prompt": turn}));
        let conv = serde_json::json!([{"from": "human", "value": turn}, {"from": "gpt", "value": "(regenerated)"}]);
        convs += &format!("{}\n", serde_json::json!({"id": id, "conversations": conv}));
    }
    let (prompts_file, convs_file) = (root.join("prompts.jsonl"), root.join("conversations.jsonl"));
    std::fs::write(&prompts_file, prompts).unwrap();
    std::fs::write(&convs_file, convs).unwrap();

    let own = root.join("own.jsonl");
    let regen = ["regenerate", "--target", s(&target), "--data", s(&convs_file), "--out", s(&own)];
    ok_json(aerie(&[&regen[..], &["--max-new-tokens", BUDGET, "--temperature", "0", "--json"]].concat()));
    let prepared = root.join("prepared");
    let prep = ["data", "prepare", "--data", s(&own), "--tokenizer", s(&target), "--out", s(&prepared)];
    ok_json(aerie(&[&prep[..], &["--split", "eval=0", "--max-length", "4096", "--json"]].concat()));
    let shards = root.join("shards");
    ok(aerie(&["capture", "--target", s(&target), "--data", s(&prepared), "--out", s(&shards), "--dtype", "f32"]));

    let accept = |extra: &[&str]| -> Value {
        let base = ["eval", "accept", "--drafter", s(&drafter), "--data", s(&shards), "--target-head", s(&target)];
        ok_json(aerie(&[&base[..], &["--k", "3", "--json"], extra].concat()))
    };
    let told = accept(&["--answer-budget", BUDGET]);
    let guessed = accept(&[]);
    assert_eq!(told["captured_not_target_argmax"], 0.0, "the captured answers are the target's greedy ones");
    assert_eq!(
        told["cycles"], guessed["cycles"],
        "the template's end after a cut answer is recognised without the budget"
    );
    assert_eq!(told["positions"], guessed["positions"]);

    for k in 1..=3usize {
        let dec = ok_json(aerie(&[
            "eval",
            "decode",
            "--target",
            s(&target),
            "--drafter",
            s(&drafter),
            "--prompts",
            s(&prompts_file),
            "--k",
            &k.to_string(),
            "--max-new-tokens",
            BUDGET,
            "--json",
        ]));
        assert_eq!(dec["greedy_identical"], true, "k = {k}");
        let walk = &told["cycles"][k - 1];
        let within = &dec["within_answers"];
        println!(
            "k = {k}: decode {} cycles, {} drafts accepted in the answers (τ {}; {} as the verdicts count); eval accept {} cycles, {} drafts (τ {}; {} over every position)",
            within["cycles"],
            within["accepted_drafts"],
            1.0 + within["accepted_drafts"].as_f64().unwrap() / within["cycles"].as_f64().unwrap(),
            dec["tau"],
            walk["cycles"],
            walk["accepted_drafts"],
            told["curve"][k - 1]["tau"],
            told["tau_all_positions"],
        );
        assert_eq!(walk["k"], k);
        assert_eq!(
            (&walk["cycles"], &walk["accepted_drafts"]),
            (&within["cycles"], &within["accepted_drafts"]),
            "k = {k}"
        );
        assert!(within["accepted_drafts"].as_u64().unwrap() > 0, "k = {k}: the fixture drafter's drafts are accepted");
        // The acceptance profiles (issue 46 §3): the buckets partition decode's cycles, and at the
        // walk's own k the walk's profile is decode's within the answers, field for field.
        let profile = &dec["profile"];
        let bucket_cycles: u64 =
            profile["output_position_buckets"].as_array().unwrap().iter().map(|b| b["cycles"].as_u64().unwrap()).sum();
        assert_eq!(bucket_cycles, dec["cycles"].as_u64().unwrap(), "k = {k}: the buckets partition the cycles");
        assert_eq!(profile["marginal_accept_rates"].as_array().unwrap().len(), k);
        assert_eq!(profile["mean_accept_length"], dec["tau"], "k = {k}: the profile's τ is the report's");
        if k == 3 {
            let (walked, decoded) = (&told["profile"], &dec["within_answers_profile"]);
            for field in [
                "acceptance_length_histogram",
                "marginal_accept_rates",
                "conditional_accept_rates",
                "mean_accept_length",
                "output_position_buckets",
            ] {
                assert_eq!(walked[field], decoded[field], "k = 3: the walk and eval decode agree on {field}");
            }
            assert!(walked.get("output_position_buckets_unavailable").is_none());
        }
    }
}
