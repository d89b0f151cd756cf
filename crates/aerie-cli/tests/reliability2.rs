//! What a user feeds aerie never loses data, second round (issue 38; docs/reliability.md): one
//! writer per output whatever its path is called, no output replacing what aerie did not write
//! or what the run reads, every size bounded before use, every weight's values checked wherever
//! it is read, and a resumed training run checked against its data. Each case runs the real
//! `aerie` binary and asserts the refusal's exit code, its words and, where something was on
//! disk, that every byte of it is the same afterwards.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::refusal::{Shards, kill, patch_tensor, refused, snapshot, start_and_freeze, tensor_names};
use common::{aerie, aerie_cmd, aerie_run, ok, ok_json, s};

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

#[test]
fn a_symlink_to_an_output_is_the_same_output_for_its_lock() {
    // `data prepare`: one run into `prepared`, one into a symlink to it.
    let dir = tempfile::tempdir().unwrap();
    let (target, chats) = tokenizer_and_chats(dir.path(), 40_000);
    let prepared = dir.path().join("prepared");
    let link = dir.path().join("link");
    symlink(&prepared, &link).unwrap();
    let cmd = |out: &Path| {
        let mut c = aerie_cmd();
        c.args(["data", "prepare", "--data", s(&chats), "--tokenizer", s(&target), "--out", s(out), "--json"]);
        c
    };
    let first = start_and_freeze(cmd(&prepared), &dir.path().join(".prepared.aerie-lock"));
    let before = snapshot(dir.path());
    refused(cmd(&link).output().unwrap(), &[s(&link), &format!("pid {}", first.id()), "another process"]);
    assert_eq!(snapshot(dir.path()), before, "the refused run changed files");
    kill(first);

    // `train`: the case, `runA` and a symlink `runB -> runA`.
    let f = Shards::new();
    let data = f.write("data", 8, 1 << 20, &"0".repeat(64));
    let run_a = f.root().join("runA");
    let run_b = f.root().join("runB");
    // runA exists before the first run starts: frozen right after it takes its lock, that run may
    // not have made its directory yet, and the snapshot would meet a dangling runB.
    std::fs::create_dir(&run_a).unwrap();
    symlink(&run_a, &run_b).unwrap();
    let slow = f.train_config("a.toml", &run_a, 1, 2000, &[&data], &[]);
    let other = f.train_config("b.toml", &run_b, 2, 1, &[&data], &[]);
    let mut train = aerie_cmd();
    train.args(["train", s(&slow), "--json"]);
    let first = start_and_freeze(train, &f.root().join(".runA.aerie-lock"));
    let before = snapshot(f.root());
    refused(aerie(&["train", s(&other), "--json"]), &[s(&run_b), &format!("pid {}", first.id())]);
    assert_eq!(snapshot(f.root()), before, "the refused run changed files");
    kill(first);
}

#[test]
fn export_force_replaces_only_a_previous_export_and_never_its_input() {
    let f = Shards::new();
    let export =
        |out: &Path| aerie(&["export", s(&f.drafter), "--to", "speculators", "--out", s(out), "--force", "--json"]);
    // A Hugging Face model directory: weights, config and tokenizer.
    let hf = f.root().join("hf-model");
    std::fs::create_dir(&hf).unwrap();
    std::fs::copy(f.drafter.join("model.safetensors"), hf.join("model.safetensors")).unwrap();
    std::fs::write(hf.join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
    std::fs::write(hf.join("tokenizer.json"), "{}").unwrap();
    // A directory of the user's notes that happens to hold a config.json.
    let notes = f.root().join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("config.json"), "{}").unwrap();
    std::fs::write(notes.join("ideas.txt"), "keep me").unwrap();
    let before = snapshot(f.root());
    refused(export(&hf), &[s(&hf), "tokenizer.json", "refusing to replace"]);
    refused(export(&notes), &[s(&notes), "ideas.txt", "refusing to replace"]);
    // The input itself, and a directory holding it.
    refused(export(&f.drafter), &[s(&f.drafter), "is the drafter"]);
    refused(export(f.root()), &["holds the drafter"]);
    assert_eq!(snapshot(f.root()), before, "a refused export changed files");
    // A previous export is replaced.
    let out = f.root().join("export");
    ok_json(export(&out));
    ok_json(export(&out));
}

#[test]
fn side_files_and_overwrites_never_replace_what_aerie_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let (target, chats) = tokenizer_and_chats(dir.path(), 24);
    let prepared = dir.path().join("prepared");
    ok_json(prepare(&chats, &target, &prepared, &[]));

    // vocab build: its report beside `--out X.safetensors` would be the dataset's report.json.
    let vocab = |out: &Path| aerie(&["vocab", "build", s(&prepared), "--draft-vocab", "8", "--out", s(out), "--json"]);
    let before = snapshot(dir.path());
    refused(vocab(&prepared.join("report.safetensors")), &["report.json", "the report beside --out"]);
    // A user's JSON beside the output, and a user's file as the output.
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("v.json"), "{\"my\": \"notes\"}").unwrap();
    std::fs::write(mine.join("w.safetensors"), "weights of mine").unwrap();
    let before_mine = snapshot(dir.path());
    refused(vocab(&mine.join("v.safetensors")), &["v.json", "is not a vocabulary report"]);
    refused(vocab(&mine.join("w.safetensors")), &["w.safetensors", "is not a draft vocabulary"]);
    assert_eq!(snapshot(dir.path()), before_mine);
    std::fs::remove_dir_all(&mine).unwrap();
    assert_eq!(snapshot(dir.path()), before, "a refused vocab build changed files");
    // Its own earlier output is replaced.
    let out = dir.path().join("vocab.safetensors");
    ok_json(vocab(&out));
    ok_json(vocab(&out));

    // data prepare --overwrite: only a prepared dataset, recognised by its report.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("report.json"), "{\"quarterly\": true}").unwrap();
    std::fs::write(other.join("train.parquet"), "not ours").unwrap();
    let before = snapshot(dir.path());
    refused(prepare(&chats, &target, &other, &["--overwrite"]), &["report.json", "is not a prepared dataset's report"]);
    std::fs::remove_file(other.join("report.json")).unwrap();
    let before_no_report = snapshot(dir.path());
    refused(prepare(&chats, &target, &other, &["--overwrite"]), &[s(&other), "train.parquet", "no report.json"]);
    assert_eq!(snapshot(dir.path()), before_no_report);
    std::fs::write(other.join("report.json"), "{\"quarterly\": true}").unwrap();
    assert_eq!(snapshot(dir.path()), before);
    ok_json(prepare(&chats, &target, &prepared, &["--overwrite"]));

    // regenerate --overwrite: never its input, never a file with no report of aerie's beside it.
    let model = dir.path().join("model");
    fixture::write_target(&model, 32, 2, 3);
    let regen = |data: &Path, out: &Path| {
        aerie_run("regenerate", &model, data, out, &["--max-new-tokens", "4", "--overwrite", "--json"])
            .output()
            .unwrap()
    };
    let before = snapshot(dir.path());
    refused(regen(&chats, &chats), &[s(&chats), "is --data"]);
    let theirs = dir.path().join("theirs.jsonl");
    std::fs::write(&theirs, "{\"conversations\": []}\n").unwrap();
    let before_theirs = snapshot(dir.path());
    refused(regen(&chats, &theirs), &[s(&theirs), "theirs.report.json"]);
    let out = dir.path().join("regen.jsonl");
    std::fs::write(dir.path().join("regen.report.json"), "my report").unwrap();
    refused(regen(&chats, &out), &["regen.report.json", "is not a regenerate report"]);
    std::fs::remove_file(dir.path().join("regen.report.json")).unwrap();
    assert_eq!(snapshot(dir.path()), before_theirs);
    std::fs::remove_file(&theirs).unwrap();
    assert_eq!(snapshot(dir.path()), before);
    // Its own finished output is replaced.
    ok_json(regen(&chats, &out));
    ok_json(regen(&chats, &out));
}

#[test]
fn sizes_and_counts_past_their_limits_are_refused_before_use() {
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("model");
    fixture::write_target(&target, 32, 2, 3);
    let chats = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&chats, &fixture::conversations(8));
    let prepared = dir.path().join("prepared");
    ok_json(prepare(&chats, &target, &prepared, &[]));
    let out = dir.path().join("vocab.safetensors");
    for v in ["10000000000", &u64::MAX.to_string()] {
        let args = ["vocab", "build", s(&prepared), "--draft-vocab", "8", "--vocab-size", v, "--out", s(&out)];
        refused(aerie(&args), &[&format!("--vocab-size = {v}"), "limit of 16777216"]);
    }
    assert!(!out.exists());

    // A target config of a billion layers, in capture.
    let cfg = target.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["num_hidden_layers"] = 1_000_000_000.into();
    std::fs::write(&cfg, serde_json::to_vec(&c).unwrap()).unwrap();
    let capture = aerie_run(
        "capture",
        &target,
        &prepared,
        &dir.path().join("capture"),
        &["--aux-layers", "0,1,2", "--max-samples", "2", "--json"],
    )
    .output()
    .unwrap();
    refused(capture, &["num_hidden_layers = 1000000000", "limit of 1024"]);

    // ttt_length in train, --max-k in project.
    let f = Shards::new();
    let data = f.write("data", 2, 1 << 20, &"0".repeat(64));
    let config = f.train_config("t.toml", &f.root().join("run"), 1, 1, &[&data], &[]);
    refused(aerie(&["train", s(&config), "--set", "ttt_length=100000", "--json"]), &["ttt_length", "limit of 64"]);
    let costs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/costs/smollm2-native-cpu-2core.toml");
    let max = u64::MAX.to_string();
    refused(aerie(&["project", "--costs", s(&costs), "--max-k", &max]), &[&format!("--max-k = {max}"), "limit of 64"]);
    assert!(start.elapsed() < Duration::from_secs(120), "{:?}", start.elapsed());
}

#[test]
fn a_nan_on_the_target_side_or_in_a_linted_drafter_is_found_by_the_one_check() {
    let f = Shards::new();
    let data = f.write("data", 3, 1 << 20, &"0".repeat(64));
    // eval loss with a NaN target head reported loss 0.0000 at every step.
    patch_tensor(&f.head, "lm_head.weight", 8, &f32::NAN.to_le_bytes());
    let before = snapshot(&f.drafter);
    let problem = "`lm_head.weight`: element 2 is NaN";
    refused(f.eval("loss", &data, &f.drafter, &[]), &[s(&f.head), problem]);
    let config = f.train_config("t.toml", &f.root().join("run"), 1, 1, &[&data], &[]);
    refused(aerie(&["train", s(&config), "--json"]), &[s(&f.head), problem]);
    assert_eq!(snapshot(&f.drafter), before);
    assert!(!f.root().join("run").join("summary.json").exists());

    // inspect --strict and the loaders share the check.
    let weights = f.drafter.join("model.safetensors");
    let name = tensor_names(&weights).into_iter().find(|k| k.contains("norm")).unwrap();
    patch_tensor(&weights, &name, 4, &f32::INFINITY.to_le_bytes());
    let out = aerie(&["inspect", s(&f.drafter), "--strict"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains(&format!("`{name}`: element 1 is inf")), "{text}");
}

#[test]
fn a_resume_over_replaced_shards_is_refused_saying_what_changed() {
    let f = Shards::new();
    let data = f.write("data", 24, 1 << 20, &"0".repeat(64));
    let run = f.root().join("run");
    let config = f.train_config("t.toml", &run, 1, 1, &[&data], &[]);
    // Checkpoints hold no embedding: a resume takes the drafter's.
    let text = std::fs::read_to_string(&config).unwrap();
    let embedding = format!("[target]\nembedding = {:?}\n", s(&f.drafter.join("model.safetensors")));
    std::fs::write(&config, text.replace("[target]\n", &embedding)).unwrap();
    let summary: serde_json::Value = serde_json::from_str(ok(aerie(&["train", s(&config), "--json"])).trim()).unwrap();
    assert_eq!(summary["status"], "completed", "{summary}");
    // The same data resumes (a finished run: nothing left to do).
    ok(aerie(&["train", s(&config), "--resume", s(&run), "--json"]));
    // 24 samples became 8 at the same path.
    std::fs::remove_dir_all(&data).unwrap();
    f.write("data", 8, 1 << 20, &"0".repeat(64));
    let before = snapshot(&run);
    refused(
        aerie(&["train", s(&config), "--resume", s(&run), "--json"]),
        &["data.train[0]", "24 samples", "8 samples", "not what the run trained on"],
    );
    // Other shards of the same counts: the digest tells.
    std::fs::remove_dir_all(&data).unwrap();
    f.write_with("data", 24, 200, &"0".repeat(64), false);
    refused(aerie(&["train", s(&config), "--resume", s(&run), "--json"]), &["data.train[0]", "manifest digest"]);
    assert_eq!(snapshot(&run), before, "a refused resume changed the run");
}
