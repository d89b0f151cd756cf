//! Running the `aerie` binary from the CLI tests: one thread for rayon (deterministic float
//! reductions, and fair to the other tests running beside it), failures with the binary's stderr.
#![allow(dead_code)]

pub mod refusal;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The binary under test, not yet started.
pub fn aerie_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_aerie"));
    c.env("RAYON_NUM_THREADS", "1");
    c
}

/// Run the binary to completion.
pub fn aerie(args: &[&str]) -> Output {
    aerie_cmd().args(args).output().expect("run aerie")
}

/// `aerie <command> --target <target> --data <data> --out <out>` and `flags`, not yet started.
pub fn aerie_run(command: &str, target: &Path, data: &Path, out: &Path, flags: &[&str]) -> Command {
    let mut c = aerie_cmd();
    c.args([command, "--target", s(target), "--data", s(data), "--out", s(out)]).args(flags);
    c
}

/// Its stdout, after asserting success (stderr in the failure message).
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "aerie failed ({}):\n{}\nstdout:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("UTF-8 stdout")
}

/// Its stdout as one JSON object, after asserting success.
pub fn ok_json(out: Output) -> Value {
    serde_json::from_str(ok(out).trim()).expect("one JSON object on stdout")
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// `$AERIE_PYTHON`, or `None` (with a note) when unset; under `CI=true` an unset variable fails.
pub fn python(test: &str) -> Option<PathBuf> {
    match std::env::var_os("AERIE_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: AERIE_PYTHON is unset but CI=true: CI must run the Python checks (.ci/run sets it)")
        }
        None => {
            println!("note: {test} skipped: set AERIE_PYTHON to a Python with python/requirements-test.txt installed");
            None
        }
    }
}

/// Start a `regenerate` writing `out` and SIGKILL it once its first record is durable (a line
/// in `out.partial`): a run cut off mid-way, for the resume tests. The file is not published.
pub fn kill_once_a_record_is_durable(mut regenerate: Command, out: &Path) {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let partial = PathBuf::from(format!("{}.partial", out.display()));
    let mut child = regenerate.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    while std::fs::read_to_string(&partial).map_or(0, |t| t.lines().count()) < 1 {
        assert!(t0.elapsed() < Duration::from_secs(300), "no record written");
        assert!(child.try_wait().unwrap().is_none(), "finished before it could be killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.exists());
}

/// The rows as f32.
pub fn f32_rows(rows: aerie_data::shard::HiddenRows<'_>) -> Vec<f32> {
    rows.to_f32().into_owned()
}

/// max |a-b| / max |b|: the relative error the capture comparisons state.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max).max(1e-12);
    diff / scale
}

/// How far one capture is from another of the same samples: worst aux and final-hidden relative
/// error, worst top-k log-prob absolute error, and top-1 agreement on the rows whose reference
/// top-1 leads by more than 1e-3 (near ties may swap in any engine).
#[derive(Debug)]
pub struct Parity {
    pub aux: f64,
    pub fin: f64,
    pub logprob: f64,
    pub top1_agree: f64,
}

/// Compare the capture in `other` with `reference`: every metadata key but `created_by` equal
/// (`other`'s must start with `created_by`), the same samples, ids, masks and shard boundaries
/// (asserted); the figures returned.
pub fn capture_parity(reference: &Path, other: &Path, created_by: &str) -> Parity {
    use aerie_data::shard::ShardDataset;
    let (a, b) = (ShardDataset::open(reference).unwrap(), ShardDataset::open(other).unwrap());
    let (mut ma, mut mb) = (a.metadata().to_map(), b.metadata().to_map());
    assert!(mb["created_by"].starts_with(created_by), "{}", mb["created_by"]);
    ma.remove("created_by");
    mb.remove("created_by");
    assert_eq!(ma, mb, "metadata (every key but created_by)");
    assert_eq!(a.len(), b.len());
    assert_eq!(a.manifest().shards.len(), b.manifest().shards.len(), "same shard boundaries");
    let (mut aux, mut fin, mut logprob) = (0f64, 0f64, 0f64);
    let (mut agree, mut rows) = (0usize, 0usize);
    for i in 0..a.len() {
        let (x, y) = (a.sample(i).unwrap(), b.sample(i).unwrap());
        assert_eq!(x.sample_id(), y.sample_id(), "sample {i}: id");
        assert_eq!(x.input_ids(), y.input_ids(), "sample {i}: input ids");
        assert_eq!(x.loss_mask(), y.loss_mask(), "sample {i}: loss mask");
        aux = aux.max(rel_err(&f32_rows(y.aux_hidden()), &f32_rows(x.aux_hidden())));
        if let (Some(fx), Some(fy)) = (x.final_hidden(), y.final_hidden()) {
            fin = fin.max(rel_err(&f32_rows(fy), &f32_rows(fx)));
        }
        if let (Some(tx), Some(ty)) = (x.topk(), y.topk()) {
            let (lx, ly, k) = (tx.logprobs(), ty.logprobs(), tx.k());
            for (t, (rx, ry)) in lx.chunks(k).zip(ly.chunks(k)).enumerate() {
                for (p, q) in rx.iter().zip(ry) {
                    logprob = logprob.max((p - q).abs() as f64);
                }
                if k > 1 && rx[0] - rx[1] > 1e-3 {
                    rows += 1;
                    agree += usize::from(tx.ids()[t * k] == ty.ids()[t * k]);
                }
            }
        }
    }
    Parity { aux, fin, logprob, top1_agree: agree as f64 / rows.max(1) as f64 }
}

/// The tiny synthetic drafter (`tiny_config`, embedding included, seed 1) in `root/drafter` and a
/// target head `[V, Ht]` of fixed values in `root/head.safetensors`: the pair the offline
/// evaluation tests run on.
pub fn tiny_drafter_and_head(root: &Path) -> (PathBuf, PathBuf) {
    use aerie_model::checkpoint::io::write_safetensors;
    use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
    use aerie_model::checkpoint::{Dtype, HostTensor, SaveOptions, save_drafter};
    let cfg = tiny_config();
    let drafter = root.join("drafter");
    let opts = SaveOptions { include_embedding: true, ..SaveOptions::default() };
    save_drafter(&random_drafter(&cfg, Dtype::F32, 1), &drafter, &opts).unwrap();
    let (v, ht) = (cfg.vocab_size, cfg.target_hidden_size);
    let vals: Vec<f32> = (0..v * ht).map(|i| ((i * 7919 % 1000) as f32 / 1000.0) - 0.5).collect();
    let head = root.join("head.safetensors");
    write_safetensors(&head, [("lm_head.weight", &HostTensor::from_f32(vec![v, ht], &vals, Dtype::F32))]).unwrap();
    (drafter, head)
}

/// Shard metadata of a capture from the tiny synthetic target of [`tiny_drafter_and_head`] (10
/// layers, aux [1, 4, 6], f32 features, final-hidden teacher), of ids of `tokenizer_digest`.
pub fn tiny_shard_metadata(tokenizer_digest: &str) -> aerie_data::shard::ShardMetadata {
    use aerie_data::shard::{AuxConvention, HiddenDtype, ShardMetadata, Teacher};
    let cfg = aerie_model::checkpoint::synthetic::tiny_config();
    ShardMetadata {
        target: "synthetic/tiny-target".into(),
        target_num_layers: 10,
        target_vocab_size: cfg.vocab_size,
        aux_layer_ids: vec![1, 4, 6],
        aux_convention: AuxConvention::OutputOfLayer,
        hidden_size: cfg.target_hidden_size,
        dtype: HiddenDtype::F32,
        tokenizer_digest: tokenizer_digest.into(),
        chat_template: "none".into(),
        teacher: Teacher::FinalHidden,
        created_by: "aerie-cli tests".into(),
        extra: Default::default(),
    }
}

/// An acceptance profile (issue 46 §3) as every τ report carries it: `k` positions, τ = 1 + Σ
/// marginal, and τ by output position whose buckets partition the `cycles`, or the reason there
/// are none. Returns whether the buckets were measured.
pub fn check_profile(p: &Value, k: usize, cycles: u64) -> bool {
    let marginal: Vec<f64> =
        p["marginal_accept_rates"].as_array().expect("a profile").iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(marginal.len(), k, "{p}");
    assert_eq!(p["conditional_accept_rates"].as_array().unwrap().len(), k, "{p}");
    let tau = p["mean_accept_length"].as_f64().unwrap();
    assert!((tau - 1.0 - marginal.iter().sum::<f64>()).abs() < 1e-9, "{p}");
    assert_eq!(p["cycles"].as_f64(), Some(cycles as f64), "{p}");
    match p.get("output_position_buckets_unavailable") {
        Some(why) => {
            assert!(why.as_str().is_some_and(|w| !w.is_empty()), "{p}");
            assert_eq!(p["output_position_buckets"].as_array().map(Vec::len), Some(0), "{p}");
            false
        }
        None => {
            let b = p["output_position_buckets"].as_array().unwrap();
            assert_eq!(b.len(), 4, "{p}");
            assert_eq!(b.iter().map(|b| b["cycles"].as_u64().unwrap()).sum::<u64>(), cycles, "{p}");
            true
        }
    }
}
