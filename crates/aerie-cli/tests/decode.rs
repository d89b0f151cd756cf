//! `aerie eval decode` end to end on a tiny random target and drafter: the JSON report's fields,
//! greedy identity, the costs file it writes feeding `aerie project`, and clear errors for a
//! drafter of another target and a malformed prompt file.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::{Path, PathBuf};

use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
use aerie_model::checkpoint::{Dtype, SaveOptions, save_drafter};
use aerie_model::{AuxConvention, AuxLayers};
use common::{aerie, ok, s};
use serde_json::Value;

/// A drafter for the fixture target (H 32, 4 layers, V 258), without its embedding (loaded from
/// the target at run time, as for real drafters).
fn write_drafter(dir: &Path, target_hidden: usize) {
    write_drafter_seeded(dir, target_hidden, 3);
}

fn write_drafter_seeded(dir: &Path, target_hidden: usize, seed: u64) {
    let mut cfg = tiny_config();
    cfg.hidden_size = target_hidden;
    cfg.target_hidden_size = target_hidden;
    cfg.intermediate_size = 48;
    cfg.head_dim = 8;
    cfg.vocab_size = fixture::VOCAB;
    cfg.draft_vocab_size = 64;
    cfg.aux_layers = AuxLayers { ids: vec![0, 1, 2], convention: AuxConvention::OutputOfLayer };
    let opts = SaveOptions { include_embedding: false, ..SaveOptions::default() };
    save_drafter(&random_drafter(&cfg, Dtype::F32, seed), dir, &opts).unwrap();
}

/// A scratch directory with the fixture target (H 32, 4 layers, seed 21) in `target/` and
/// `prompts` as `prompts.jsonl`: (dir, target, prompts).
fn target_and_prompts(prompts: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, 32, 4, 21);
    let path = dir.path().join("prompts.jsonl");
    std::fs::write(&path, prompts).unwrap();
    (dir, target, path)
}

#[test]
fn decode_reports_writes_costs_and_feeds_project() {
    let (dir, target, prompts) = target_and_prompts(concat!(
        r#"{"question_id": 1, "category": "writing", "turns": ["Say hi.", "Again?"]}"#,
        "\n",
        r#"{"prompt": "Why?"}"#,
        "\n"
    ));
    let root = dir.path();
    let drafter = root.join("drafter");
    write_drafter(&drafter, 32);
    let (report, costs) = (root.join("report.json"), root.join("costs.toml"));
    let profile = root.join("speculation_profile.json");
    let args = [
        "eval",
        "decode",
        "--target",
        s(&target),
        "--drafter",
        s(&drafter),
        "--prompts",
        s(&prompts),
        "--k",
        "3",
        "--max-new-tokens",
        "12",
        "--json",
        "--out",
        s(&report),
        "--costs-out",
        s(&costs),
        "--profile-out",
        s(&profile),
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
    // The acceptance profile: in the report and in its file; answers of 12 tokens start every
    // cycle in the first bucket.
    let p = &v["profile"];
    assert_eq!(p, &serde_json::from_str::<Value>(&std::fs::read_to_string(&profile).unwrap()).unwrap());
    assert_eq!(p["mean_accept_length"], v["tau"]);
    assert_eq!(p["marginal_accept_rates"].as_array().unwrap().len(), 3);
    assert_eq!(p["output_position_buckets"][0]["bucket"], "0-256");
    assert_eq!(p["output_position_buckets"][0]["cycles"], v["cycles"]);
    assert_eq!(p["output_position_buckets"][3]["cycles"], 0);

    // The costs file is valid and `aerie project` combines it with the report's curve.
    let text = std::fs::read_to_string(&costs).unwrap();
    assert!(text.contains("aerie eval decode") && text.contains("[t_v.table]"), "{text}");
    let proj: Value =
        serde_json::from_str(ok(aerie(&["project", "--accept", s(&report), "--costs", s(&costs), "--json"])).trim())
            .unwrap();
    assert!(proj.to_string().contains("speedup"), "{proj}");

    assert!(v.get("plain_batched").is_none(), "only with --plain-batch");

    // --plain-batch: the same three plain answers decoded together, token for token those of
    // batch 1 (the answers differ in prompt length, so rows of different lengths share steps).
    let batched = [&args[..12], &["--json", "--plain-batch", "3"]].concat();
    let b: Value = serde_json::from_str(ok(aerie(&batched)).trim()).unwrap();
    let pb = &b["plain_batched"];
    assert_eq!((pb["batch"].as_u64(), pb["answers"].as_u64()), (Some(3), Some(3)), "{pb}");
    assert_eq!(pb["tokens"], b["plain"]["tokens"], "{pb}");
    assert_eq!(pb["identical_answers"], 3, "{pb}");
    assert!(pb["tokens_per_s"].as_f64().unwrap() > 0.0, "{pb}");
    let refused = aerie(&[&args[..12], &["--plain-batch", "2", "--temperature", "0.5"]].concat());
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--plain-batch needs"), "{refused:?}");

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
fn compare_by_decoding_writes_the_report_with_measured_speedups() {
    let (dir, target, prompts) = target_and_prompts("{\"prompt\": \"Say hi.\"}\n{\"prompt\": \"Why?\"}\n");
    let root = dir.path();
    let (a, b) = (root.join("a"), root.join("b"));
    write_drafter_seeded(&a, 32, 3);
    write_drafter_seeded(&b, 32, 4);
    let out = root.join("report");
    let v: Value = serde_json::from_str(
        ok(aerie(&[
            "compare",
            s(&a),
            s(&b),
            "--target",
            s(&target),
            "--prompts",
            s(&prompts),
            "--k",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            s(&out),
            "--json",
        ]))
        .trim(),
    )
    .unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert!(r["measured_speedup"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["speedup"].as_f64().is_some(), "projected through the run's own measured costs: {r}");
        assert_eq!(r["profile"]["num_speculative_tokens"], 2, "{r}");
    }
    for name in ["a", "b"] {
        assert!(out.join(format!("{name}.speculation_profile.json")).is_file(), "{name}'s profile");
    }
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    assert!(md.contains("measured speedup"), "{md}");
    for f in ["compare.csv", "compare.parquet", "compare.json", "acceptance.png", "acceptance.svg", "speedup.png"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    // Offline mode still needs its shards.
    let o = aerie(&["compare", s(&a), "--out", s(&root.join("r2"))]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--data"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn decode_errors_name_the_problem() {
    let (dir, target, prompts) = target_and_prompts("{\"prompt\": \"hi\"}\n");
    let root = dir.path();
    let decode = |drafter: &Path, extra: &[&str]| {
        let base = ["eval", "decode", "--target", s(&target), "--drafter", s(drafter), "--prompts", s(&prompts)];
        aerie(&[&base[..], extra].concat())
    };
    let other = root.join("other-drafter");
    write_drafter(&other, 48);
    let out = decode(&other, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // The target's embedding does not fit the drafter: named, with both shapes.
    assert!(err.contains("other-drafter") && err.contains("[258, 32]") && err.contains("[258, 48]"), "{err}");

    let drafter = root.join("drafter");
    write_drafter(&drafter, 32);
    std::fs::write(&prompts, "{\"prompt\": \"hi\"}\n{\"turns\": 3}\n").unwrap();
    let out = decode(&drafter, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("prompts.jsonl") && err.contains("line 2"), "{err}");
    std::fs::write(&prompts, "{\"prompt\": \"hi\"}\n").unwrap();
    let out = decode(&drafter, &["--temperature", "0.5", "--rule", "greedy"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("temperature 0"));
}

/// Greedy identity on the real target and real prompts, skipped unless `AERIE_TEST_ASSETS=1`:
/// SmolLM2-135M-Instruct imported from the cached GGUF (`aerie assets fetch smollm2`), the first
/// three MT-Bench questions (both turns), chain and tree. The drafter is `$AERIE_TEST_DRAFTER`
/// (e.g. the quickstart's, whose drafts do get accepted) or a random SmolLM2-shaped one.
#[test]
fn real_assets_smollm2_greedy_speculation_is_plain_greedy() {
    if std::env::var("AERIE_TEST_ASSETS").map_or(true, |v| v != "1") {
        println!("note: skipped; set AERIE_TEST_ASSETS=1 to run it on the real files");
        return;
    }
    let home = std::env::var_os("AERIE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/aerie"));
    let gguf = home.join("assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mtbench = home.join("assets/mtbench/question.jsonl");
    if !gguf.is_file() || !mtbench.is_file() {
        println!("note: skipped: run `aerie assets fetch smollm2 mtbench` first");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("smollm2");
    ok(aerie(&["import", "gguf", s(&gguf), "--out", s(&target)]));
    let drafter = match std::env::var_os("AERIE_TEST_DRAFTER") {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            let d = dir.path().join("drafter");
            let cfg = aerie_model::DrafterConfig::smollm2_135m(4096);
            let opts = SaveOptions { include_embedding: false, ..SaveOptions::default() };
            save_drafter(&random_drafter(&cfg, Dtype::F32, 1), &d, &opts).unwrap();
            d
        }
    };
    let prompts = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(&mtbench).unwrap().lines().take(3).map(str::to_owned).collect();
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    let base = ["eval", "decode", "--target", s(&target), "--drafter", s(&drafter), "--prompts", s(&prompts)];
    for shape in [&["--k", "3"][..], &["--k", "3", "--topk", "2", "--tree-tokens", "6"][..]] {
        let args = [&base[..], shape, &["--max-new-tokens", "32", "--json"]].concat();
        let v: Value = serde_json::from_str(ok(aerie(&args)).trim()).unwrap();
        assert_eq!(v["answers"], 6);
        assert_eq!(v["greedy_identical"], true, "{shape:?}: {}", v["mismatched_answers"]);
        println!("{shape:?}: τ {} speedup {} cycles {}", v["tau"], v["speedup"], v["cycles"]);
    }
}

/// `aerie train` with `[select]`: every step the drafter decodes the held-out prompts greedily on
/// the native target (aerie-eval's decoder through the train command's selector), the τ goes to
/// metrics.jsonl, and `RUN/best/` holds the step with the best τ, loadable by `eval decode`,
/// whose τ on the same prompts and settings is the one recorded.
#[test]
fn train_with_select_keeps_the_drafter_of_the_best_decoded_tau() {
    use aerie_data::shard::{AuxConvention, HiddenDtype, SampleRef, ShardMetadata, ShardWriter, Teacher};
    let (dir, target, prompts) =
        target_and_prompts(concat!(r#"{"prompt": "Say hi."}"#, "\n", r#"{"prompt": "Why?"}"#, "\n"));
    let root = dir.path();
    let warm = root.join("warm");
    write_drafter(&warm, 32);
    // Random features of the fixture's shape (H 32, aux outputs of layers 0, 1, 2, V 258): the
    // run only has to move the weights; what it learns does not matter here.
    let meta = ShardMetadata {
        target: "fixture".into(),
        target_num_layers: 4,
        target_vocab_size: fixture::VOCAB,
        aux_layer_ids: vec![0, 1, 2],
        aux_convention: AuxConvention::OutputOfLayer,
        hidden_size: 32,
        dtype: HiddenDtype::F32,
        tokenizer_digest: "0".repeat(64),
        chat_template: "none".into(),
        teacher: Teacher::FinalHidden,
        created_by: "aerie-cli tests".into(),
        extra: Default::default(),
    };
    let shards = root.join("shards");
    let mut w = ShardWriter::create(&shards, meta, Default::default()).unwrap();
    let mut rng = aerie_model::rng::SplitMix(5);
    for i in 0..8 {
        let len = 12;
        let ids: Vec<i32> = (0..len).map(|_| (rng.next_u64() % 256) as i32).collect();
        let mask = vec![1u8; len];
        let aux: Vec<f32> = (0..len * 3 * 32).map(|_| rng.signed_unit()).collect();
        let fin: Vec<f32> = (0..len * 32).map(|_| 4.0 * rng.signed_unit()).collect();
        w.push(SampleRef::new(&ids, &mask, &aux).with_final_hidden(&fin).with_sample_id(i)).unwrap();
    }
    w.finish().unwrap();
    let run = root.join("run");
    let config = root.join("train.toml");
    let text = format!(
        "output_dir = \"{run}\"\nlog_every = 1\n\n[data]\ntrain = [\"{shards}\"]\nbatch_tokens = 48\n\n\
         [init]\nkind = \"warm_start\"\ndrafter = \"{warm}\"\n\n[target]\npath = \"{target}\"\n\n\
         [optim]\nlr = 3e-3\nmax_steps = 3\n\n[select]\nevery_steps = 1\nprompts = \"{prompts}\"\nk = 2\n\
         max_new_tokens = 12\n",
        run = run.display(),
        shards = shards.display(),
        warm = warm.display(),
        target = target.display(),
        prompts = prompts.display(),
    );
    std::fs::write(&config, text).unwrap();
    let summary: Value = serde_json::from_str(ok(aerie(&["train", s(&config), "--json"])).trim()).unwrap();
    let lines: Vec<Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["kind"] == "select")
        .collect();
    assert_eq!(lines.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 2, 3]);
    let taus: Vec<f64> = lines.iter().map(|l| l["tau"].as_f64().unwrap()).collect();
    assert!(taus.iter().all(|&t| (1.0..=3.0).contains(&t)), "{taus:?}");
    let best = taus.iter().cloned().fold(f64::MIN, f64::max);
    let best_step = 1 + taus.iter().position(|&t| t == best).unwrap() as u64;
    assert_eq!(summary["best"]["step"].as_u64(), Some(best_step), "{summary}");
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(run.join("best/selection.json")).unwrap()).unwrap();
    assert_eq!((rec["step"].as_u64(), rec["tau"].as_f64()), (Some(best_step), Some(best)));
    // eval decode of best/ on the same prompts and settings measures the same τ.
    let best_dir = run.join("best");
    let report = ok(aerie(&[
        "eval",
        "decode",
        "--target",
        s(&target),
        "--drafter",
        s(&best_dir),
        "--prompts",
        s(&prompts),
        "--k",
        "2",
        "--max-new-tokens",
        "12",
        "--json",
    ]));
    let report: Value = serde_json::from_str(report.trim()).unwrap();
    assert!((report["tau"].as_f64().unwrap() - best).abs() < 1e-9, "{} vs {best}", report["tau"]);
}
