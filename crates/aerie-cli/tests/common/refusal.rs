//! What the reliability tests share: a scratch directory's bytes before and after, a refusal's
//! exit code and words, a writer frozen while it holds its lock, and the tiny drafter, head and
//! shard fixtures with a train config over them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use aerie_data::shard::{SampleRef, ShardWriter, ShardWriterOptions, shard_file_name};
use aerie_model::checkpoint::synthetic::tiny_config;

use super::{aerie, s, tiny_drafter_and_head, tiny_shard_metadata};

/// Every file under `dir` with its bytes: "no existing output changed" is this map's equality.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// The run failed with exit code 1 (an error, not a panic), and its stderr holds every `needle`.
pub fn refused(out: Output, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "expected a refusal (exit 1):\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from:\n{err}");
    }
    err
}

pub fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(status.success(), "kill {sig}");
}

/// Start `cmd`, wait until it holds `lock` (its pid is in the file), then freeze it (SIGSTOP):
/// a writer in the middle of its run, for as long as the test needs.
pub fn start_and_freeze(mut cmd: Command, lock: &Path) -> Child {
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let pid = child.id().to_string();
    let start = Instant::now();
    let mut child = child;
    while !std::fs::read_to_string(lock).is_ok_and(|t| t.trim() == pid) {
        assert!(child.try_wait().unwrap().is_none(), "the first writer ended before it could be frozen");
        assert!(start.elapsed() < Duration::from_secs(60), "{} not taken in 60 s", lock.display());
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&child, "-STOP");
    child
}

/// The first writer, killed as `kill -9` would (its lock file stays behind, with its pid).
pub fn kill(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Drafter, target head and shard fixtures of the synthetic tiny drafter config.
pub struct Shards {
    pub dir: tempfile::TempDir,
    pub drafter: PathBuf,
    pub head: PathBuf,
}

impl Shards {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (drafter, head) = tiny_drafter_and_head(dir.path());
        Self { dir, drafter, head }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `samples` samples of 10 + i % 7 tokens into `name/`, shards of `shard_tokens`, with
    /// sha256 checksums; `tokenizer_digest` says which tokenizer the ids are of.
    pub fn write(&self, name: &str, samples: usize, shard_tokens: usize, tokenizer_digest: &str) -> PathBuf {
        self.write_with(name, samples, shard_tokens, tokenizer_digest, true)
    }

    pub fn write_with(
        &self,
        name: &str,
        samples: usize,
        shard_tokens: usize,
        tokenizer_digest: &str,
        checksums: bool,
    ) -> PathBuf {
        let cfg = tiny_config();
        let (v, ht) = (cfg.vocab_size, cfg.target_hidden_size);
        let out = self.root().join(name);
        let meta = tiny_shard_metadata(tokenizer_digest);
        let mut w = ShardWriter::create(&out, meta, ShardWriterOptions { shard_tokens, checksums }).unwrap();
        for s in 0..samples {
            let n = 10 + s % 7;
            let ids: Vec<i32> = (0..n).map(|j| ((j * 37 + s) % v) as i32).collect();
            let mask: Vec<u8> = (0..n).map(|j| (j >= 2) as u8).collect();
            let aux: Vec<f32> = (0..n * 3 * ht).map(|i| (((i + s) * 31 % 97) as f32 / 97.0) - 0.5).collect();
            let fin: Vec<f32> = (0..n * ht).map(|i| (((i + s) * 13 % 89) as f32 / 89.0) - 0.5).collect();
            w.push(SampleRef::new(&ids, &mask, &aux[..]).with_final_hidden(&fin[..])).unwrap();
        }
        w.finish().unwrap();
        out
    }

    /// A train config of `epochs` over `train` (and `eval`) into `run`.
    pub fn train_config(
        &self,
        name: &str,
        run: &Path,
        seed: u64,
        epochs: usize,
        train: &[&Path],
        eval: &[&Path],
    ) -> PathBuf {
        let list = |dirs: &[&Path]| dirs.iter().map(|d| format!("{:?}", s(d))).collect::<Vec<_>>().join(", ");
        let toml = format!(
            "seed = {seed}\noutput_dir = {run:?}\nlog_every = 1\nttt_length = 2\n\n[data]\ntrain = [{train}]\neval = [{eval}]\n\
             batch_tokens = 64\n\n[init]\nkind = \"warm_start\"\ndrafter = {drafter:?}\n\n[target]\nhead = {head:?}\n\n\
             [optim]\nlr = 1e-3\nwarmup_ratio = 0.1\nepochs = {epochs}\n",
            run = s(run),
            train = list(train),
            eval = list(eval),
            drafter = s(&self.drafter),
            head = s(&self.head),
        );
        let path = self.root().join(name);
        std::fs::write(&path, toml).unwrap();
        path
    }

    pub fn eval(&self, what: &str, data: &Path, drafter: &Path, extra: &[&str]) -> Output {
        let args = ["eval", what, "--drafter", s(drafter), "--data", s(data), "--target-head", s(&self.head)];
        aerie(&[&args[..], extra, &["--json"]].concat())
    }
}

/// Overwrite the first element of `tensor` in the first shard of `data` with `bytes` (behind
/// the writer's back: what a disk or another program can do).
pub fn patch_first_shard(data: &Path, tensor: &str, bytes: &[u8]) -> PathBuf {
    let path = data.join(shard_file_name(0));
    patch_tensor(&path, tensor, 0, bytes);
    path
}

/// Overwrite element bytes of `tensor` in the safetensors file `path`, from byte `at` of its data.
pub fn patch_tensor(path: &Path, tensor: &str, at: usize, bytes: &[u8]) {
    let mut file = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let at = 8 + n + header[tensor]["data_offsets"][0].as_u64().unwrap() as usize + at;
    file[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, file).unwrap();
}

/// The names of the tensors of the safetensors file `path`.
pub fn tensor_names(path: &Path) -> Vec<String> {
    let file = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&file[8..8 + n]).unwrap();
    header.keys().filter(|k| *k != "__metadata__").cloned().collect()
}
