//! `aerie eval decode` end to end on a tiny random target and drafter: the JSON report's fields,
//! greedy identity, the costs file it writes feeding `aerie project`, and clear errors for a
//! drafter of another target and a malformed prompt file.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::Path;

use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
use aerie_model::checkpoint::{Dtype, SaveOptions, save_drafter};
use aerie_model::{AuxConvention, AuxLayers};
use common::{aerie, ok};
use serde_json::Value;

/// A drafter for the fixture target (H 32, 4 layers, V 258), without its embedding (loaded from
/// the target at run time, as for real drafters).
fn write_drafter(dir: &Path, target_hidden: usize) {
    let mut cfg = tiny_config();
    cfg.hidden_size = target_hidden;
    cfg.target_hidden_size = target_hidden;
    cfg.intermediate_size = 48;
    cfg.head_dim = 8;
    cfg.vocab_size = fixture::VOCAB;
    cfg.draft_vocab_size = 64;
    cfg.aux_layers = AuxLayers { ids: vec![0, 1, 2], convention: AuxConvention::OutputOfLayer };
    let opts = SaveOptions { include_embedding: false, ..SaveOptions::default() };
    save_drafter(&random_drafter(&cfg, Dtype::F32, 3), dir, &opts).unwrap();
}

#[test]
fn decode_reports_writes_costs_and_feeds_project() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let target = root.join("target");
    fixture::write_target(&target, 32, 4, 21);
    let drafter = root.join("drafter");
    write_drafter(&drafter, 32);
    let prompts = root.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        concat!(
            r#"{"question_id": 1, "category": "writing", "turns": ["Say hi.", "Again?"]}"#,
            "\n",
            r#"{"prompt": "Why?"}"#,
            "\n"
        ),
    )
    .unwrap();
    let (report, costs) = (root.join("report.json"), root.join("costs.toml"));
    let p = |x: &Path| x.to_str().unwrap().to_owned();
    let args = [
        "eval",
        "decode",
        "--target",
        &p(&target),
        "--drafter",
        &p(&drafter),
        "--prompts",
        &p(&prompts),
        "--k",
        "3",
        "--max-new-tokens",
        "12",
        "--json",
        "--out",
        &p(&report),
        "--costs-out",
        &p(&costs),
    ];
    let stdout = ok(aerie(&args));
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v, serde_json::from_str::<Value>(&std::fs::read_to_string(&report).unwrap()).unwrap());
    assert_eq!(v["answers"], 3, "two MT-Bench turns and one prompt");
    assert_eq!(v["greedy_identical"], true);
    assert_eq!(v["mismatched_answers"], 0);
    assert_eq!(v["prompts"][0]["turns"].as_array().unwrap().len(), 2);
    assert_eq!(v["prompts"][0]["category"], "writing");
    let tau = v["tau"].as_f64().unwrap();
    assert!((1.0..=4.0).contains(&tau), "τ {tau}");
    assert_eq!(v["curve"].as_array().unwrap().len(), 3, "τ(k) for k = 1..=3");
    assert_eq!(v["acceptance"]["accept_rate_conditional"].as_array().unwrap().len(), 3);
    assert_eq!(v["plain"]["tokens"], v["speculative"]["tokens"]);
    assert!(v["speedup"].as_f64().unwrap() > 0.0);
    assert!(v["costs"]["t_d_ms"].as_f64().unwrap() > 0.0);
    assert!(v["costs"]["t_v_ms"]["4"].as_f64().unwrap() > 0.0);

    // The costs file is valid and `aerie project` combines it with the report's curve.
    let text = std::fs::read_to_string(&costs).unwrap();
    assert!(text.contains("aerie eval decode") && text.contains("[t_v.table]"), "{text}");
    let proj: Value =
        serde_json::from_str(ok(aerie(&["project", "--accept", &p(&report), "--costs", &p(&costs), "--json"])).trim())
            .unwrap();
    assert!(proj.to_string().contains("speedup"), "{proj}");

    // A tree and a sampling run complete too.
    let tree = [&args[..10], &["--topk", "2", "--tree-tokens", "5", "--max-new-tokens", "8", "--json"]].concat();
    let v: Value = serde_json::from_str(ok(aerie(&tree)).trim()).unwrap();
    assert_eq!(v["greedy_identical"], true);
    assert_eq!(v["acceptance"]["drafting"], "tree");
    let sample = [&args[..10], &["--temperature", "0.7", "--max-new-tokens", "8", "--json"]].concat();
    let v: Value = serde_json::from_str(ok(aerie(&sample)).trim()).unwrap();
    assert_eq!(v["options"]["rule"], "onehot");
    assert!(v.get("greedy_identical").is_none());
}

#[test]
fn decode_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let target = root.join("target");
    fixture::write_target(&target, 32, 4, 21);
    let other = root.join("other-drafter");
    write_drafter(&other, 48);
    let prompts = root.join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"hi\"}\n").unwrap();
    let p = |x: &Path| x.to_str().unwrap().to_owned();
    let out = aerie(&["eval", "decode", "--target", &p(&target), "--drafter", &p(&other), "--prompts", &p(&prompts)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // The target's embedding does not fit the drafter: named, with both shapes.
    assert!(err.contains("other-drafter") && err.contains("[258, 32]") && err.contains("[258, 48]"), "{err}");

    let drafter = root.join("drafter");
    write_drafter(&drafter, 32);
    std::fs::write(&prompts, "{\"prompt\": \"hi\"}\n{\"turns\": 3}\n").unwrap();
    let out = aerie(&["eval", "decode", "--target", &p(&target), "--drafter", &p(&drafter), "--prompts", &p(&prompts)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("prompts.jsonl") && err.contains("line 2"), "{err}");
    std::fs::write(&prompts, "{\"prompt\": \"hi\"}\n").unwrap();
    let out = aerie(&[
        "eval",
        "decode",
        "--target",
        &p(&target),
        "--drafter",
        &p(&drafter),
        "--prompts",
        &p(&prompts),
        "--temperature",
        "0.5",
        "--rule",
        "greedy",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("temperature 0"));
}
