//! What a user feeds aerie never loses data or brings it down (docs/reliability.md), each case
//! with two real `aerie` processes or a real bad file: the refusal's exit code, that its message
//! names the file or option and the problem, and that the output on disk is unchanged (every
//! byte of the scratch directory before and after).

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aerie_data::shard::ShardDataset;
use aerie_model::checkpoint::io::write_safetensors;
use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
use aerie_model::checkpoint::{Dtype, HostTensor, SaveOptions, save_drafter};
use common::refusal::{
    Shards, kill, patch_first_shard, patch_tensor, refused, snapshot, start_and_freeze, tensor_names,
};
use common::{aerie, aerie_cmd, aerie_run, ok, ok_json, s};

#[test]
fn a_second_regenerate_into_one_out_is_refused_and_a_killed_holder_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, 128, 4, 8);
    let data = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&data, &fixture::conversations(12));
    let run = |out: &Path| aerie_run("regenerate", &target, &data, out, &["--max-new-tokens", "24", "--json"]);
    let full = dir.path().join("full.jsonl");
    ok_json(run(&full).output().unwrap());
    let want = std::fs::read(&full).unwrap();

    let out = dir.path().join("regen.jsonl");
    let lock = dir.path().join(".regen.jsonl.aerie-lock");
    let first = start_and_freeze(run(&out), &lock);
    let before = snapshot(dir.path());
    refused(run(&out).output().unwrap(), &[s(&out), &format!("pid {}", first.id()), "another process"]);
    assert_eq!(snapshot(dir.path()), before, "the refused run changed files");

    // The holder dies without releasing anything: the next run takes its lock over and
    // resumes its partial output into the uninterrupted bytes.
    kill(first);
    ok_json(run(&out).output().unwrap());
    assert_eq!(std::fs::read(&out).unwrap(), want);
    assert!(!lock.exists(), "the lock beside the output is removed at the end");
}

#[test]
fn a_second_train_into_one_output_dir_is_refused() {
    let f = Shards::new();
    let data = f.write("data", 8, 1 << 20, &"0".repeat(64));
    let run = f.root().join("run");
    let slow = f.train_config("a.toml", &run, 1, 2000, &[&data], &[]);
    let other_seed = f.train_config("b.toml", &run, 2, 1, &[&data], &[]);
    let mut train = aerie_cmd();
    train.args(["train", s(&slow), "--json"]);
    let first = start_and_freeze(train, &f.root().join(".run.aerie-lock"));
    let before = snapshot(f.root());
    refused(aerie(&["train", s(&other_seed), "--json"]), &[s(&run), &format!("pid {}", first.id())]);
    assert_eq!(snapshot(f.root()), before, "the refused run changed files");
    kill(first);
    let summary: serde_json::Value =
        serde_json::from_str(ok(aerie(&["train", s(&other_seed), "--json"])).trim()).unwrap();
    assert_eq!(summary["status"], "completed", "{summary}");
}

#[test]
fn a_second_data_prepare_or_shards_convert_into_one_out_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_tokenizer(&target, Some(fixture::CHATML));
    let chats = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&chats, &fixture::conversations(40_000));
    let prepared = dir.path().join("prepared");
    let prepare = || {
        let mut c = aerie_cmd();
        c.args(["data", "prepare", "--data", s(&chats), "--tokenizer", s(&target), "--out", s(&prepared), "--json"]);
        c
    };
    let first = start_and_freeze(prepare(), &dir.path().join(".prepared.aerie-lock"));
    let before = snapshot(dir.path());
    refused(prepare().output().unwrap(), &[s(&prepared), &format!("pid {}", first.id())]);
    assert_eq!(snapshot(dir.path()), before);
    kill(first);
    ok_json(prepare().output().unwrap());

    let f = Shards::new();
    let src = f.write("src", 400, 40, &"0".repeat(64));
    let dst = f.root().join("dst");
    let convert = || {
        let mut c = aerie_cmd();
        c.args(["shards", "convert", s(&src), "--dtype", "fp8-e4m3", "--out", s(&dst), "--json"]);
        c
    };
    let first = start_and_freeze(convert(), &dst.join(".aerie-shard.lock"));
    let before = snapshot(f.root());
    refused(convert().output().unwrap(), &[s(&dst), &format!("pid {}", first.id())]);
    assert_eq!(snapshot(f.root()), before);
    kill(first);
    let report = ok_json(convert().output().unwrap());
    assert_eq!(report["tokens"], ok_json(aerie(&["shards", "verify", s(&src), "--json"]))["tokens"]);
}

#[test]
fn shards_convert_refuses_a_source_whose_checksum_fails() {
    let f = Shards::new();
    let src = f.write("src", 6, 30, &"0".repeat(64));
    let shard = patch_first_shard(&src, "aux_hidden", &0.25f32.to_le_bytes());
    let dst = f.root().join("dst");
    let err = refused(
        aerie(&["shards", "convert", s(&src), "--dtype", "bf16", "--out", s(&dst), "--json"]),
        &[s(&shard), "sha256"],
    );
    assert!(err.contains("manifest.json records"), "{err}");
    let shards: Vec<_> = std::fs::read_dir(&dst)
        .map(|d| d.map(|e| e.unwrap().file_name()).filter(|n| n.to_string_lossy().starts_with("shard-")).collect())
        .unwrap_or_default();
    assert!(shards.is_empty(), "a converted copy of the corrupt shard was written: {shards:?}");
}

/// A tiny target in `dir/target` and 24 conversations prepared into `dir/prepared`, half of
/// them held out (`eval`): two splits a capture can be pointed at.
fn target_and_two_splits(dir: &Path) -> (PathBuf, PathBuf) {
    let target = dir.join("target");
    fixture::write_target(&target, 32, 4, 3);
    let chats = dir.join("chat.jsonl");
    fixture::write_jsonl(&chats, &fixture::conversations(24));
    let prepared = dir.join("prepared");
    let args = ["--tokenizer", s(&target), "--out", s(&prepared), "--split", "eval=0.5", "--json"];
    ok_json(aerie(&[&["data", "prepare", "--data", s(&chats)][..], &args].concat()));
    (target, prepared)
}

#[test]
fn a_capture_resumed_with_another_split_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let (target, prepared) = target_and_two_splits(dir.path());
    let out = dir.path().join("capture");
    let capture = |split: &str| {
        aerie_run(
            "capture",
            &target,
            &prepared,
            &out,
            &["--aux-layers", "0,1,2", "--split", split, "--max-samples", "2", "--json"],
        )
        .output()
        .unwrap()
    };
    ok_json(capture("train"));
    let before = snapshot(dir.path());
    refused(capture("eval"), &[s(&out), "--split: \"train\" then, \"eval\" now"]);
    assert_eq!(snapshot(dir.path()), before);
    // The same options resume (nothing left to do).
    assert_eq!(ok_json(capture("train"))["resumed_samples"], 2);
}

/// Two captures through the Python worker into one dataset: the worker locks the dataset only
/// once it runs, so aerie holds the lock beside it from before its provenance check; the second
/// is refused before it records its inputs over the first's. The worker here is a stand-in
/// that only waits (no Python needed): the first capture holds its lock while it runs.
#[test]
fn a_second_python_capture_into_one_dataset_is_refused_before_it_records_anything() {
    let dir = tempfile::tempdir().unwrap();
    let (target, prepared) = target_and_two_splits(dir.path());
    let worker = dir.path().join("waiting-worker");
    std::fs::write(&worker, "#!/bin/sh\nexec sleep 120\n").unwrap();
    std::fs::set_permissions(&worker, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.path().join("capture");
    let capture = |split: &str| {
        let flags = ["--engine", "transformers", "--python", s(&worker), "--aux-layers", "0,1,2", "--split", split];
        aerie_run("capture", &target, &prepared, &out, &flags)
    };
    // The first holds its lock until its (stand-in) worker ends; wait until it has recorded its
    // inputs, which it does only once it holds the lock.
    let mut first = capture("train").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let options = out.join("capture-options.json");
    let start = Instant::now();
    while !options.exists() {
        assert!(first.try_wait().unwrap().is_none(), "the first capture ended early");
        assert!(start.elapsed() < Duration::from_secs(60), "{} not written in 60 s", options.display());
        std::thread::sleep(Duration::from_millis(5));
    }
    let recorded = std::fs::read_to_string(&options).unwrap();
    assert!(recorded.contains("\"split\": \"train\""), "{recorded}");
    let before = snapshot(dir.path());
    refused(capture("eval").output().unwrap(), &[s(&out), &format!("pid {}", first.id())]);
    assert_eq!(snapshot(dir.path()), before, "the refused capture changed files");
    // A native capture takes the same lock before its own check (it once took only the shard
    // writer's lock inside the dataset, which the Python worker had not taken yet).
    let mut native = aerie_run("capture", &target, &prepared, &out, &["--aux-layers", "0,1,2", "--split", "eval"]);
    refused(native.output().unwrap(), &[s(&out), &format!("pid {}", first.id())]);
    assert_eq!(snapshot(dir.path()), before, "the refused native capture changed files");
    kill(first);
}

/// The target a dataset was captured from is identified by a digest of its `config.json` and
/// weight headers, not by the name it was given: another spelling of the same target's path
/// resumes (and the dataset keeps its first name), another model under the same path is
/// refused.
#[test]
fn a_capture_resumed_through_another_target_of_the_same_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (target, prepared) = target_and_two_splits(dir.path());
    let out = dir.path().join("capture");
    let capture = |target: &Path, n: &str| {
        aerie_run("capture", target, &prepared, &out, &["--aux-layers", "0,1,2", "--max-samples", n, "--json"])
            .output()
            .unwrap()
    };
    ok_json(capture(&target, "2"));
    let alias = dir.path().join("alias");
    std::os::unix::fs::symlink(&target, &alias).unwrap();
    assert_eq!(ok_json(capture(&alias, "3"))["resumed_samples"], 2);
    assert_eq!(ShardDataset::open(&out).unwrap().metadata().target, s(&target));
    // Another model under the same path and name, of the same layer count, width and
    // vocabulary (so the same shard metadata): a wider MLP.
    let mut other = fixture::tiny_config(32, 4);
    other.inter = 64;
    fixture::write_model(&target, &other, 3, &[fixture::IM_END]);
    let before = snapshot(dir.path());
    refused(capture(&target, "4"), &[s(&out), "--target", "config and weight headers sha256"]);
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn training_on_datasets_of_other_tokenizers_is_refused_naming_both() {
    let f = Shards::new();
    let a = f.write("a", 4, 1 << 20, &"0".repeat(64));
    let b = f.write("b", 4, 1 << 20, &"1".repeat(64));
    let run = f.root().join("run");
    for (name, train, eval) in [("eval.toml", vec![&*a], vec![&*b]), ("two.toml", vec![&*a, &*b], vec![])] {
        let config = f.train_config(name, &run, 1, 1, &train, &eval);
        let before = snapshot(f.root());
        refused(
            aerie(&["train", s(&config), "--json"]),
            &[s(&a), s(&b), "tokenizer_digest", &"0".repeat(64), &"1".repeat(64)],
        );
        assert_eq!(snapshot(f.root()), before, "{name}");
    }
}

#[test]
fn an_input_id_outside_the_vocabulary_or_a_mask_of_two_is_an_error_not_a_panic() {
    let f = Shards::new();
    let cases = [
        (
            "ids-high",
            "input_ids",
            99_999i32.to_le_bytes().to_vec(),
            "input_ids[0] = 99999 is outside the target vocabulary",
        ),
        (
            "ids-negative",
            "input_ids",
            (-3i32).to_le_bytes().to_vec(),
            "input_ids[0] = -3 is outside the target vocabulary",
        ),
        ("mask-two", "loss_mask", vec![2u8], "loss_mask[0] = 2 is neither 0 nor 1"),
    ];
    for (name, tensor, bytes, problem) in cases {
        // Without checksums (as a program that records none writes it): only the values tell.
        let data = f.write_with(name, 3, 1 << 20, &"0".repeat(64), false);
        let shard = patch_first_shard(&data, tensor, &bytes);
        let before = snapshot(&data);
        refused(f.eval("loss", &data, &f.drafter, &[]), &[s(&shard), problem]);
        refused(f.eval("accept", &data, &f.drafter, &["--k", "2"]), &[s(&shard), problem]);
        let config =
            f.train_config(&format!("{name}.toml"), &f.root().join(format!("run-{name}")), 1, 1, &[&data], &[]);
        refused(aerie(&["train", s(&config), "--json"]), &[s(&shard), problem]);
        assert_eq!(snapshot(&data), before, "{name}");
    }
}

#[test]
fn a_drafter_with_a_nan_weight_is_refused_on_load_naming_the_tensor() {
    let f = Shards::new();
    let data = f.write("data", 3, 1 << 20, &"0".repeat(64));
    // A drafter another program saved with a NaN in one norm weight.
    let bad = f.root().join("nan-drafter");
    let opts = SaveOptions { include_embedding: true, ..SaveOptions::default() };
    save_drafter(&random_drafter(&tiny_config(), Dtype::F32, 1), &bad, &opts).unwrap();
    let weights = bad.join("model.safetensors");
    let name = tensor_names(&weights).into_iter().find(|k| k.contains("norm")).unwrap();
    patch_tensor(&weights, &name, 4, &f32::NAN.to_le_bytes());
    let before = snapshot(f.root());
    let problem = format!("`{name}`: element 1 is NaN");
    refused(f.eval("loss", &data, &bad, &[]), &[s(&bad), &problem]);
    refused(f.eval("accept", &data, &bad, &["--k", "2"]), &[s(&bad), &problem]);
    let out = f.root().join("export");
    refused(aerie(&["export", s(&bad), "--to", "sglang", "--out", s(&out), "--json"]), &[s(&bad), &problem]);
    assert_eq!(snapshot(f.root()), before);
}

#[test]
fn draft_sizes_past_their_limit_are_refused_with_the_limit() {
    let f = Shards::new();
    let data = f.write("data", 2, 1 << 20, &"0".repeat(64));
    let start = Instant::now();
    refused(f.eval("accept", &data, &f.drafter, &["--k", "100000"]), &["--k 100000", "limit of 64"]);
    let wide = ["--k", "3", "--topk", "100", "--tree-tokens", "8"];
    refused(f.eval("accept", &data, &f.drafter, &wide), &["topk 100", "limits of topk 64"]);
    // The draft vocabulary, unknown when the flags are checked, is not printed as usize::MAX.
    let err = refused(f.eval("accept", &data, &f.drafter, &["--topk", "0", "--tree-tokens", "4"]), &["topk <= Vd"]);
    assert!(!err.contains(&usize::MAX.to_string()), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
}

#[test]
fn a_closed_stdout_ends_the_run_quietly_instead_of_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, 32, 2, 3);
    let data = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&data, &fixture::conversations(2));
    let out = dir.path().join("regen.jsonl");
    // `aerie regenerate ... | true`: the reader is gone before the report is printed.
    let mut child = aerie_run("regenerate", &target, &data, &out, &["--max-new-tokens", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.is_file(), "the output is complete before the report is printed");
}

#[test]
fn unclear_errors_name_the_file_option_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_tokenizer(&target, Some(fixture::CHATML));
    // A prepared-data path that is a file.
    let file = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&file, &fixture::conversations(2));
    let out = dir.path().join("vocab.safetensors");
    refused(
        aerie(&["vocab", "build", s(&file), "--draft-vocab", "8", "--out", s(&out)]),
        &[s(&file), "not a prepared dataset", "is a file"],
    );

    // Every record malformed: the first bad line and its parse error.
    let garbage = dir.path().join("garbage.jsonl");
    std::fs::write(&garbage, "{\"conversations\": 3}\nnot json at all\n").unwrap();
    let prepared = dir.path().join("prepared");
    let prepare = |data: &Path, extra: &[&str]| {
        let args = ["data", "prepare", "--data", s(data), "--tokenizer", s(&target), "--out", s(&prepared)];
        aerie(&[&args[..], extra].concat())
    };
    refused(prepare(&garbage, &[]), &[s(&garbage), "line 1", "malformed record"]);

    // Reserved template variables.
    for name in ["messages", "add_generation_prompt"] {
        refused(
            prepare(&file, &["--template-kwarg", &format!("{name}=[]")]),
            &[&format!("--template-kwarg {name}"), "reserved"],
        );
    }

    // Train-config type errors name the key, and a `--set` value is blamed on `--set`.
    let f = Shards::new();
    let data = f.write("data", 2, 1 << 20, &"0".repeat(64));
    let run = f.root().join("run");
    let config = f.train_config("t.toml", &run, 1, 1, &[&data], &[]);
    refused(aerie(&["train", s(&config), "--set", "optim.lr=abc"]), &["--set optim.lr=abc", "`optim.lr`"]);
    let text = std::fs::read_to_string(&config).unwrap().replace("lr = 1e-3", "lr = \"abc\"");
    std::fs::write(&config, text).unwrap();
    refused(aerie(&["train", s(&config)]), &[s(&config), "`optim.lr`"]);
    assert!(!run.exists(), "a refused config created its output_dir");

    // A target head of another shape is blamed on --target-head, not on the drafter.
    let cfg = tiny_config();
    let wrong = f.root().join("wrong-head.safetensors");
    let t = HostTensor::from_f32(
        vec![cfg.vocab_size, cfg.target_hidden_size + 1],
        &vec![0.0; cfg.vocab_size * (cfg.target_hidden_size + 1)],
        Dtype::F32,
    );
    write_safetensors(&wrong, [("lm_head.weight", &t)]).unwrap();
    let args = ["eval", "accept", "--drafter", s(&f.drafter), "--data", s(&data), "--target-head", s(&wrong)];
    refused(aerie(&args), &[s(&wrong), "--target-head is [", "hidden size"]);

    // --ttt-length 0.
    refused(f.eval("loss", &data, &f.drafter, &["--ttt-length", "0"]), &["--ttt-length", "at least 1"]);

    // `inspect` given the drafter's config.json names the directory to give instead; its exit
    // codes are docs/checkpoints.md's: 0 clean, 2 on lint errors, 1 when it cannot run.
    let config_file = f.drafter.join("config.json");
    refused(aerie(&["inspect", s(&config_file)]), &[s(&config_file), "give the directory", s(&f.drafter)]);
    let clean = aerie(&["inspect", s(&f.drafter), "--strict"]);
    assert_eq!(clean.status.code(), Some(0), "{}", String::from_utf8_lossy(&clean.stdout));
    let broken = f.root().join("two-layers");
    std::fs::create_dir(&broken).unwrap();
    for entry in std::fs::read_dir(&f.drafter).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), broken.join(entry.file_name())).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(broken.join("config.json")).unwrap()).unwrap();
    cfg["num_hidden_layers"] = 2.into();
    std::fs::write(broken.join("config.json"), cfg.to_string()).unwrap();
    let linted = aerie(&["inspect", s(&broken)]);
    let text = String::from_utf8_lossy(&linted.stdout);
    assert_eq!(linted.status.code(), Some(2), "{text}");
    assert!(text.contains("num-hidden-layers"), "{text}");
}

/// Memory follows `--max-length`, not what a record claims: one 16 MB answer (with a byte-level
/// tokenizer, 16 M tokens tokenised whole: about 2 GB before the head cut) is prepared in the
/// binary's baseline plus a few copies of the record. The bound, 400 MB, is the baseline (about
/// 60 MB), the line, its JSON value, the template's render and its prefix renders (5 × 16 MB)
/// and room for the allocator; the peak is the child's own (`wait4`), not this process's.
#[test]
fn one_huge_record_is_prepared_in_memory_bounded_by_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_tokenizer(&target, Some(fixture::CHATML));
    let answer: String = (0..16 << 20).map(|i| ["word ", "more ", "text\n"][i % 3].as_bytes()[i % 5] as char).collect();
    let chats = dir.path().join("huge.jsonl");
    fixture::write_jsonl(
        &chats,
        &[serde_json::json!({"id": "huge", "conversations": [
            {"from": "human", "value": "Say a lot."}, {"from": "gpt", "value": answer}]})],
    );
    let out = dir.path().join("prepared");
    let mut c = aerie_cmd();
    c.args(["data", "prepare", "--data", s(&chats), "--tokenizer", s(&target), "--out", s(&out)]);
    c.args(["--max-length", "512", "--json"]).stdout(Stdio::piped()).stderr(Stdio::piped());
    #[allow(clippy::zombie_processes, reason = "reaped by wait4 below, which also reads its peak RSS")]
    let child = c.spawn().unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid, and wait4 writes it for our own child's pid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: waits for the child spawned above; the pointers are to live locals.
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "data prepare failed: {status}");
    let peak_mb = usage.ru_maxrss as f64 / 1024.0;
    eprintln!("data prepare of one 16 MB record: peak RSS {peak_mb:.0} MB");
    assert!(peak_mb < 400.0, "data prepare of one 16 MB record peaked at {peak_mb:.0} MB");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["samples"], 1, "{report}");
    assert_eq!(report["tokens"], 512, "{report}");
}

/// A small tmpfs mounted at `dir` (removed on drop): a real file system that fills up, so the
/// writer meets ENOSPC exactly as on a full disk. Mounting needs root or CAP_SYS_ADMIN; a user
/// who has neither runs the test again as root of its own user and mount namespace (below).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Result<Self, String> {
        std::fs::create_dir_all(dir).unwrap();
        let size = format!("size={bytes}");
        match Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs", s(dir)]).output() {
            Ok(o) if o.status.success() => Ok(Self(dir.to_owned())),
            Ok(o) => Err(format!("cannot mount a tmpfs ({})", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => Err(format!("cannot run mount: {e}")),
        }
    }

    fn resize(&self, bytes: u64) {
        // The type and source spelled out: a plain `mount -o remount` is refused in a user
        // namespace ("mount point not mounted or bad option").
        let opts = format!("remount,size={bytes}");
        assert!(
            Command::new("mount").args(["-t", "tmpfs", "-o", &opts, "tmpfs", s(&self.0)]).status().unwrap().success()
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

const DISK_FULL_TEST: &str = "disk_full_while_saving_a_checkpoint_is_named_and_the_run_completes_after";
/// Set in the copy of this test that runs in its own user namespace.
const IN_NAMESPACE: &str = "AERIE_TEST_IN_USER_NAMESPACE";
/// What that copy prints once it has mounted its tmpfs (so a skip in there is no pass).
const RAN_IN_NAMESPACE: &str = "disk-full test: running as root of its own user namespace";

/// Without root: run `test` of this test binary again under `unshare --user --map-root-user
/// --mount`, where it is root of a new user and mount namespace and may mount a tmpfs (Linux
/// allows that to unprivileged users unless user namespaces are disabled). `false` when no such
/// namespace can be made here; otherwise the copy's result is this test's (asserted).
fn in_own_namespace(test: &str, scratch: &Path) -> bool {
    let probe = scratch.join("ns-probe");
    std::fs::create_dir_all(&probe).unwrap();
    let mount_probe = format!("mount -t tmpfs -o size=65536 tmpfs '{}'", s(&probe));
    let usable = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &mount_probe])
        .output()
        .is_ok_and(|o| o.status.success());
    if !usable {
        return false;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount"])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(IN_NAMESPACE, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{stderr}");
    assert!(out.status.success(), "{test} in its own user namespace failed:\n{stdout}\n{stderr}");
    assert!(stderr.contains(RAN_IN_NAMESPACE), "{test} did not run in its user namespace:\n{stdout}\n{stderr}");
    true
}

fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() { du(&e.path()) } else { m.len() }
        })
        .sum()
}

/// Disk full while training saves a checkpoint: the error names the file and says the disk is
/// full (not burn's serialiser), nothing half-written is left, and with space again the same
/// command completes.
#[test]
fn disk_full_while_saving_a_checkpoint_is_named_and_the_run_completes_after() {
    let f = Shards::new();
    if let Err(why) = Tmpfs::mount(&f.root().join("probe"), 64 << 10) {
        if std::env::var_os(IN_NAMESPACE).is_none() && in_own_namespace(DISK_FULL_TEST, f.root()) {
            return;
        }
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{DISK_FULL_TEST}: CI=true but it cannot run: {why}, and no user namespace either"
        );
        println!("note: {DISK_FULL_TEST} skipped: {why}, and no user namespace (unshare -r -m) to mount one in");
        return;
    }
    let _ = Command::new("umount").arg("-l").arg(f.root().join("probe")).stderr(Stdio::null()).status();
    if std::env::var_os(IN_NAMESPACE).is_some() {
        eprintln!("{RAN_IN_NAMESPACE}");
    }
    let data = f.write("data", 8, 1 << 20, &"0".repeat(64));
    let roomy = f.root().join("roomy");
    let config = f.train_config("roomy.toml", &roomy, 1, 1, &[&data], &[]);
    ok(aerie(&["train", s(&config), "--json"]));
    let ckpt_bytes = du(&roomy);
    let small = Tmpfs::mount(&f.root().join("small"), (ckpt_bytes / 2).max(64 << 10)).unwrap();
    let run = small.0.join("run");
    let config = f.train_config("small.toml", &run, 1, 1, &[&data], &[]);
    let err = refused(aerie(&["train", s(&config), "--json"]), &["No space left on device"]);
    eprintln!("disk full: {err}");
    assert!(!err.contains("MessagePack") && !err.contains("Serializ"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&run).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().contains(".tmp")), "left behind: {left:?}");
    small.resize(ckpt_bytes * 4);
    let summary: serde_json::Value = serde_json::from_str(ok(aerie(&["train", s(&config), "--json"])).trim()).unwrap();
    assert_eq!(summary["status"], "completed", "{summary}");
}
