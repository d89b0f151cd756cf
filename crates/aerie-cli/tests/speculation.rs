//! End-to-end runs of the `aerie` binary for acceptance and speedup: `eval accept`, `project`,
//! `compare` on a tiny synthetic capture, and `measure`'s error path. Fixtures are written with
//! the library crates (a random tiny drafter, a unit-row target head, one shard).

mod common;
use std::path::{Path, PathBuf};

use aerie_data::shard::{SampleRef, ShardWriter, ShardWriterOptions};
use aerie_model::checkpoint::io::write_safetensors;
use aerie_model::checkpoint::synthetic::tiny_config;
use aerie_model::checkpoint::{Dtype, HostTensor};
use common::{aerie, ok, tiny_drafter_and_head, tiny_shard_metadata};

struct Fixture {
    _dir: tempfile::TempDir,
    drafter: PathBuf,
    data: PathBuf,
    head: PathBuf,
    root: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let cfg = tiny_config();
    let (v, ht) = (cfg.vocab_size, cfg.target_hidden_size);
    let (drafter, head) = tiny_drafter_and_head(&root);
    let data = root.join("data");
    let meta = tiny_shard_metadata(&"0".repeat(64));
    let mut w = ShardWriter::create(&data, meta, ShardWriterOptions::default()).unwrap();
    for s in 0..2usize {
        let n = 10 + s;
        let ids: Vec<i32> = (0..n).map(|j| ((j * 37 + s) % v) as i32).collect();
        let mask: Vec<u8> = (0..n).map(|j| (j >= 2) as u8).collect();
        let aux: Vec<f32> = (0..n * 3 * ht).map(|i| ((i * 31 % 97) as f32 / 97.0) - 0.5).collect();
        let fin: Vec<f32> = (0..n * ht).map(|i| ((i * 13 % 89) as f32 / 89.0) - 0.5).collect();
        w.push(SampleRef::new(&ids, &mask, &aux[..]).with_final_hidden(&fin[..])).unwrap();
    }
    w.finish().unwrap();
    Fixture { _dir: dir, drafter, data, head, root }
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn accept_project_and_compare_end_to_end() {
    let f = fixture();
    let common = ["--data", p(&f.data), "--target-head", p(&f.head), "--k", "2"];
    let mut args = vec!["eval", "accept", "--drafter", p(&f.drafter), "--json"];
    args.extend(common);
    let json = ok(aerie(&args));
    let rep: serde_json::Value = serde_json::from_str(&json).unwrap();
    let tau = rep["tau"].as_f64().unwrap();
    assert!((1.0..=3.0).contains(&tau), "τ {tau}");
    assert_eq!(rep["curve"].as_array().unwrap().len(), 2);
    assert_eq!(rep["rule"], "greedy");
    assert!(rep["accept_rate_conditional"].is_array() && rep["accept_rate_unconditional"].is_array());
    // The captured tokens here are arbitrary, not the head's argmax: the report must say so.
    assert!(rep["captured_not_target_argmax"].as_f64().unwrap() > 0.0);
    assert!(rep["warnings"][0].as_str().unwrap().contains("decoding τ"));
    // The profile of the walked cycles (greedy): its τ is the report's, its buckets partition the
    // walk's cycles.
    let prof = &rep["profile"];
    assert!((prof["mean_accept_length"].as_f64().unwrap() - tau).abs() < 1e-12, "{prof}");
    let cycles: u64 =
        prof["output_position_buckets"].as_array().unwrap().iter().map(|b| b["cycles"].as_u64().unwrap()).sum();
    assert_eq!(cycles, rep["cycles"][1]["cycles"].as_u64().unwrap(), "{prof}");
    let profile_out = f.root.join("profile.json");
    let mut with_file = args.clone();
    with_file.extend(["--profile-out", p(&profile_out)]);
    ok(aerie(&with_file));
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&profile_out).unwrap()).unwrap();
    assert_eq!(&written, prof);

    let mut args = vec!["eval", "accept", "--drafter", p(&f.drafter)];
    args.extend(common);
    let human = aerie(&args);
    let text = ok(human);
    assert!(text.contains("bonus token included") && text.contains("α_i (conditional)"), "{text}");
    if std::env::var_os("AERIE_SHOW").is_some() {
        eprintln!("{text}");
    }

    let accept = f.root.join("accept.json");
    std::fs::write(&accept, &json).unwrap();
    let costs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/costs/kimi-k25-8x-rtx-pro-6000.toml");
    let proj: serde_json::Value =
        serde_json::from_str(&ok(aerie(&["project", "--accept", p(&accept), "--costs", p(&costs), "--json"]))).unwrap();
    assert_eq!(proj["rows"].as_array().unwrap().len(), 2);
    assert_eq!(proj["rows"][1]["cycle_source"], "measured");
    let human = ok(aerie(&["project", "--accept", p(&accept), "--costs", p(&costs)]));
    assert!(human.contains("break-even"), "{human}");

    let out = f.root.join("report");
    let mut args =
        vec!["compare", p(&f.drafter), p(&f.drafter), "--names", "a,b", "--costs", p(&costs), "--out", p(&out)];
    args.extend(common);
    let table = ok(aerie(&args));
    assert!(table.contains("| a |") && table.contains("| b |"), "{table}");
    for name in [
        "compare.md",
        "compare.csv",
        "compare.parquet",
        "compare.json",
        "acceptance.png",
        "acceptance.svg",
        "speedup.png",
        "speedup.svg",
    ] {
        assert!(out.join(name).is_file(), "{name} missing");
    }
}

#[test]
fn bad_invocations_fail_clearly() {
    let f = fixture();
    let out = aerie(&[
        "eval",
        "accept",
        "--drafter",
        p(&f.drafter),
        "--data",
        p(&f.data),
        "--target-head",
        p(&f.head),
        "--topk",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tree-tokens"));

    let prompts = f.root.join("prompts.jsonl");
    std::fs::write(&prompts, "{\"turns\": [\"hello\"]}\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let out = aerie(&["measure", "--server", &url, "--prompts", p(&prompts), "--retries", "0", "--json"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused") || err.contains("connection failed"), "{err}");
}

/// `shards convert` to each compact encoding, `shards verify`, `bench shards`, `eval loss` /
/// `eval accept`, `train` and `compare` on the result, whose τ stays near the f32 data's; then a NaN in the shards makes
/// both evaluations fail naming the shard and the sample (it used to print `"loss": null`).
#[test]
fn compact_shards_convert_verify_bench_and_evaluate_and_nan_fails_evaluations() {
    let f = fixture();
    let tau = |data: &Path| {
        let args = ["eval", "accept", "--drafter", p(&f.drafter), "--data", p(data), "--target-head", p(&f.head)];
        let rep: serde_json::Value =
            serde_json::from_str(&ok(aerie(&[&args[..], &["--k", "2", "--json"]].concat()))).unwrap();
        rep["tau"].as_f64().unwrap()
    };
    let reference = tau(&f.data);
    for dtype in ["fp8-e4m3", "int4", "bf16"] {
        let out = f.root.join(format!("data-{dtype}"));
        let rep: serde_json::Value = serde_json::from_str(&ok(aerie(&[
            "shards",
            "convert",
            p(&f.data),
            "--dtype",
            dtype,
            "--out",
            p(&out),
            "--json",
        ])))
        .unwrap();
        assert_eq!((rep["converted_samples"].as_u64(), rep["tokens"].as_u64()), (Some(2), Some(21)), "{rep}");
        assert!(rep["dst_bytes_per_token"].as_f64() < rep["src_bytes_per_token"].as_f64(), "{rep}");
        let v: serde_json::Value = serde_json::from_str(&ok(aerie(&["shards", "verify", p(&out), "--json"]))).unwrap();
        assert_eq!((v["dtype"].as_str(), v["samples"].as_u64()), (Some(dtype), Some(2)));
        let b: serde_json::Value = serde_json::from_str(&ok(aerie(&["bench", "shards", p(&out), "--json"]))).unwrap();
        assert_eq!((b["dtype"].as_str(), b["tokens"].as_u64()), (Some(dtype), Some(21)));
        assert!(b["decode_tokens_per_second"].as_f64().unwrap() > 0.0, "{b}");
        // Random drafter, 2 samples: τ may move by a draft or two, no more.
        let t = tau(&out);
        assert!((t - reference).abs() < 0.5, "{dtype}: τ {t} vs f32 {reference}");
        let loss = ok(aerie(&[
            "eval",
            "loss",
            "--drafter",
            p(&f.drafter),
            "--data",
            p(&out),
            "--target-head",
            p(&f.head),
            "--json",
        ]));
        assert!(!loss.contains("null"), "{loss}");
        // `aerie train` on the compact shards (a warm start from the fixture's drafter, one epoch)
        // and `aerie compare` of the result against the fixture's drafter on them.
        let (config, run) = (f.root.join(format!("train-{dtype}.toml")), f.root.join(format!("run-{dtype}")));
        let toml = format!(
            "seed = 1\noutput_dir = {run:?}\nlog_every = 1\nttt_length = 2\n\n[data]\ntrain = [{out:?}]\nbatch_tokens = 64\n\n\
             [init]\nkind = \"warm_start\"\ndrafter = {drafter:?}\n\n[target]\nhead = {head:?}\n\n\
             [optim]\nlr = 1e-3\nwarmup_ratio = 0.1\nepochs = 1\n",
            run = p(&run),
            out = p(&out),
            drafter = p(&f.drafter),
            head = p(&f.head),
        );
        std::fs::write(&config, toml).unwrap();
        let summary: serde_json::Value =
            serde_json::from_str(ok(aerie(&["train", p(&config), "--json"])).trim()).unwrap();
        assert_eq!(summary["status"], "completed", "{dtype}: {summary}");
        assert!(summary["last_train"]["loss"].as_f64().is_some_and(f64::is_finite), "{dtype}: {summary}");
        let trained = summary["final_checkpoint"].as_str().map(PathBuf::from).unwrap_or_else(|| panic!("{summary}"));
        // Its curves: an event file for TensorBoard beside metrics.jsonl, and `aerie plot`.
        let events = std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("events.out.tfevents."));
        assert_eq!(events.count(), 1, "{dtype}: one TensorBoard event file in {}", run.display());
        let curves = f.root.join(format!("curves-{dtype}.svg"));
        assert_eq!(ok(aerie(&["plot", p(&run), "--out", p(&curves)])).trim(), p(&curves));
        assert!(std::fs::read_to_string(&curves).unwrap().contains(&format!("run-{dtype}")));
        // A trained checkpoint leaves the (frozen) embedding to the target: give `compare` one.
        let embedding = f.root.join("embedding.safetensors");
        let cfg = tiny_config();
        let vals: Vec<f32> =
            (0..cfg.vocab_size * cfg.hidden_size).map(|i| ((i * 7919 % 1000) as f32 / 1000.0) - 0.5).collect();
        let t = HostTensor::from_f32(vec![cfg.vocab_size, cfg.hidden_size], &vals, Dtype::F32);
        write_safetensors(&embedding, [("embed_tokens.weight", &t)]).unwrap();
        let report = f.root.join(format!("compare-{dtype}"));
        let table = ok(aerie(&[
            "compare",
            p(&f.drafter),
            p(&trained),
            "--names",
            "fixture,trained",
            "--data",
            p(&out),
            "--target-head",
            p(&f.head),
            "--target",
            p(&embedding),
            "--k",
            "2",
            "--out",
            p(&report),
        ]));
        assert!(table.contains("| fixture |") && table.contains("| trained |"), "{dtype}: {table}");
    }

    // Value [3, 5] of sample 1 (tokens 10..21 of the one shard) becomes NaN.
    let shard = f.data.join("shard-00000.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = header["aux_hidden"]["data_offsets"][0].as_u64().unwrap() as usize;
    let at = 8 + n + start + 4 * ((10 + 3) * 3 * 64 + 5);
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&shard, bytes).unwrap();
    let needle = "shard-00000.safetensors: sample 1: aux_hidden[3, 5] = NaN is not finite";
    for cmd in ["loss", "accept"] {
        let out = aerie(&["eval", cmd, "--drafter", p(&f.drafter), "--data", p(&f.data), "--target-head", p(&f.head)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(needle), "eval {cmd}: {stderr}");
    }
    let out = aerie(&["shards", "verify", p(&f.data)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The recorded checksum is what verify notices first.
    assert!(!out.status.success() && stderr.contains("shard-00000.safetensors: sha256 is"), "{stderr}");
}
