//! `aerie capture --engine sglang` against the real SGLang (0.5.23 through `$AERIE_SGLANG_PYTHON`;
//! skipped with a note without it, failing when `CI=true`), at tp 1 on the CPU: SGLang's own
//! `ModelRunner` in the worker's process (python/aerie_capture/engines/sglang.py) with SGLang's CPU
//! engine, the `torch_native` attention backend (prefill only) and the test-only `sgl_kernel`
//! stand-in (python/tests/sglang_cpu) on the path; the same engine serves GPUs at tp 8 with
//! `--sglang-device cuda` (the default) under torchrun, which cannot run here.
//!
//! SmolLM2 (the assets' GGUF imported by aerie) on its own MT-Bench answers: the SGLang capture
//! equals the transformers engine's (f32: aux, final and top-k log-probs within 1e-3, top-1 ids
//! equal where not tied, every metadata key but `created_by`, the same samples and shard
//! boundaries), its shards verify, and `aerie capture` killed with SIGKILL mid-capture (aerie and
//! its worker, the whole process group) then run again resumes to the uninterrupted shards byte
//! for byte. Three SGLang worker starts of about 30 s each.

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use aerie_data::shard::ShardDataset;
use common::{aerie_run, capture_parity, ok_json, s};
use engine::{
    Engine, SMOLLM2_CAPTURE_FLAGS, engine_python, kill_group_after_shards, sglang_env, smollm2, smollm2_data,
};

/// How an SGLang capture names itself in `created_by`.
const SGLANG_CREATED_BY: &str = "aerie-capture 0.1.0 (sglang 0.5.23, tp1, cpu, torch_native";

/// The worker flags of SGLang's CPU engine (f32, prefill attention in torch).
const SGLANG_CPU: [&str; 4] = [
    "--engine-arg=--sglang-device=cpu",
    "--engine-arg=--attention-backend=torch_native",
    "--engine-arg=--compute-dtype=f32",
    "--engine-arg=--mem-fraction-static=0.3",
];

/// `aerie capture` of `data` into `out` with `engine` through `python`, not yet started.
fn capture(python: &Path, engine: &str, target: &Path, data: &Path, out: &Path) -> Command {
    let mut c = aerie_run("capture", target, data, out, &["--json", "--engine", engine, "--python", s(python)]);
    c.args(SMOLLM2_CAPTURE_FLAGS);
    if engine == "sglang" {
        c.args(SGLANG_CPU);
    } else {
        c.args(["--engine-arg=--compute-dtype=f32"]);
    }
    sglang_env(&mut c);
    c
}

#[test]
fn smollm2_sglang_capture_equals_transformers_and_resumes_after_sigkill() {
    let test = "smollm2_sglang_capture_equals_transformers_and_resumes_after_sigkill";
    let Some(python) = engine_python(Engine::Sglang, test) else { return };
    let t_all = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let model = smollm2(dir.path());
    let data = smollm2_data(dir.path(), &model, 6);

    // The transformers engine (in SGLang's venv: its torch and transformers) is the reference.
    let reference = dir.path().join("transformers");
    ok_json(capture(&python, "transformers", &model, &data, &reference).output().unwrap());
    let full = dir.path().join("sglang");
    let t0 = Instant::now();
    let v = ok_json(capture(&python, "sglang", &model, &data, &full).output().unwrap());
    println!("SGLang capture of {} tokens in {:.0} s with its start", v["captured_tokens"], t0.elapsed().as_secs_f64());
    assert_eq!(v["engine"], "sglang");
    let p = capture_parity(&reference, &full, SGLANG_CREATED_BY);
    println!("SmolLM2 transformers vs SGLang (f32): {p:?}");
    assert!(p.aux <= 1e-3 && p.fin <= 1e-3 && p.logprob <= 1e-3, "{p:?}");
    assert_eq!(p.top1_agree, 1.0, "top-1 ids equal where not tied: {p:?}");
    let full_ds = ShardDataset::open(&full).unwrap();
    full_ds.verify().unwrap();
    assert!(full_ds.num_shards() >= 4, "{} shards: too few for a kill in the middle", full_ds.num_shards());

    // `aerie capture` and its SGLang worker killed with SIGKILL once two shards are committed,
    // then run again: it resumes to the same bytes.
    let cut = dir.path().join("cut");
    let mut c = capture(&python, "sglang", &model, &data, &cut);
    c.stdout(Stdio::null()).stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let mut child = c.spawn().unwrap();
    kill_group_after_shards(&mut child, &cut, 2);
    let before = ShardDataset::open(&cut).unwrap().len();
    assert!(before < full_ds.len(), "killed after the end");
    let r = ok_json(capture(&python, "sglang", &model, &data, &cut).output().unwrap());
    assert_eq!(r["resumed_samples"].as_u64(), Some(before as u64), "{r}");
    let cut_ds = ShardDataset::open(&cut).unwrap();
    cut_ds.verify().unwrap();
    assert_eq!(full_ds.manifest().shards.len(), cut_ds.manifest().shards.len());
    for (a, b) in full_ds.manifest().shards.iter().zip(&cut_ds.manifest().shards) {
        assert_eq!((a.samples, a.tokens, &a.sha256), (b.samples, b.tokens, &b.sha256), "{}: bytes differ", a.file);
    }
    println!("SGLang capture test in {:.0} s", t_all.elapsed().as_secs_f64());
}
