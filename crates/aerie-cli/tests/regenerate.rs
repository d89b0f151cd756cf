//! `aerie regenerate` end to end on a tiny random target: the output is ShareGPT JSONL that
//! `aerie data prepare` reads back; a run killed with SIGKILL and rerun gives the very bytes of
//! an uninterrupted run; and model arguments accept hub ids resolved from an offline Hugging Face
//! cache (a local path of the same name wins).

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{aerie_cmd, aerie_run, ok_json, s};
use serde_json::Value;

/// A scratch directory with the fixture target (`hidden`, `layers`, `seed`) in `target/` and
/// `n` fixture conversations in `chat.jsonl`: (dir, target, data).
fn target_and_chats(hidden: usize, layers: usize, seed: u64, n: usize) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, hidden, layers, seed);
    let data = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&data, &fixture::conversations(n));
    (dir, target, data)
}

#[test]
fn regenerated_data_is_read_back_by_data_prepare() {
    let (dir, target, data) = target_and_chats(32, 2, 3, 6);
    let out = dir.path().join("regen.jsonl");
    let flags = ["--max-new-tokens", "8", "--temperature", "0.7", "--top-p", "0.9", "--seed", "4", "--json"];
    let report = ok_json(aerie_run("regenerate", &target, &data, &out, &flags).output().unwrap());
    assert_eq!(report["records"], 6);
    assert_eq!(report["turns_regenerated"], 12);
    assert!(report["tokens_per_second"].as_f64().unwrap() > 0.0);
    // The sampling settings stand at the report's top level, as asked.
    assert_eq!(report["seed"], 4);
    assert!((report["temperature"].as_f64().unwrap() - 0.7).abs() < 1e-6, "{report}");
    assert!((report["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6, "{report}");
    assert!(dir.path().join("regen.report.json").is_file());
    let text = std::fs::read_to_string(&out).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["id"], "conv-0");
    assert_eq!(first["conversations"][0]["from"], "system");
    assert_eq!(first["conversations"][1]["from"], "human");
    assert_eq!(first["conversations"][2]["from"], "gpt");
    assert_ne!(first["conversations"][2]["value"], "Original answer 0 of 0.");

    let prepared = dir.path().join("prepared");
    let prep = ok_json(
        aerie_cmd()
            .args(["data", "prepare", "--data", s(&out), "--tokenizer", s(&target), "--out", s(&prepared)])
            .args(["--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(prep["conversations"]["kept"], 6, "{prep}");
    assert_eq!(prep["samples"], 6);
    assert_eq!(prep["read"]["malformed"], 0);

    // A missing input and a finished output are clear errors.
    let err = aerie_run("regenerate", &target, &dir.path().join("nope.json"), &dir.path().join("x.jsonl"), &[])
        .output()
        .unwrap();
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("nope.json"));
    let again = aerie_run("regenerate", &target, &data, &out, &[]).output().unwrap();
    assert!(String::from_utf8_lossy(&again.stderr).contains("--overwrite"));
}

#[test]
fn sigkill_then_rerun_gives_the_uninterrupted_bytes() {
    let (dir, target, data) = target_and_chats(128, 4, 8, 10);
    let run = |out: &Path| aerie_run("regenerate", &target, &data, out, &["--max-new-tokens", "24", "--json"]);
    let full = dir.path().join("full.jsonl");
    ok_json(run(&full).output().unwrap());
    let want = std::fs::read(&full).unwrap();

    let out = dir.path().join("killed.jsonl");
    let partial = PathBuf::from(format!("{}.partial", out.display()));
    let mut child = run(&out).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let start = Instant::now();
    loop {
        let lines = std::fs::read(&partial).map(|b| b.iter().filter(|&&c| c == b'\n').count()).unwrap_or(0);
        if lines >= 2 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "regenerate finished before it could be killed");
        assert!(start.elapsed() < Duration::from_secs(60), "no record written in 60 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.exists());
    let before = std::fs::read(&partial).unwrap();
    assert!(before.len() < want.len());
    let report = ok_json(run(&out).output().unwrap());
    assert!(report["resumed_records"].as_u64().unwrap() >= 2, "{report}");
    assert_eq!(std::fs::read(&out).unwrap(), want);
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// `models--org--name` laid out as huggingface_hub does: blobs named by content hash,
/// `snapshots/<commit>/<file>` relative symlinks into them, `refs/main` holding the commit.
fn hub_cache_with(cache: &Path, repo: &str, files: &Path) {
    let folder = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snap = folder.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(folder.join("blobs")).unwrap();
    std::fs::create_dir_all(folder.join("refs")).unwrap();
    std::fs::write(folder.join("refs/main"), COMMIT).unwrap();
    for entry in std::fs::read_dir(files).unwrap() {
        let entry = entry.unwrap();
        let bytes = std::fs::read(entry.path()).unwrap();
        let blob = format!("{:016x}{}", bytes.len(), entry.file_name().to_string_lossy().len());
        std::fs::write(folder.join("blobs").join(&blob), &bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(entry.file_name())).unwrap();
    }
}

#[test]
fn hub_ids_resolve_from_an_offline_cache_and_local_paths_win() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    fixture::write_target(&model, 32, 2, 3);
    let cache = dir.path().join("hub");
    hub_cache_with(&cache, "org/tiny", &model);
    let data = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&data, &fixture::conversations(2));
    let offline = || {
        let mut c = aerie_cmd();
        c.env("HF_HUB_CACHE", &cache).env("HF_HUB_OFFLINE", "1").env_remove("HF_HOME").current_dir(dir.path());
        c
    };
    // `data prepare --data <out> --tokenizer <tokenizer> --out <dir/prep>`, offline.
    let prepare = |out: &Path, tokenizer: &str, prep: &str| {
        ok_json(
            offline()
                .args(["data", "prepare", "--data", s(out), "--tokenizer", tokenizer, "--out"])
                .arg(dir.path().join(prep))
                .arg("--json")
                .output()
                .unwrap(),
        )
    };
    let snapshot = cache.join("models--org--tiny/snapshots").join(COMMIT);

    // regenerate --target and data prepare --tokenizer take the hub id (and @revision).
    let out = dir.path().join("regen.jsonl");
    let r = ok_json(
        offline()
            .args(["regenerate", "--target", "org/tiny", "--data", s(&data), "--out", s(&out), "--max-new-tokens", "4"])
            .arg("--json")
            .output()
            .unwrap(),
    );
    assert_eq!(r["records"], 2);
    let prep = prepare(&out, "org/tiny@main", "prep");
    assert_eq!(Path::new(prep["tokenizer"].as_str().unwrap()), snapshot);

    // A local directory named like the hub id wins over the cache.
    let local = dir.path().join("org/tiny");
    fixture::write_tokenizer(&local, Some(&format!("{}{{# local #}}", fixture::CHATML)));
    let prep = prepare(&out, "org/tiny", "prep-local");
    assert_eq!(prep["tokenizer"], "org/tiny");

    // A hub id missing from the offline cache is a clear error naming it.
    let miss = offline().args(["capture", "--target", "org/absent", "--data", "x", "--out", "y"]).output().unwrap();
    assert!(!miss.status.success());
    let err = String::from_utf8_lossy(&miss.stderr);
    assert!(err.contains("org/absent") && err.contains("--target"), "{err}");
}
