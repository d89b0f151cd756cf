//! What a user feeds aerie never loses data, third round (issue 47, "every writer, every size,
//! every server"; docs/reliability.md): one lock per output whatever path reaches it (a bind
//! mount too), never a write through a link planted at a name aerie writes, `export --force`
//! replacing only what bears aerie's mark, every size from a flag or a file bounded before use,
//! one check of the RoPE numbers for every command, and no read that waits for ever on a FIFO.
//! Each case runs the real `aerie` binary and asserts the refusal's exit code, its words and
//! that the bytes it must not touch are the same afterwards.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::refusal::{Shards, kill, refused, snapshot, start_and_freeze};
use common::{aerie, aerie_cmd, ok_json, s};

/// A tokenizer in `dir/target` and `n` conversations in `dir/chat.jsonl`.
fn tokenizer_and_chats(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    let target = dir.join("target");
    fixture::write_tokenizer(&target, Some(fixture::CHATML));
    let chats = dir.join("chat.jsonl");
    fixture::write_jsonl(&chats, &fixture::conversations(n));
    (target, chats)
}

fn prepare(chats: &Path, tokenizer: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let args = ["data", "prepare", "--data", s(chats), "--tokenizer", s(tokenizer), "--out", s(out), "--json"];
    aerie(&[&args[..], extra].concat())
}

/// `dir` bind-mounted at `at` until dropped, where this process may mount (root); `None` else.
struct BindMount(PathBuf);

impl BindMount {
    fn new(dir: &Path, at: &Path) -> Option<Self> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["--bind", s(dir), s(at)])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|st| st.success());
        ok.then(|| Self(at.to_path_buf()))
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_bind_mount_of_an_output_is_the_same_output_for_its_lock() {
    let f = Shards::new();
    let data = f.write("data", 8, 1 << 20, &"0".repeat(64));
    let run_a = f.root().join("runA");
    std::fs::create_dir(&run_a).unwrap();
    let Some(mount) = BindMount::new(&run_a, &f.root().join("mnt/runB")) else {
        eprintln!("skipped: this process cannot bind-mount");
        return;
    };
    let run_b = mount.0.clone();
    let slow = f.train_config("a.toml", &run_a, 1, 2000, &[&data], &[]);
    let other = f.train_config("b.toml", &run_b, 2, 1, &[&data], &[]);
    let mut train = aerie_cmd();
    train.args(["train", s(&slow), "--json"]);
    let first = start_and_freeze(train, &f.root().join(".runA.aerie-lock"));
    let before = snapshot(&run_a);
    // No path resolution sees that runB is runA; the directory's identity does.
    refused(aerie(&["train", s(&other), "--json"]), &[s(&run_b), "another process"]);
    assert_eq!(snapshot(&run_a), before, "the refused run changed files");
    kill(first);
    drop(mount);
}

#[test]
fn a_link_planted_where_aerie_writes_its_own_file_never_writes_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let (target, chats) = tokenizer_and_chats(dir.path(), 24);
    let victim = dir.path().join("precious.txt");
    std::fs::write(&victim, "the user's data\n").unwrap();
    let unchanged = || assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's data\n");
    let link_words = ["symbolic link", "never writes through a link"];

    // The lock beside an output (`.OUT.aerie-lock`): it was truncated and written a pid.
    let prepared = dir.path().join("prepared");
    let lock = dir.path().join(".prepared.aerie-lock");
    symlink(&victim, &lock).unwrap();
    refused(prepare(&chats, &target, &prepared, &[]), &[&[s(&lock)][..], &link_words].concat());
    unchanged();
    std::fs::remove_file(&lock).unwrap();
    ok_json(prepare(&chats, &target, &prepared, &[]));

    // A temp file (`.tmp-NAME`) of an atomic write: it was truncated and filled.
    let vocab = dir.path().join("vocab.safetensors");
    let tmp = dir.path().join(".tmp-vocab.safetensors");
    symlink(&victim, &tmp).unwrap();
    let args = ["vocab", "build", s(&prepared), "--draft-vocab", "8", "--out", s(&vocab), "--json"];
    refused(aerie(&args), &[&[s(&tmp)][..], &link_words].concat());
    unchanged();
    assert!(!vocab.exists());
    std::fs::remove_file(&tmp).unwrap();
    ok_json(aerie(&args));

    // The shard lock inside a dataset (`.aerie-shard.lock`): it was opened through the link.
    let f = Shards::new();
    let src = f.write("src", 4, 1 << 20, &"0".repeat(64));
    let dst = f.root().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let shard_lock = dst.join(".aerie-shard.lock");
    symlink(&victim, &shard_lock).unwrap();
    let convert = || aerie(&["shards", "convert", s(&src), "--dtype", "bf16", "--out", s(&dst), "--json"]);
    refused(convert(), &[&[s(&shard_lock)][..], &link_words].concat());
    unchanged();
    std::fs::remove_file(&shard_lock).unwrap();
    ok_json(convert());
}

#[test]
fn export_force_never_replaces_a_model_of_just_config_and_weights() {
    let f = Shards::new();
    let export =
        |out: &Path| aerie(&["export", s(&f.drafter), "--to", "speculators", "--out", s(out), "--force", "--json"]);
    // A small target model: exactly config.json and model.safetensors (a 538 MB one was lost).
    let model = f.root().join("target-model");
    std::fs::create_dir(&model).unwrap();
    std::fs::copy(f.drafter.join("model.safetensors"), model.join("model.safetensors")).unwrap();
    std::fs::write(model.join("config.json"), "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"]}")
        .unwrap();
    let before = snapshot(&model);
    refused(export(&model), &[s(&model), ".aerie-export.json", "refusing to replace"]);
    assert_eq!(snapshot(&model), before);
    // What aerie exported bears the mark, and is replaced.
    let out = f.root().join("exported");
    ok_json(export(&out));
    assert!(out.join(".aerie-export.json").is_file());
    ok_json(export(&out));
}

#[test]
fn sizes_from_flags_and_files_are_refused_before_use() {
    let start = Instant::now();
    let f = Shards::new();
    let data = f.write("data", 2, 1 << 20, &"0".repeat(64));
    // `eval loss --ttt-length`: grew without end.
    for k in ["65", "1000000000000"] {
        refused(
            f.eval("loss", &data, &f.drafter, &["--ttt-length", k]),
            &[&format!("--ttt-length {k}"), "limit of 64"],
        );
    }
    // `train --devices cuda:0..N`: u64::MAX panicked, 4e9 aborted, both before any check.
    let config = f.train_config("t.toml", &f.root().join("run"), 1, 1, &[&data], &[]);
    for n in [u64::MAX.to_string(), "4000000000".into()] {
        let devices = format!("cuda:0..{n}");
        refused(aerie(&["train", s(&config), "--devices", &devices, "--json"]), &[&devices, "limit of 1024"]);
    }
    assert!(!f.root().join("run").exists());

    // MLA widths in a drafter config: past the limit, and 0 (which panicked in burn).
    let mla = f.root().join("mla");
    let cfg = aerie_model::checkpoint::synthetic::tiny_mla_config();
    let opts = aerie_model::checkpoint::SaveOptions::default();
    let weights = aerie_model::checkpoint::synthetic::random_drafter(&cfg, aerie_model::checkpoint::Dtype::F32, 1);
    aerie_model::checkpoint::save_drafter(&weights, &mla, &opts).unwrap();
    ok_json(aerie(&["inspect", s(&mla), "--json"]));
    for (key, value, words) in [
        ("v_head_dim", serde_json::json!(1_000_000_000_000u64), "v_head_dim = 1000000000000"),
        ("q_lora_rank", serde_json::json!(1 << 20), "q_lora_rank = 1048576"),
        ("qk_nope_head_dim", serde_json::json!(0), "qk_nope_head_dim 0"),
    ] {
        let broken = f.root().join(format!("mla-{key}"));
        copy_dir(&mla, &broken);
        set_config_key(&broken, key, value);
        refused(f.eval("loss", &data, &broken, &[]), &[words, "config.json"]);
        let out = aerie(&["inspect", s(&broken)]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(matches!(out.status.code(), Some(1 | 2)) && text.contains(words), "{text}");
    }

    // A JSONL line without end (`/dev/zero`): grew until the machine killed aerie.
    let dir = tempfile::tempdir().unwrap();
    let (target, _) = tokenizer_and_chats(dir.path(), 1);
    let zero = dir.path().join("zero.jsonl");
    symlink("/dev/zero", &zero).unwrap();
    let out = dir.path().join("prepared");
    refused(prepare(&zero, &target, &out, &[]), &[s(&zero), "line 1", "longer than the limit of 268435456 bytes"]);

    // A chat template that never ends, or that doubles a string in a loop: hung, and took 6 GB.
    let chats = dir.path().join("chat.jsonl");
    for (name, source) in [
        ("hang.jinja", "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"),
        (
            "double.jinja",
            "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        ),
    ] {
        let template = dir.path().join(name);
        std::fs::write(&template, source).unwrap();
        let words = [s(&template), "budget for one render", "conversation"];
        refused(prepare(&chats, &target, &out, &["--template", s(&template)]), &words);
    }
    // `regenerate` renders each prompt with it too: it stops, where it dropped each conversation.
    let hang = dir.path().join("hang.jinja");
    let tiny = dir.path().join("tiny");
    fixture::write_target(&tiny, 32, 2, 3);
    let regen = dir.path().join("regen.jsonl");
    let args = ["regenerate", "--target", s(&tiny), "--data", s(&chats), "--out", s(&regen), "--template", s(&hang)];
    refused(aerie(&args), &[s(&hang), "budget for one render"]);
    assert!(!regen.exists());
    assert!(!out.join("report.json").exists());

    // A `config.json` beside the tokenizer whose `vocab_size` is 4e9: recorded in the dataset.
    let original = std::fs::read_to_string(target.join("config.json")).ok();
    let mut config: serde_json::Value = serde_json::from_str(original.as_deref().unwrap_or("{}")).unwrap();
    config["vocab_size"] = serde_json::json!(4_000_000_000u64);
    std::fs::write(target.join("config.json"), config.to_string()).unwrap();
    refused(prepare(&chats, &target, &out, &[]), &["config.json: vocab_size = 4000000000", "limit of 16777216"]);
    match original {
        Some(text) => std::fs::write(target.join("config.json"), text).unwrap(),
        None => std::fs::remove_file(target.join("config.json")).unwrap(),
    }

    // `regenerate --server`: a timeout of 1e300 s panicked making it a Duration, 10^8 requests in
    // flight panicked spawning their threads.
    for (flag, value, words) in [
        ("--timeout", "1e300", "limit of 604800 seconds"),
        ("--concurrency", "100000000", "limit of 1024 requests in flight"),
    ] {
        let args = ["regenerate", "--data", s(&chats), "--out", s(&regen), "--server", "http://127.0.0.1:9"];
        refused(aerie(&[&args[..], &["--tokenizer", s(&target), flag, value]].concat()), &[flag, words]);
    }
    assert!(!regen.exists());
    assert!(start.elapsed() < Duration::from_secs(120), "{:?}", start.elapsed());
}

#[test]
fn a_rope_factor_of_zero_is_refused_by_every_command() {
    let f = Shards::new();
    let data = f.write("data", 2, 1 << 20, &"0".repeat(64));
    set_config_key(
        &f.drafter,
        "rope_scaling",
        serde_json::json!({"rope_type": "yarn", "type": "yarn", "factor": 0.0, "original_max_position_embeddings": 64}),
    );
    let words = "rope_scaling.factor = 0 must be a finite number above 0";
    // inspect: a lint error (exit 2), where it passed.
    let out = aerie(&["inspect", s(&f.drafter)]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(1 | 2)) && text.contains(words), "{text}");
    // eval: a NaN loss and τ 1.0 before.
    refused(f.eval("loss", &data, &f.drafter, &[]), &[words]);
    // train (warm start from it): NaN losses before.
    let config = f.train_config("t.toml", &f.root().join("run"), 1, 1, &[&data], &[]);
    refused(aerie(&["train", s(&config), "--json"]), &[words]);
    // export: exported before.
    let out = f.root().join("exported");
    refused(aerie(&["export", s(&f.drafter), "--to", "sglang", "--out", s(&out), "--json"]), &[words]);
    assert!(!out.exists());
}

#[test]
fn a_fifo_in_place_of_a_shard_is_an_error_not_a_hang() {
    let f = Shards::new();
    let data = f.write("data", 4, 1 << 20, &"0".repeat(64));
    let shard = data.join(aerie_data::shard::shard_file_name(0));
    std::fs::remove_file(&shard).unwrap();
    let c = std::ffi::CString::new(s(&shard)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let mut cmd = aerie_cmd();
    cmd.args(["shards", "verify", s(&data), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("shards verify hung on a FIFO");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    refused(child.wait_with_output().unwrap(), &[s(&shard), "not a regular file"]);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Set `key` of `dir/config.json` to `value` (behind aerie's back: what a hand edit does).
fn set_config_key(dir: &Path, key: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    c[key] = value;
    std::fs::write(&path, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
}

/// A new user's mistakes (issue 47's audit of messages): each is named with what to give instead,
/// and refused before the work it would waste.
#[test]
fn a_new_users_mistakes_are_named_with_what_to_give_instead() {
    let f = Shards::new();
    let data = f.write("data", 2, 1 << 20, &"0".repeat(64));
    // A training run given where a drafter is expected: it said "config.json: No such file".
    let run = f.root().join("run");
    copy_dir(&f.drafter, &run.join("checkpoint-7"));
    copy_dir(&f.drafter, &run.join("checkpoint-12"));
    std::fs::write(run.join("summary.json"), "{}").unwrap();
    let latest = run.join("checkpoint-12");
    let words = ["a training run's directory, not a drafter", s(&latest)];
    refused(f.eval("loss", &data, &run, &[]), &words);
    refused(aerie(&["export", s(&run), "--to", "sglang", "--out", s(&f.root().join("x")), "--json"]), &words);
    let out = aerie(&["inspect", s(&run)]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && text.contains(words[0]), "{text}");

    // A mistyped path: it was asked of the Hub as `org/name` and failed as a network error.
    let typo = f.root().join("drafterr");
    let out = f.eval("loss", &data, &typo, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error (clap's value check):\n{err}");
    assert!(err.contains("is a path, not a hub id"), "{err}");
    assert!(err.contains(&format!("did you mean `{}`", f.drafter.display())), "{err}");

    // Outputs written after the evaluation are checked before it: the unwritable --profile-out
    // is named, not the drafter's bad RoPE factor found when it loads.
    let broken = f.root().join("broken");
    copy_dir(&f.drafter, &broken);
    set_config_key(&broken, "rope_scaling", serde_json::json!({"rope_type": "linear", "factor": 0.0}));
    let file = f.root().join("notes.txt");
    std::fs::write(&file, "the user's notes\n").unwrap();
    let profile = file.join("profile.json");
    let args = ["--profile-out", s(&profile), "--k", "2"];
    refused(f.eval("accept", &data, &broken, &args), &["--profile-out", s(&file)]);
    // compare: a foreign file at --out, and every candidate, before the first evaluation.
    let cmp = f.root().join("cmp");
    std::fs::create_dir(&cmp).unwrap();
    std::fs::write(cmp.join("compare.md"), "mine\n").unwrap();
    let compare = |out: &Path, second: &Path| {
        let args = ["compare", s(&f.drafter), s(second), "--data", s(&data), "--target-head", s(&f.head)];
        aerie(&[&args[..], &["--k", "2", "--out", s(out), "--json"]].concat())
    };
    refused(compare(&cmp, &broken), &["compare.md", "not a comparison that aerie wrote"]);
    assert_eq!(std::fs::read_to_string(cmp.join("compare.md")).unwrap(), "mine\n");
    let fresh = f.root().join("cmp2");
    refused(compare(&fresh, &run), &["candidate `run`", words[0]]);
    assert!(!fresh.join("compare.json").exists());

    // An output whose directory cannot be made: it named aerie's lock file and the OS error.
    let under_file = file.join("prepared");
    let dir = tempfile::tempdir().unwrap();
    let (target, chats) = tokenizer_and_chats(dir.path(), 4);
    let words = [s(&file), "is a file, not a directory", s(&under_file)];
    let err = refused(prepare(&chats, &target, &under_file, &[]), &words);
    assert!(!err.contains("aerie-lock"), "{err}");
    let vocab = under_file.join("vocab.safetensors");
    let err = refused(
        aerie(&["vocab", "build", s(&file), "--draft-vocab", "8", "--out", s(&vocab)]),
        &[s(&file), "is a file, not a directory"],
    );
    assert!(!err.contains("aerie-lock"), "{err}");

    // `project --max-k 0`: an empty table and exit 0.
    let costs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/costs/smollm2-native-cpu-2core.toml");
    refused(aerie(&["project", "--costs", s(&costs), "--max-k", "0"]), &["--max-k 0", "1 or more"]);

    // `regenerate --out DIR`: it suggested --overwrite, which then refused the directory.
    let regen_dir = dir.path().join("regen");
    std::fs::create_dir(&regen_dir).unwrap();
    let args = ["regenerate", "--data", s(&chats), "--out", s(&regen_dir), "--server", "http://127.0.0.1:9"];
    let err =
        refused(aerie(&[&args[..], &["--tokenizer", s(&target)]].concat()), &["is a directory", "regenerated.jsonl"]);
    assert!(!err.contains("--overwrite"), "{err}");

    // `measure --out` is written after the whole sweep: an unwritable or unreadable costs file is
    // named before the first request (no server answers at port 9: the refusal came first).
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"hello\"}\n").unwrap();
    let measure = |out: &Path| {
        aerie(&[
            "measure",
            "--server",
            "http://127.0.0.1:9",
            "--prompts",
            s(&prompts),
            "--out",
            s(out),
            "--retries",
            "0",
        ])
    };
    refused(measure(&file.join("costs.toml")), &["--out", s(&file)]);
    refused(measure(&file), &["--out", "reading the costs file", s(&file)]);
}

/// Session 26's audit of a new user's mistakes (docs/reliability.md, issue 47's table): each
/// message names the flag, key or file at fault and what to give instead, and bad sizes that
/// were accepted with exit 0 are refused.
#[test]
fn unclear_messages_of_the_fourth_audit_name_the_flag_and_the_fix() {
    let f = Shards::new();
    let data = f.write("data", 2, 1 << 20, &"0".repeat(64));
    // Sizes accepted with exit 0: a tree asked for more tokens than it holds, a batch of 0.
    let tree = ["--k", "2", "--topk", "4", "--tree-tokens", "100"];
    refused(f.eval("accept", &data, &f.drafter, &tree), &["--tree-tokens 100", "holds at most 21"]);
    for flag in ["--batch-size", "--head-chunk-rows"] {
        let out = f.eval("loss", &data, &f.drafter, &[flag, "0"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} 0: {err}");
        assert!(err.contains(flag) && err.contains("must be 1 or more"), "{err}");
    }
    refused(f.eval("accept", &data, &f.drafter, &["--k", "0"]), &["--k 0", "1 draft step or more"]);
    // A drafter of another target (SmolLM2's, without its embedding) given this target's
    // embedding to export: it blamed the drafter ("embed_tokens.weight has shape [..], expected [49152, 576]").
    let smollm2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2-135m-eagle3");
    let tiny = f.root().join("tiny-target");
    fixture::write_target(&tiny, 32, 4, 21);
    let out = f.root().join("exported");
    let args =
        ["export", s(&smollm2), "--to", "speculators", "--out", s(&out), "--target", s(&tiny), "--include-embedding"];
    refused(
        aerie(&args),
        &["was made for a target of vocabulary 49152 and hidden size 576", "give the target it was trained for"],
    );
    // One shard file for its dataset: "shard-00000.safetensors/manifest.json: Not a directory".
    let shard = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    refused(f.eval("loss", &shard, &f.drafter, &[]), &["is a file: give the capture shard directory", s(&data)]);
    // A section given to --set: "unknown key `optim`; did you mean `optim`?".
    let run = f.root().join("run");
    let cfg = f.train_config("train.toml", &run, 1, 1, &[&data], &[]);
    let err = refused(aerie(&["train", s(&cfg), "--set", "optim=1"]), &["`optim` is a section", "--set optim."]);
    assert!(!err.contains("did you mean"), "{err}");
    // A value of the wrong type in serde's words ("expected f64"), an empty config ("`.`: missing
    // field `output_dir`"), a directory as the config ("Is a directory (os error 21)"), a range
    // written high to low.
    refused(aerie(&["train", s(&cfg), "--set", "optim.lr=fast"]), &["`optim.lr`", "expected a number"]);
    let empty = f.root().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let err = refused(aerie(&["train", s(&empty)]), &["missing key `output_dir`"]);
    assert!(!err.contains("`.`"), "{err}");
    refused(aerie(&["train", s(f.root())]), &["is a directory: give the training config"]);
    refused(aerie(&["train", s(&cfg), "--devices", "cuda:3..1"]), &["an empty range", "`cuda:1..3`"]);
    // A checkpoint given to --resume instead of its run.
    let checkpoint = run.join("checkpoint-3");
    std::fs::create_dir_all(checkpoint.join("training_state")).unwrap();
    refused(
        aerie(&["train", s(&cfg), "--resume", s(&checkpoint)]),
        &["is a checkpoint, not a run", &format!("here {}", run.display())],
    );
    // Outputs that exist: the flag that replaces them is named.
    let dir = tempfile::tempdir().unwrap();
    let (target, chats) = tokenizer_and_chats(dir.path(), 4);
    let prepared = dir.path().join("prepared");
    ok_json(prepare(&chats, &target, &prepared, &[]));
    refused(prepare(&chats, &target, &prepared, &[]), &["choose another --out, or pass --overwrite"]);
    let split = prepare(&chats, &target, &dir.path().join("p3"), &["--split", "eval:0.02"]);
    refused(split, &["`eval=FRACTION`, e.g. `eval=0.02`"]);
    let nothing = dir.path().join("nothing.jsonl");
    std::fs::write(&nothing, "").unwrap();
    let err = refused(prepare(&nothing, &target, &dir.path().join("p2"), &[]), &["holds no record (an empty file?)"]);
    assert!(!err.contains("{}"), "{err}");
    let vocab = dir.path().join("vocab.safetensors");
    refused(aerie(&["vocab", "build", s(&prepared), "--out", s(&vocab)]), &["--draft-vocab N", "--keep-from"]);
    let args = ["vocab", "build", s(&prepared), "--draft-vocab", "8", "--out", s(dir.path())];
    refused(aerie(&args), &["--out is a directory", "vocab.safetensors"]);
    let notes = dir.path().join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("a.txt"), "mine\n").unwrap();
    refused(aerie(&["export", s(&f.drafter), "--to", "sglang", "--out", s(&notes)]), &["--force"]);
    // `topk:0` matched the form it was told to use.
    let out = aerie(&[
        "capture",
        "--engine",
        "native",
        "--target",
        s(&target),
        "--data",
        s(&prepared),
        "--out",
        s(&notes),
        "--teacher",
        "topk:0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("K a whole number, 1 or more"), "{err}");
}

/// `capture --out` into its own inputs: it wrote shards into the prepared dataset (exit 0).
#[test]
fn capture_never_writes_into_a_prepared_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, 32, 4, 1);
    let chats = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&chats, &fixture::conversations(6));
    let prepared = dir.path().join("prepared");
    ok_json(prepare(&chats, &target, &prepared, &[]));
    let other = dir.path().join("other");
    ok_json(prepare(&chats, &target, &other, &[]));
    let before = (snapshot(&prepared), snapshot(&other));
    let capture = |out: &Path, extra: &[&str]| {
        let args = ["capture", "--target", s(&target), "--data", s(&prepared), "--out", s(out), "--json"];
        aerie(&[&args[..], extra].concat())
    };
    refused(capture(&prepared, &["--aux-layers", "0,1,2"]), &["--out is --data", "destroy the input"]);
    refused(capture(&other, &["--aux-layers", "0,1,2"]), &["holds a prepared dataset"]);
    // The flags are checked before the target loads.
    refused(capture(&dir.path().join("shards"), &["--aux-layers", "0,9"]), &["9"]);
    assert_eq!((snapshot(&prepared), snapshot(&other)), before);
    ok_json(capture(&dir.path().join("shards"), &["--aux-layers", "0,1,2"]));
}
