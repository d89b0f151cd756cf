//! The GPU code path without a GPU: `train`, `eval loss`, `eval accept` and `eval decode` on
//! burn's CubeCL backend (`--device wgpu:0`; in CI Mesa's software Vulkan driver, lavapipe)
//! against the same commands on the CPU (burn-flex and aerie's host kernels), and checkpoints
//! carried between the two. CubeCL's kernels, fusion, autotune and device-resident tensors are
//! what the CUDA backend runs too, so a failure here is one a GPU run would hit.
//!
//! Tolerances (f32 on both backends; the sums are associated differently, nothing else differs):
//! per-step training loss within 1e-4 relative over 4 AdamW steps, checkpoint weights within
//! 1e-4 absolute (lr 1e-3: Adam's first updates turn rounding in gradients near zero into a
//! fraction of lr), `eval loss` metrics within 1e-5 relative, τ of `eval accept` and `eval
//! decode` equal (greedy acceptance is an argmax: equal unless two logits tie within rounding).
//!
//! Without a Vulkan driver the tests skip with a note, except under `CI=true` (`.ci/run`
//! installs lavapipe), where they fail.
//!
//! Time (2026-12-04, the four tests of this binary, two at a time, on the shared 2-core machine
//! under load 6-12, so upper bounds): 580 s wall and 637 CPU-s with an empty autotune cache,
//! 520 CPU-s with the cache of an earlier run; 826 CPU-s before samples of few shapes and 4
//! training steps instead of 6. Most of it is lavapipe compiling kernels (once per process and
//! device, and per new shape), not arithmetic; `GALLIVM_PERF=nopt` (LLVM without optimisation)
//! made eval loss and accept slower (141 against 82 CPU-s): the kernels then run slower.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;
#[path = "../../aerie-train/tests/train/common.rs"]
mod world;

use std::path::{Path, PathBuf};

use common::s;
use serde_json::Value;

/// Cubecl settings of every wgpu run here: the fewest autotune candidates (cubecl has no run-time
/// switch to turn autotune off; benchmarking on a software device is what made first calls 10-30x
/// slower) and one `$AERIE_HOME`, so one cubecl autotune cache (`$AERIE_HOME/cubecl`, an
/// append-only file cubecl locks across processes) for every test of the binary and every later
/// run of it: the tests' worlds share their shapes, so a shape tuned once is tuned for all. It
/// lives in the target directory, which CI keeps between runs (`CARGO_TARGET_TMPDIR`).
fn aerie_wgpu(args: &[&str]) -> std::process::Output {
    common::aerie_cmd()
        .env("CUBECL_AUTOTUNE_LEVEL", "minimal")
        .env("AERIE_HOME", Path::new(env!("CARGO_TARGET_TMPDIR")).join("wgpu-aerie-home"))
        .args(args)
        .output()
        .expect("run aerie")
}

/// Whether wgpu finds an adapter: `false` (with a note) when it does not, outside CI.
fn have_wgpu(test: &str, out: &std::process::Output) -> bool {
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !err.contains("no wgpu adapter found") {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: no wgpu adapter but CI=true: CI must run the CubeCL path (.ci/run installs lavapipe):\n{err}");
    }
    println!("note: {test} skipped: no wgpu adapter (install mesa-vulkan-drivers and libvulkan1): {err}");
    false
}

/// The training world of aerie-train's tests with samples of 14 or 16 tokens: two micro-batch
/// shapes instead of a dozen. On lavapipe every new shape costs its kernels' compilation and
/// autotune (20-100 s each under load), which is most of these tests' time, not arithmetic.
fn few_shapes_world() -> world::World {
    world::world_of(Default::default(), world::Lengths::FewShapes)
}

/// Stdout as JSON after asserting success.
fn json(out: std::process::Output, what: &str) -> Value {
    assert!(out.status.success(), "{what} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

/// Training losses of metrics.jsonl by step.
fn losses(run: &Path) -> Vec<(u64, f64)> {
    world::metrics_lines(run)
        .iter()
        .filter(|l| l["kind"] == "train")
        .map(|l| (l["step"].as_u64().unwrap(), l["loss"].as_f64().unwrap()))
        .collect()
}

/// The largest absolute difference between two checkpoints' f32 tensors, after checking they
/// hold the same names.
fn max_weight_diff(a: &Path, b: &Path) -> f32 {
    let (ta, tb) = (world::tensors(a), world::tensors(b));
    assert_eq!(ta.iter().map(|t| &t.0).collect::<Vec<_>>(), tb.iter().map(|t| &t.0).collect::<Vec<_>>());
    let mut worst = 0f32;
    for ((name, x), (_, y)) in ta.iter().zip(&tb) {
        if name == "d2t" || name == "t2d" {
            assert_eq!(x, y, "{name}");
            continue;
        }
        for (p, q) in world::f32s(x).iter().zip(world::f32s(y)) {
            worst = worst.max((p - q).abs());
        }
    }
    worst
}

/// A copy of run `from` (its checkpoints and metrics) without its last checkpoint, to resume.
fn cut_after_first_checkpoint(from: &Path, to: &Path, last: &str) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_name() == last {
            continue;
        }
        if src.is_dir() {
            cut_after_first_checkpoint(&src, &dst, "");
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// 394 s under load 6-12 (train 4 steps on wgpu:0 alone 251 s), 417 s with 6 steps before.
#[test]
fn train_and_eval_on_wgpu_match_the_cpu_and_checkpoints_cross_devices() {
    let w = few_shapes_world();
    let cfg = w.path("train.toml");
    let top = "save_every = 2\nkeep_last = 2\neval_every = 0";
    std::fs::write(&cfg, world::config_text(&w, "unused", top, "max_steps = 4")).unwrap();
    let train = |out: &str, device: &str, resume: Option<&Path>| {
        let out_dir = format!("output_dir=\"{}\"", w.path(out).display());
        let mut args = vec!["train", s(&cfg), "--set", &out_dir, "--set", "data.eval=[]", "--device", device, "--json"];
        if let Some(r) = resume {
            args.extend(["--resume", s(r)]);
        }
        aerie_wgpu(&args)
    };

    // bf16 is refused up front on wgpu, naming the reason (burn-wgpu would panic at the first cast).
    let bf16 = aerie_wgpu(&["train", s(&cfg), "--set", "precision=\"bf16\"", "--device", "wgpu:0"]);
    assert!(!bf16.status.success());
    assert!(String::from_utf8_lossy(&bf16.stderr).contains("wgpu has no bf16"), "{bf16:?}");

    let t0 = std::time::Instant::now();
    let on_wgpu = train("wgpu", "wgpu:0", None);
    if !have_wgpu("train on wgpu", &on_wgpu) {
        return;
    }
    let wgpu_s = t0.elapsed().as_secs_f64();
    let on_wgpu = json(on_wgpu, "train on wgpu:0");
    let t0 = std::time::Instant::now();
    let on_cpu = json(train("cpu", "cpu", None), "train on cpu");
    let cpu_s = t0.elapsed().as_secs_f64();
    println!("train 4 steps: wgpu:0 {wgpu_s:.1} s, cpu {cpu_s:.1} s (processes, start-up included)");
    assert_eq!((on_wgpu["steps"].as_u64(), on_cpu["steps"].as_u64()), (Some(4), Some(4)));
    let (lw, lc) = (losses(&w.path("wgpu")), losses(&w.path("cpu")));
    assert_eq!(lw.len(), 4);
    for ((step, a), (_, b)) in lw.iter().zip(&lc) {
        assert!(rel(*a, *b) < 1e-4, "step {step}: loss {a} on wgpu, {b} on the CPU");
    }
    let ck = |run: &str, step: u32| w.path(run).join(format!("checkpoint-{step}"));
    let d = max_weight_diff(&ck("wgpu", 4), &ck("cpu", 4));
    assert!(d < 1e-4, "weights after 4 steps differ by {d:e}");

    // A checkpoint written on one device resumed on the other: steps 3-4 as the straight run's.
    for (from, to, device) in [("cpu", "cpu-then-wgpu", "wgpu:0"), ("wgpu", "wgpu-then-cpu", "cpu")] {
        cut_after_first_checkpoint(&w.path(from), &w.path(to), "checkpoint-4");
        let resumed = json(train(to, device, Some(&w.path(to))), &format!("resume of {from} on {device}"));
        assert_eq!(resumed["steps"].as_u64(), Some(4));
        assert!(resumed["resumed_from"].as_str().unwrap().ends_with("checkpoint-2"), "{resumed}");
        let d = max_weight_diff(&ck(to, 4), &ck(from, 4));
        assert!(d < 1e-4, "{from} resumed on {device}: weights differ by {d:e}");
        for ((step, a), (_, b)) in losses(&w.path(to)).iter().zip(&losses(&w.path(from))) {
            assert!(rel(*a, *b) < 1e-4, "{from} resumed on {device}, step {step}: loss {a} vs {b}");
        }
    }
}

/// 169 s under load 6-12 (260 s on samples of 8-24 tokens).
#[test]
fn eval_loss_and_accept_on_wgpu_match_the_cpu() {
    let w = few_shapes_world();
    let cfg = w.path("train.toml");
    std::fs::write(&cfg, world::config_text(&w, "cpu", "save_every = 0\neval_every = 0", "max_steps = 6")).unwrap();
    let trained = json(aerie_wgpu(&["train", s(&cfg), "--set", "data.eval=[]", "--json"]), "train on cpu");
    let drafter = PathBuf::from(trained["final_checkpoint"].as_str().unwrap());
    // eval loss and eval accept of the trained drafter on held-out shards, on both devices.
    let pass = ["--drafter", s(&drafter), "--data", s(&w.eval), "--target-head", s(&w.target_dir), "--json"];
    let loss = |device: &str| {
        json(
            aerie_wgpu(&[&["eval", "loss"], &pass[..], &["--ttt-length", "3", "--device", device]].concat()),
            "eval loss",
        )
    };
    let (lw, lc) = (loss("wgpu:0"), loss("cpu"));
    assert_eq!(lw["tokens"], lc["tokens"]);
    for key in ["loss", "simulated_accept_length"] {
        let (a, b) = (lw[key].as_f64().unwrap(), lc[key].as_f64().unwrap());
        assert!(rel(a, b) < 1e-5, "eval loss {key}: {a} on wgpu, {b} on the CPU");
    }
    for key in ["loss_per_step", "acc_per_step"] {
        for (a, b) in lw[key].as_array().unwrap().iter().zip(lc[key].as_array().unwrap()) {
            assert!(rel(a.as_f64().unwrap(), b.as_f64().unwrap()) < 1e-5, "eval loss {key}: {a} vs {b}");
        }
    }
    let accept = |device: &str| {
        json(aerie_wgpu(&[&["eval", "accept"], &pass[..], &["--k", "3", "--device", device]].concat()), "eval accept")
    };
    let (aw, ac) = (accept("wgpu:0"), accept("cpu"));
    assert_eq!(aw["tau"], ac["tau"], "τ on wgpu and on the CPU");
    assert_eq!(aw["curve"], ac["curve"]);
    assert!(ac["tau"].as_f64().unwrap() >= 1.0);
}

/// Steps of the data-parallel test: enough to pass step 21, where replicas in threads of their
/// own first went wrong (below).
const DP_STEPS: u64 = 24;

/// Data parallelism on the CubeCL path, against one device accumulating the same two
/// micro-batches per step, over [`DP_STEPS`] steps:
/// - `--devices wgpu:0,wgpu:0` (two replicas on one device, one after the other, through the CLI);
/// - two distinct wgpu devices, one thread per replica ([`train_on_two_wgpu_devices`]).
///
/// The exchange adds g₀ + g₁ in the order one device accumulates them, so the weights come out
/// bit for bit equal; the bound allowed is dp.rs's 1e-5 absolute (1% of lr 1e-3: Adam's first
/// updates turn gradient rounding near zero into a fraction of lr). Losses within 1e-5 relative.
/// `wgpu:1` alone is refused where the machine has one adapter (lavapipe). 187 s alone on the
/// 2-core machine (2026-12-06), most of it kernel compilation for each of the four devices' runs.
#[test]
fn data_parallel_replicas_on_wgpu_match_one_device() {
    let w = few_shapes_world();
    let cfg = w.path("train.toml");
    let steps = format!("max_steps = {DP_STEPS}");
    std::fs::write(&cfg, world::config_text(&w, "unused", "save_every = 0\neval_every = 0", &steps)).unwrap();
    let train = |out: &str, devices: &[&str], accumulation: u32| {
        let out_dir = format!("output_dir=\"{}\"", w.path(out).display());
        let acc = format!("optim.grad_accumulation={accumulation}");
        let mut args = vec!["train", s(&cfg), "--set", &out_dir, "--set", &acc, "--set", "data.eval=[]", "--json"];
        args.extend(devices);
        aerie_wgpu(&args)
    };
    let one = train("one", &["--device", "wgpu:0"], 2);
    if !have_wgpu("train on wgpu:0", &one) {
        return;
    }
    let one = json(one, "train on wgpu:0 accumulating 2");
    // wgpu:1 alone on a machine with one adapter (lavapipe): refused, naming what there is.
    let second = train("second", &["--device", "wgpu:1"], 1);
    let err = String::from_utf8_lossy(&second.stderr);
    if err.contains("wgpu adapter(s)") {
        assert_eq!(second.status.code(), Some(1), "{err}");
        assert!(err.contains("wgpu:1: this machine has 1 wgpu adapter(s)"), "{err}");
    }
    let two = json(train("two", &["--devices", "wgpu:0,wgpu:0"], 1), "train on wgpu:0,wgpu:0");
    assert_eq!((one["steps"].as_u64(), two["steps"].as_u64()), (Some(DP_STEPS), Some(DP_STEPS)));
    let notes: Vec<&str> = two["notes"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(notes.contains(&"2 replicas, gradients summed by the host all-reduce"), "{notes:?}");
    let final_ck = |v: &Value| PathBuf::from(v["final_checkpoint"].as_str().unwrap());
    let threads = train_on_two_wgpu_devices(&cfg, &w.path("threads"));
    let lo = losses(&w.path("one"));
    assert_eq!(lo.len() as u64, DP_STEPS);
    for (run, checkpoint) in [("two", final_ck(&two)), ("threads", threads)] {
        for ((step, a), (_, b)) in lo.iter().zip(&losses(&w.path(run))) {
            assert!(rel(*a, *b) < 1e-5, "{run}, step {step}: loss {a} on one device, {b} on two replicas");
        }
        let d = max_weight_diff(&final_ck(&one), &checkpoint);
        println!("wgpu:0 x 2 micro-batches vs {run} x 1: weights differ by up to {d:e} after {DP_STEPS} steps");
        assert!(d < 1e-5, "{run}: weights after {DP_STEPS} steps differ by {d:e}");
    }
}

/// Train `cfg` (one micro-batch per replica and step) on two distinct wgpu devices, in this
/// process, and return the final checkpoint. On lavapipe, CI's only adapter, burn's
/// `WgpuDevice::DefaultDevice` and `WgpuDevice::Cpu` are two wgpu devices on it, each with its
/// own queue, memory and CubeCL server, as two GPUs are; the CLI cannot name them (`wgpu:N` is
/// the N-th adapter), hence the library call. The replicas run in one thread each: before those
/// threads ran on the trainer's burn stream (`aerie_train`'s `fan_out`), step 21's loss came out
/// 1.52 away from one device's and the run ended refusing to save replicas that had drifted apart
/// (issue 47), while the same two devices driven in turn from one thread were exact.
#[cfg(feature = "wgpu")]
fn train_on_two_wgpu_devices(cfg: &Path, out: &Path) -> PathBuf {
    use burn::backend::wgpu::WgpuDevice;
    use burn::backend::{Autodiff, Wgpu};
    use cubecl_runtime::config::autotune::AutotuneLevel;
    use cubecl_runtime::config::cache::CacheConfig;
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};
    // The CLI's cubecl settings (`aerie_wgpu`): its autotune cache, the fewest candidates.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wgpu-aerie-home").join("cubecl");
    let mut config = CubeClRuntimeConfig::default();
    config.compilation.cache = Some(CacheConfig::File(cache.clone()));
    config.autotune.cache = CacheConfig::File(cache);
    config.autotune.level = AutotuneLevel::Minimal;
    CubeClRuntimeConfig::set(config);
    let set = |k: &str, v: String| (k.to_owned(), v);
    let overrides = [
        set("output_dir", format!("\"{}\"", out.display())),
        set("optim.grad_accumulation", "1".into()),
        set("data.eval", "[]".into()),
    ];
    let cfg = aerie_train::TrainConfig::load(cfg, &overrides).unwrap();
    let devices = vec![WgpuDevice::DefaultDevice, WgpuDevice::Cpu];
    let opts = aerie_train::RunOptions::<Autodiff<Wgpu>> { devices, resume: None, all_reduce: None, selector: None };
    let summary = aerie_train::train(&cfg, &opts, &mut |_| std::ops::ControlFlow::Continue(()))
        .unwrap_or_else(|e| panic!("training on two wgpu devices: {e}"));
    assert_eq!(summary.steps, DP_STEPS);
    assert!(
        summary.notes.iter().any(|n| n == "2 replicas, gradients summed by the host all-reduce"),
        "{:?}",
        summary.notes
    );
    summary.final_checkpoint.expect("a completed run has a final checkpoint")
}

#[cfg(not(feature = "wgpu"))]
fn train_on_two_wgpu_devices(_: &Path, _: &Path) -> PathBuf {
    unreachable!("the wgpu tests run only with the wgpu feature (aerie-cli's default)")
}

/// A drafter for the capture fixture's target (as crates/aerie-cli/tests/decode.rs writes it).
fn write_drafter(dir: &Path) {
    use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
    use aerie_model::checkpoint::{Dtype, SaveOptions, save_drafter};
    use aerie_model::{AuxConvention, AuxLayers};
    let mut cfg = tiny_config();
    (cfg.hidden_size, cfg.target_hidden_size, cfg.intermediate_size, cfg.head_dim) = (32, 32, 48, 8);
    cfg.vocab_size = fixture::VOCAB;
    cfg.draft_vocab_size = 64;
    cfg.aux_layers = AuxLayers { ids: vec![0, 1, 2], convention: AuxConvention::OutputOfLayer };
    let opts = SaveOptions { include_embedding: false, ..SaveOptions::default() };
    save_drafter(&random_drafter(&cfg, Dtype::F32, 3), dir, &opts).unwrap();
}

/// 200 s under load 6-12 (284 s before; its world is the capture fixture's, unchanged).
#[test]
fn eval_decode_on_wgpu_matches_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let target: PathBuf = root.join("target");
    fixture::write_target(&target, 32, 4, 21);
    let drafter = root.join("drafter");
    write_drafter(&drafter);
    let prompts = root.join("prompts.jsonl");
    std::fs::write(&prompts, "{\"turns\": [\"Say hi.\", \"Again?\"]}\n{\"prompt\": \"Why?\"}\n").unwrap();
    let decode = |device: &str| {
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
            "--device",
            device,
            "--json",
        ];
        aerie_wgpu(&args)
    };
    let on_wgpu = decode("wgpu:0");
    if !have_wgpu("eval decode on wgpu", &on_wgpu) {
        return;
    }
    let (vw, vc) = (json(on_wgpu, "eval decode on wgpu:0"), json(decode("cpu"), "eval decode on cpu"));
    assert_eq!(vw["greedy_identical"], true, "{vw}");
    assert_eq!(vw["answers"], 3);
    assert_eq!(vw["tau"], vc["tau"], "τ on wgpu and on the CPU");
    assert_eq!(vw["curve"], vc["curve"]);
    assert_eq!(vw["plain"]["tokens"], vc["plain"]["tokens"]);
}
