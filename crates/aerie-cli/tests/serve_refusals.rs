//! Issue 44 §1: on the user's node one engine start costs 10-20 minutes and a measurement hours,
//! so `eval serve` refuses everything it can before the first engine starts. Each case runs the
//! real `aerie` binary with a Python that cannot start any engine (`--python` naming a missing
//! file): a refusal that came from an engine start would name that Python, and the work directory
//! is never created, since nothing ran. No engine, no Python: these run in a second.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::path::{Path, PathBuf};

use common::refusal::refused;
use common::{aerie, s};

/// A directory with `config.json` of `model_type` and nothing else; `llama` gets the keys the
/// native target reads.
fn model_dir(root: &Path, name: &str, model_type: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let arch = if model_type == "llama" { "LlamaForCausalLM" } else { "DeepseekV3ForCausalLM" };
    let config = serde_json::json!({
        "architectures": [arch], "model_type": model_type, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu",
        "kv_lora_rank": 512, "q_lora_rank": 32, "qk_rope_head_dim": 64, "n_routed_experts": 8,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

struct Case {
    dir: tempfile::TempDir,
    target: PathBuf,
    drafter: PathBuf,
    prompts: PathBuf,
    work: PathBuf,
}

impl Case {
    fn new(model_type: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let target = model_dir(dir.path(), "target", model_type);
        let drafter = model_dir(dir.path(), "drafter", "llama");
        let prompts = dir.path().join("prompts.jsonl");
        std::fs::write(&prompts, "{\"prompt\": \"Say hi.\"}\n").unwrap();
        let work = dir.path().join("work");
        Self { dir, target, drafter, prompts, work }
    }

    /// `aerie eval serve` with `extra`; the run must not have created its work directory.
    fn serve(&self, extra: &[&str]) -> std::process::Output {
        let python = self.dir.path().join("no-python");
        let base = ["eval", "serve", "--target", s(&self.target), "--drafter", s(&self.drafter)];
        let more = ["--prompts", s(&self.prompts), "--workdir", s(&self.work), "--python", s(&python)];
        let out = aerie(&[&base[..], &more, extra].concat());
        assert!(!self.work.exists(), "a refusal before any engine starts creates no work directory");
        out
    }
}

/// `--predict` with a target aerie's native decoder cannot run (DeepSeek-V3, as Kimi-K2.5 is) used
/// to fail after hours of engine runs; it is refused at once with the `--predict-from` recipe.
#[test]
fn predict_with_a_target_the_native_decoder_cannot_run_is_refused_with_the_predict_from_recipe() {
    let c = Case::new("deepseek_v3");
    let err = refused(c.serve(&["--predict"]), &["--predict-from SHARDS", "deepseek_v3", "aerie capture"]);
    assert!(!err.contains("no-python"), "refused by an engine start, not before it: {err}");
}

/// `--predict` with a target the decoder runs but whose tokenizer is missing: refused before any
/// engine starts, not when the prediction loads it.
#[test]
fn predict_without_the_targets_tokenizer_is_refused_before_the_engine() {
    let c = Case::new("llama");
    let err = refused(c.serve(&["--predict"]), &["--predict: loading the tokenizer and chat template"]);
    assert!(!err.contains("no-python"), "{err}");
}

/// `--predict-from` a missing directory, an empty one, and one whose manifest holds no sample.
#[test]
fn predict_from_what_is_not_a_capture_is_refused_before_the_engine() {
    let c = Case::new("deepseek_v3");
    let missing = c.dir.path().join("missing");
    refused(c.serve(&["--predict-from", s(&missing)]), &["--predict-from", "not a capture's shard directory"]);
    let empty = c.dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    refused(c.serve(&["--predict-from", s(&empty)]), &["not a capture's shard directory", "manifest.json"]);
}

/// `--predict-from` shards that are truncated, of another target, or of another tokenizer: found
/// after the engine runs before, refused now before the first start (issue 47).
#[test]
fn predict_from_shards_of_another_target_or_truncated_is_refused_before_the_engine() {
    let c = Case::new("deepseek_v3");
    let f = common::refusal::Shards::new();
    let shards = f.write("shards", 3, 1 << 20, &"ab".repeat(32));
    // Another target: the case's has a vocabulary of 256, the shards' target another.
    let cfg = aerie_model::checkpoint::synthetic::tiny_config();
    refused(c.serve(&["--predict-from", s(&shards)]), &["--predict-from", "captured from a target of", "vocab_size"]);
    // This target, through another tokenizer.
    fixture::write_tokenizer(&c.target, Some(fixture::CHATML));
    let config = serde_json::json!({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": cfg.target_hidden_size, "vocab_size": cfg.vocab_size, "num_hidden_layers": 10,
    });
    std::fs::write(c.target.join("config.json"), config.to_string()).unwrap();
    refused(c.serve(&["--predict-from", s(&shards)]), &["another tokenizer", &"ab".repeat(32)]);
    // Truncated: a shard file cut short.
    let file = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len / 2).unwrap();
    refused(c.serve(&["--predict-from", s(&shards)]), &["not a capture's shard directory", s(&file)]);
}

/// `--costs-out` where nothing can be written (its parent is a file): refused before any engine
/// starts, not after the runs.
#[test]
fn a_costs_out_that_cannot_be_written_is_refused_before_the_engine() {
    let c = Case::new("llama");
    let file = c.dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let costs = file.join("costs.toml");
    let err = refused(c.serve(&["--costs-out", s(&costs)]), &["--costs-out", "costs.toml"]);
    assert!(!err.contains("no-python"), "{err}");
}

/// `eval decode` checks its `--out` and `--costs-out` the same way before loading the target
/// (here a config without weights, which a load would reject in other words).
#[test]
fn eval_decode_refuses_an_unwritable_output_before_decoding() {
    let c = Case::new("llama");
    let file = c.dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let base = ["eval", "decode", "--target", s(&c.target), "--drafter", s(&c.drafter), "--prompts", s(&c.prompts)];
    for flag in ["--out", "--costs-out"] {
        let bad = file.join("out.json");
        let err = refused(aerie(&[&base[..], &[flag, s(&bad)]].concat()), &[flag, "out.json"]);
        assert!(!err.contains("safetensors"), "refused before the target was loaded: {err}");
    }
}

/// Issue 44 §4: `--prompts` takes a named set; a name that is neither a file nor a set is refused
/// by the argument parser, listing the known names.
#[test]
fn an_unknown_prompt_set_names_the_known_ones() {
    let c = Case::new("llama");
    let python = c.dir.path().join("no-python");
    let out = aerie(&[
        "eval",
        "serve",
        "--target",
        s(&c.target),
        "--drafter",
        s(&c.drafter),
        "--prompts",
        "mtbenchh",
        "--python",
        s(&python),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("`mtbenchh` is neither a prompt file nor a named prompt set"), "{err}");
    assert!(err.contains("mtbench (MT-Bench"), "{err}");
}
