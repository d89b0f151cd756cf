//! The Python capture worker (`python/aerie_capture`) against aerie itself, through
//! `$AERIE_PYTHON` (skipped with a note when it is unset, failing when `CI=true`):
//!
//! - the worker's own unittest suites (writer, teacher merge, SGLang pure functions, the
//!   transformers engine on a tiny random DeepSeek-V3 against forward hooks);
//! - `aerie capture --engine transformers` equals `aerie capture` (native) on the tiny Llama
//!   target: same metadata (but `created_by`), samples, masks and ids, f32 features within
//!   rel 1e-3, and the dataset passes aerie's full verification;
//! - the reverse direction: what aerie writes, the Python reader reads and verifies, value for
//!   value, in every encoding;
//! - the compact encodings (fp8-e4m3, int4) the worker writes equal `aerie shards convert`'s,
//!   byte for byte;
//! - the worker killed with SIGKILL and rerun gives the uninterrupted dataset, byte for byte;
//! - the lock: a Python writer keeps the Rust writer out and the other way round;
//! - a tiny random DeepSeek-V3 (MLA, routed + shared experts) captured by the worker feeds
//!   `aerie train` and `aerie eval loss` unchanged.
//!
//! SmolLM2-135M (the real asset, `AERIE_TEST_ASSETS=1`) gets the native/transformers
//! comparison too.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aerie_data::shard::{ShardDataset, ShardWriter, ShardWriterOptions};
use common::{aerie, aerie_cmd, aerie_run, capture_parity, f32_rows, ok, ok_json, python, s};
use serde_json::Value;

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python")
}

/// `python ARGS` with the worker package importable and single-threaded torch (deterministic
/// CPU sums, and fair to the tests running beside it).
fn py(python: &Path) -> Command {
    let mut c = Command::new(python);
    c.env("PYTHONPATH", python_dir()).env("OMP_NUM_THREADS", "1").env("MKL_NUM_THREADS", "1");
    c.env("TOKENIZERS_PARALLELISM", "false").env("HF_HUB_OFFLINE", "1");
    c
}

fn run_ok(mut c: Command) -> String {
    let out = c.output().expect("start python");
    assert!(
        out.status.success(),
        "python failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A scratch directory holding a tiny Llama target (fixture) and a prepared dataset of `n`
/// conversations: (dir, target, prepared).
fn tiny_setup(n: usize) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, 64, 4, 7);
    let prepared = prepare(dir.path(), &target, n);
    (dir, target, prepared)
}

/// `n` fixture conversations prepared with `target`'s tokenizer, in `root/prepared`.
fn prepare(root: &Path, target: &Path, n: usize) -> PathBuf {
    let data = root.join("chat.jsonl");
    fixture::write_jsonl(&data, &fixture::conversations(n));
    let prepared = root.join("prepared");
    ok_json(aerie(&["data", "prepare", "--data", s(&data), "--tokenizer", s(target), "--out", s(&prepared), "--json"]));
    prepared
}

/// `aerie capture --target … --data … --out … --json` and `extra`, not yet started.
fn capture_cmd(target: &Path, prepared: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut c = aerie_run("capture", target, prepared, out, &["--json"]);
    c.args(extra);
    c
}

/// The Python dataset equals the native one: metadata (but `created_by`), every sample's
/// ids, mask and id, features within `tol` relative, and the top-k log-probs within `tol`
/// absolute (ids compared where the top-1 is not a near tie).
fn assert_equivalent(native: &Path, python: &Path, tol: f64) {
    let p = capture_parity(native, python, "aerie-capture 0.1.0 (transformers ");
    let (worst_aux, worst_final, worst_lp) = (p.aux, p.fin, p.logprob);
    println!(
        "native vs transformers: aux rel {worst_aux:.2e}, final rel {worst_final:.2e}, top-k logprob abs {worst_lp:.2e}"
    );
    assert!(worst_aux <= tol, "aux rel error {worst_aux:.3e} > {tol}");
    assert!(worst_final <= tol, "final rel error {worst_final:.3e} > {tol}");
    assert!(worst_lp <= tol, "top-k logprob error {worst_lp:.3e} > {tol}");
    assert_eq!(p.top1_agree, 1.0, "top-1 ids differ where the reference's top-1 is not a near tie");
}

#[test]
fn python_unit_suites_pass() {
    let Some(python) = python("python_unit_suites_pass") else { return };
    let mut c = py(&python);
    c.current_dir(python_dir()).args(["-m", "unittest", "discover", "-s", "tests", "-v"]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python unittest failed:\n{err}");
    assert!(err.contains("OK"), "{err}");
    println!("{}", err.lines().filter(|l| l.starts_with("Ran ")).collect::<String>());
}

#[test]
fn transformers_engine_equals_the_native_capture_and_verifies() {
    let Some(python) = python("transformers_engine_equals_the_native_capture_and_verifies") else { return };
    let (dir, target, prepared) = tiny_setup(12);
    let flags =
        ["--aux-layers", "0,1,2", "--dtype", "f32", "--teacher", "final-hidden+topk:8", "--shard-tokens", "300"];
    let native = dir.path().join("native");
    ok_json(capture_cmd(&target, &prepared, &native, &flags).output().unwrap());
    let hf = dir.path().join("hf");
    let mut c = capture_cmd(&target, &prepared, &hf, &flags);
    c.args(["--engine", "transformers", "--python", s(&python)]);
    c.env("OMP_NUM_THREADS", "1");
    let report = ok_json(c.output().unwrap());
    assert_eq!(report["engine"], "transformers");
    assert_eq!(report["captured_samples"], 12);
    assert_eq!(report["verified"]["samples"], 12, "{report}");
    ShardDataset::open(&hf).unwrap().verify().unwrap();
    assert_equivalent(&native, &hf, 1e-3);

    // Resuming a finished capture captures nothing and changes nothing.
    let again = ok_json(c.output().unwrap());
    assert_eq!((again["resumed_samples"].as_u64(), again["captured_samples"].as_u64()), (Some(12), Some(0)));
}

/// The Python writer's compact encodings are the Rust writer's, byte for byte: a transformers
/// capture straight to fp8-e4m3 or int4 equals `aerie shards convert` of the same engine's f32
/// capture, every tensor of every shard (codes and scales) and the metadata but `created_by`,
/// and aerie's full verification passes on it. (The engine is deterministic on one thread, so
/// both captures encode the same f32 activations.)
#[test]
fn python_compact_encodings_equal_aerie_shards_convert() {
    let Some(python) = python("python_compact_encodings_equal_aerie_shards_convert") else { return };
    let (dir, target, prepared) = tiny_setup(8);
    let capture = |dtype: &str, out: &Path| {
        let flags = ["--aux-layers", "0,1,2", "--dtype", dtype, "--teacher", "final-hidden", "--shard-tokens", "300"];
        let mut c = capture_cmd(&target, &prepared, out, &flags);
        c.args(["--engine", "transformers", "--python", s(&python)]);
        c.env("OMP_NUM_THREADS", "1");
        let report = ok_json(c.output().unwrap());
        assert_eq!(report["verified"]["samples"], 8, "{report}");
        report
    };
    let f32_dir = dir.path().join("hf-f32");
    capture("f32", &f32_dir);
    let compare = r#"import json, sys
from pathlib import Path
import torch
from safetensors import safe_open
a, b = Path(sys.argv[1]), Path(sys.argv[2])
files = sorted(p.name for p in a.glob("shard-*.safetensors"))
assert files == sorted(p.name for p in b.glob("shard-*.safetensors")), "shard files differ"
out = []
for name in files:
    with safe_open(a / name, framework="pt") as x, safe_open(b / name, framework="pt") as y:
        mx, my = dict(x.metadata()), dict(y.metadata())
        mx.pop("created_by"), my.pop("created_by")
        assert mx == my, (name, mx, my)
        assert sorted(x.keys()) == sorted(y.keys()), (name, x.keys(), y.keys())
        for k in x.keys():
            tx, ty = x.get_tensor(k), y.get_tensor(k)
            assert tx.dtype == ty.dtype and tx.shape == ty.shape, (name, k)
            assert torch.equal(tx.contiguous().view(-1).view(torch.uint8), ty.contiguous().view(-1).view(torch.uint8)), (name, k)
        out.append([name, sorted(x.keys()), mx["format"], mx["dtype"]])
print(json.dumps(out))
"#;
    for dtype in ["fp8-e4m3", "int4"] {
        let direct = dir.path().join(format!("hf-{dtype}"));
        let report = capture(dtype, &direct);
        let converted = dir.path().join(format!("convert-{dtype}"));
        ok_json(aerie(&["shards", "convert", s(&f32_dir), "--dtype", dtype, "--out", s(&converted), "--json"]));
        let ds = ShardDataset::open(&direct).unwrap();
        ds.verify().unwrap();
        assert_eq!(ds.metadata().dtype.as_str(), dtype);
        let bpt = report["bytes_per_token"].as_f64().unwrap();
        let mut c = py(&python);
        c.args(["-c", compare, s(&direct), s(&converted)]);
        let shards: Value = serde_json::from_str(run_ok(c).trim()).unwrap();
        let shards = shards.as_array().unwrap();
        assert!(shards.len() > 1, "several shards compared: {shards:?}");
        for sh in shards {
            assert_eq!(sh[2], "aerie-shard/2", "{sh}");
            let keys: Vec<&str> = sh[1].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
            assert!(keys.contains(&"aux_hidden_scales") && keys.contains(&"final_hidden_scales"), "{keys:?}");
        }
        println!("{dtype}: {} shards byte-identical to `aerie shards convert`, {bpt:.1} bytes per token", shards.len());
    }
}

#[test]
fn python_reads_and_verifies_what_aerie_writes() {
    let Some(python) = python("python_reads_and_verifies_what_aerie_writes") else { return };
    let (dir, target, prepared) = tiny_setup(9);
    for dtype in ["bf16", "f16", "f32", "fp8-e4m3", "int4"] {
        let native = dir.path().join(format!("native-{dtype}"));
        let flags =
            ["--aux-layers", "1,2", "--dtype", dtype, "--teacher", "final-hidden+topk:4", "--shard-tokens", "200"];
        ok_json(capture_cmd(&target, &prepared, &native, &flags).output().unwrap());
        let script = "import json, sys\n\
from aerie_capture.shards import ShardDataset\n\
ds = ShardDataset(sys.argv[1])\n\
rep = ds.verify()\n\
rows = [[s.sample_id, int(s.input_ids.numel()), int(s.loss_mask.sum()), float(s.aux_hidden.double().sum()),\n\
         float(s.final_hidden.double().sum()), int(s.topk_ids[:, 0].sum()), float(s.topk_logprobs.double().sum())]\n\
        for s in ds.samples()]\n\
print(json.dumps({'report': rep, 'metadata': ds.metadata.to_map(), 'rows': rows}))\n";
        let mut c = py(&python);
        c.args(["-c", script, s(&native)]);
        let got: Value = serde_json::from_str(run_ok(c).trim()).unwrap();
        let ds = ShardDataset::open(&native).unwrap();
        let want = ds.verify().unwrap();
        assert_eq!(got["report"]["samples"], want.samples);
        assert_eq!(got["report"]["tokens"], want.tokens);
        assert_eq!(got["report"]["masked_tokens"], want.masked_tokens);
        assert_eq!(got["report"]["shards"], want.shards as u64);
        let md = ds.metadata().to_map();
        assert_eq!(got["metadata"].as_object().unwrap().len(), md.len());
        for (k, v) in &md {
            assert_eq!(got["metadata"][k].as_str(), Some(v.as_str()), "metadata {k}");
        }
        let rows = got["rows"].as_array().unwrap();
        assert_eq!(rows.len(), ds.len());
        for (i, row) in rows.iter().enumerate() {
            let smp = ds.sample(i).unwrap();
            let sum = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>();
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
            assert_eq!(row[0].as_i64(), smp.sample_id());
            assert_eq!(row[1].as_u64(), Some(smp.len() as u64));
            assert_eq!(row[2].as_u64(), Some(smp.loss_mask().iter().map(|&m| m as u64).sum()));
            assert!(close(row[3].as_f64().unwrap(), sum(&f32_rows(smp.aux_hidden()))), "{dtype} sample {i}: aux");
            assert!(close(row[4].as_f64().unwrap(), sum(&f32_rows(smp.final_hidden().unwrap()))), "{dtype} sample {i}");
            let topk = smp.topk().unwrap();
            let top1: i64 = topk.ids().chunks(4).map(|r| r[0] as i64).sum();
            assert_eq!(row[5].as_i64(), Some(top1));
            assert!(close(row[6].as_f64().unwrap(), sum(&topk.logprobs())), "{dtype} sample {i}: logprobs");
        }
    }
}

#[test]
fn python_capture_killed_with_sigkill_resumes_to_the_uninterrupted_dataset() {
    let Some(python) = python("python_capture_killed_with_sigkill_resumes_to_the_uninterrupted_dataset") else {
        return;
    };
    let (dir, target, prepared) = tiny_setup(40);
    // The worker run by hand, with the metadata aerie would hand it.
    let opts = aerie_capture::CaptureOptions {
        target_name: s(&target).into(),
        aux_layers: Some(vec![0, 2]),
        dtype: "bf16".parse().unwrap(),
        teacher: "final-hidden+topk:4".parse().unwrap(),
        shard_tokens: 400,
        split: "train".into(),
        max_samples: None,
    };
    let shape = aerie_capture::contract::TargetShape::from_config(&target).unwrap();
    let data = aerie_data::prepare::PreparedDataset::open(&prepared).unwrap();
    let metadata = aerie_capture::contract::metadata(&target, shape, &data, &opts).unwrap();
    let metadata = serde_json::to_string(&metadata.to_map()).unwrap();
    let worker = |out: &Path| {
        let mut c = py(&python);
        c.args(["-m", "aerie_capture", "--engine", "transformers", "--target", s(&target), "--data", s(&prepared)])
            .args(["--out", s(out), "--metadata", &metadata, "--shard-tokens", "400"]);
        c
    };
    let full = dir.path().join("full");
    run_ok(worker(&full));
    let full_ds = ShardDataset::open(&full).unwrap();
    assert!(full_ds.num_shards() >= 4, "{} shards: too few for a kill in the middle", full_ds.num_shards());

    let cut = dir.path().join("cut");
    let mut child = worker(&cut).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    loop {
        let committed = ShardDataset::open(&cut).map(|d| d.num_shards()).unwrap_or(0);
        if committed >= 2 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the worker finished before it could be killed");
        assert!(t0.elapsed() < Duration::from_secs(600), "no shard after 600 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = ShardDataset::open(&cut).unwrap().len();
    assert!(before < full_ds.len(), "killed after the end");
    let report: Value = serde_json::from_str(run_ok(worker(&cut)).trim().lines().last().unwrap()).unwrap();
    assert_eq!(report["resumed_samples"].as_u64(), Some(before as u64));
    assert_eq!(report["captured_samples"].as_u64(), Some((full_ds.len() - before) as u64));

    let cut_ds = ShardDataset::open(&cut).unwrap();
    cut_ds.verify().unwrap();
    assert_eq!(full_ds.manifest().shards.len(), cut_ds.manifest().shards.len());
    for (a, b) in full_ds.manifest().shards.iter().zip(&cut_ds.manifest().shards) {
        assert_eq!((a.samples, a.tokens, &a.sha256), (b.samples, b.tokens, &b.sha256), "{}: bytes differ", a.file);
    }
    let names: Vec<String> =
        std::fs::read_dir(&cut).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.starts_with(".tmp-")), "leftover temp files: {names:?}");
}

#[test]
fn the_lock_keeps_a_python_and_a_rust_writer_apart() {
    let Some(python) = python("the_lock_keeps_a_python_and_a_rust_writer_apart") else { return };
    let (dir, target, prepared) = tiny_setup(2);
    let ds = dir.path().join("ds");
    ok_json(capture_cmd(&target, &prepared, &ds, &["--aux-layers", "0,1"]).output().unwrap());

    // Python holds the lock (until its stdin closes): the Rust writer is refused.
    let hold = "import sys\nfrom aerie_capture.shards import ShardWriter\nw, _ = ShardWriter.resume(sys.argv[1])\n\
print('locked', flush=True)\nsys.stdin.read()\nw.close()\n";
    let mut c = py(&python);
    let mut child = c.args(["-c", hold, s(&ds)]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    let err = ShardWriter::resume(&ds, ShardWriterOptions::default()).unwrap_err();
    assert!(matches!(err, aerie_data::Error::Locked { .. }), "{err}");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());

    // Rust holds it: the Python writer is refused with a message naming the lock file.
    let (writer, _) = ShardWriter::resume(&ds, ShardWriterOptions::default()).unwrap();
    let mut c = py(&python);
    let out = c.args([
        "-c",
        "import sys\nfrom aerie_capture.shards import ShardWriter\nShardWriter.resume(sys.argv[1])",
        s(&ds),
    ]);
    let out = out.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("LockedError") && err.contains(".aerie-shard.lock"), "{err}");
    drop(writer);
}

#[test]
fn tiny_deepseek_v3_capture_verifies_and_feeds_train_and_eval_loss() {
    let Some(python) = python("tiny_deepseek_v3_capture_verifies_and_feeds_train_and_eval_loss") else { return };
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("deepseek");
    let mut c = py(&python);
    c.args([s(&python_dir().join("tests/tiny_deepseek.py")), s(&target), &fixture::VOCAB.to_string()]);
    run_ok(c);
    fixture::write_tokenizer(&target, Some(fixture::CHATML));
    let prepared = prepare(dir.path(), &target, 6);
    let shards = dir.path().join("shards");
    let mut c =
        capture_cmd(&target, &prepared, &shards, &["--aux-layers", "1,2,3", "--teacher", "final-hidden+topk:8"]);
    c.args(["--engine", "transformers", "--python", s(&python)]);
    let report = ok_json(c.output().unwrap());
    assert_eq!(report["verified"]["samples"], 6, "{report}");
    let ds = ShardDataset::open(&shards).unwrap();
    let md = ds.metadata();
    assert_eq!((md.target_num_layers, md.hidden_size, md.target_vocab_size), (6, 64, fixture::VOCAB));
    assert_eq!(md.aux_layer_ids, vec![1, 2, 3]);

    // `aerie eval loss` reads it as it reads a native capture: a random drafter shaped for the
    // target, the target's own head.
    let drafter = dir.path().join("drafter");
    let cfg = aerie_model::DrafterConfig {
        hidden_size: 64,
        target_hidden_size: 64,
        intermediate_size: 128,
        num_attention_heads: 4,
        num_key_value_heads: 4,
        head_dim: 16,
        vocab_size: fixture::VOCAB,
        draft_vocab_size: 64,
        aux_layers: aerie_model::AuxLayers {
            ids: vec![1, 2, 3],
            convention: aerie_model::AuxConvention::OutputOfLayer,
        },
        ..aerie_model::checkpoint::synthetic::tiny_config()
    };
    let opts = aerie_model::checkpoint::SaveOptions { include_embedding: true, ..Default::default() };
    let weights = aerie_model::checkpoint::synthetic::random_drafter(&cfg, aerie_model::checkpoint::Dtype::F32, 5);
    aerie_model::checkpoint::save_drafter(&weights, &drafter, &opts).unwrap();
    let out = ok(aerie(&[
        "eval",
        "loss",
        "--drafter",
        s(&drafter),
        "--data",
        s(&shards),
        "--target-head",
        s(&target.join("model.safetensors")),
        "--ttt-length",
        "2",
        "--json",
    ]));
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["loss"].as_f64().unwrap().is_finite(), "{v}");

    // And `aerie train` trains on it: a fresh drafter from the DeepSeek-V3 config, a few steps.
    let vocab = dir.path().join("vocab.safetensors");
    ok(aerie(&["vocab", "build", s(&prepared), "--draft-vocab", "64", "--out", s(&vocab), "--json"]));
    let config = dir.path().join("train.toml");
    let run = dir.path().join("run");
    std::fs::write(
        &config,
        format!(
            "seed = 1\noutput_dir = {run:?}\nlog_every = 1\nttt_length = 2\n\n[data]\ntrain = [{shards:?}]\nbatch_tokens = 256\n\n\
             [init]\nkind = \"fresh\"\ntarget_config = {cfg:?}\nvocab = {vocab:?}\n\n[target]\npath = {target:?}\n\n\
             [init.shape]\naux_layer_ids = [1, 2, 3]\n\n[optim]\nlr = 1e-3\nwarmup_ratio = 0.1\nepochs = 1\n",
            run = s(&run),
            shards = s(&shards),
            cfg = s(&target.join("config.json")),
            vocab = s(&vocab),
            target = s(&target),
        ),
    )
    .unwrap();
    let summary: Value = serde_json::from_str(ok(aerie(&["train", s(&config), "--json"])).trim()).unwrap();
    println!("train on the DeepSeek-V3 capture: {summary}");
    assert_eq!(summary["status"], "completed", "{summary}");
    assert_eq!(summary["train_samples"], 6);
    assert!(summary["last_train"]["loss"].as_f64().is_some_and(f64::is_finite), "{summary}");
}

/// SmolLM2-135M-Instruct (the real asset, imported from its GGUF by `aerie import gguf`):
/// the transformers engine equals the native capture, f32, rel ≤ 1e-3. Skipped unless
/// `AERIE_TEST_ASSETS=1` (and the GGUF is cached: `aerie assets fetch smollm2`).
#[test]
fn real_assets_smollm2_transformers_engine_equals_the_native_capture() {
    if std::env::var("AERIE_TEST_ASSETS").map_or(true, |v| v != "1") {
        println!("note: skipped; set AERIE_TEST_ASSETS=1 to run it on the real files");
        return;
    }
    let Some(python) = python("real_assets_smollm2_transformers_engine_equals_the_native_capture") else { return };
    let home = std::env::var_os("AERIE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/aerie"));
    let gguf = home.join("assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !gguf.is_file() {
        println!("note: skipped: run `aerie assets fetch smollm2` first");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("smollm2");
    ok(aerie(&["import", "gguf", s(&gguf), "--out", s(&target)]));
    let prepared = prepare(dir.path(), &target, 6);
    let flags = ["--aux-layers", "1,14,26", "--dtype", "f32", "--teacher", "final-hidden+topk:8"];
    let native = dir.path().join("native");
    let t0 = Instant::now();
    let n = ok_json(capture_cmd(&target, &prepared, &native, &flags).output().unwrap());
    let native_secs = t0.elapsed().as_secs_f64();
    let hf = dir.path().join("hf");
    let mut c = capture_cmd(&target, &prepared, &hf, &flags);
    c.args(["--engine", "transformers", "--python", s(&python)]);
    let report = ok_json(c.output().unwrap());
    println!(
        "SmolLM2, {} tokens: native {:.0} tokens/s ({native_secs:.1} s with load), transformers {:.0} tokens/s",
        n["captured_tokens"],
        n["tokens_per_second"].as_f64().unwrap_or(0.0),
        report["tokens_per_second"].as_f64().unwrap_or(0.0)
    );
    assert_eq!(report["verified"]["samples"], 6);
    assert_equivalent(&native, &hf, 1e-3);
}

/// `aerie capture --engine transformers --self-test` on the random tiny Llama: the tiny
/// DeepSeek-V3 phase passes (aux = hooks, final = norm, exactly), and the real-sample phase
/// checks widths and finiteness and then fails, as it must, on the teacher's top-1: a random
/// model does not predict its data.
#[test]
fn self_test_passes_the_tiny_phase_and_refuses_a_model_that_predicts_nothing() {
    let Some(python) = python("self_test_passes_the_tiny_phase_and_refuses_a_model_that_predicts_nothing") else {
        return;
    };
    let (_dir, target, prepared) = tiny_setup(8);
    let mut c = aerie_cmd();
    c.args(["capture", "--engine", "transformers", "--self-test", "--python", s(&python)])
        .args(["--target", s(&target), "--data", s(&prepared), "--aux-layers", "0,1,2"])
        .env("OMP_NUM_THREADS", "1");
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(lines.len(), 2, "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!((&lines[0]["phase"], &lines[0]["ok"]), (&Value::from("tiny"), &Value::from(true)), "{}", lines[0]);
    assert_eq!(lines[0]["checks"]["transformers_aux_vs_hooks_rel"], 0.0);
    let real = &lines[1];
    assert_eq!((real["aux_width"].as_u64(), real["hidden_size"].as_u64()), (Some(3 * 64), Some(64)));
    assert!(real["top1_next_token"].as_f64().unwrap() < 0.3, "{real}");
    assert_eq!(real["ok"], false);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("self-test phase `all` failed"));
}

/// `aerie capture --engine` killed with SIGKILL takes its worker with it (PR_SET_PDEATHSIG):
/// a fake interpreter records its pid and sleeps; after aerie is killed it must be gone within
/// seconds, not left holding the dataset. Needs no Python.
#[cfg(target_os = "linux")]
#[test]
fn the_worker_dies_with_a_killed_aerie() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, target, prepared) = tiny_setup(2);
    let pid_file = dir.path().join("worker.pid");
    let fake = dir.path().join("fake-python");
    std::fs::write(&fake, format!("#!/bin/sh\necho $$ > '{}'\nexec sleep 120\n", pid_file.display())).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path().join("shards");
    // Aux layers the 4-layer target has (its default [1, 1, 0] is refused before any worker).
    let flags = ["--engine", "transformers", "--python", s(&fake), "--aux-layers", "0,1,2"];
    let mut child =
        capture_cmd(&target, &prepared, &out, &flags).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<u32>().ok()) {
            break pid;
        }
        assert!(child.try_wait().unwrap().is_none(), "aerie exited before starting the worker");
        assert!(t0.elapsed() < Duration::from_secs(60), "the worker never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap(); // SIGKILL: aerie cannot clean up, only the kernel's death signal acts
    child.wait().unwrap();
    // Gone, or a zombie waiting for init to reap it.
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|st| st.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
            .unwrap_or(false)
    };
    let t1 = Instant::now();
    while alive(pid) {
        assert!(t1.elapsed() < Duration::from_secs(10), "worker {pid} outlived the killed aerie by 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}
