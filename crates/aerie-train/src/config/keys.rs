//! The table of every config key with its default and meaning, and what uses it: the unknown-key
//! check (with a "did you mean" from edit distance), `--set key=value`, and the documentation test
//! that `configs/README.md` lists every key. A declarative table, so it may grow past the usual
//! file size.

use std::path::Path;

use crate::{Error, Result};

/// One config key.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    /// Dotted path (`optim.lr`).
    pub key: &'static str,
    /// Default as TOML text, or `required`.
    pub default: &'static str,
    /// Whether changing it changes a run's result (checked on resume).
    pub affects_result: bool,
    /// One line of meaning.
    pub doc: &'static str,
}

const fn k(key: &'static str, default: &'static str, affects_result: bool, doc: &'static str) -> KeyDoc {
    KeyDoc { key, default, affects_result, doc }
}

/// Sections (TOML tables).
pub const SECTIONS: &[&str] = &["data", "init", "init.shape", "init.shape.mla", "target", "optim", "select"];

/// THE table of keys.
pub const KEYS: &[KeyDoc] = &[
    k("seed", "0", true, "seed of the data order and of fresh weights"),
    k("output_dir", "required", false, "run directory: checkpoint-<step>/, metrics.jsonl, summary.json"),
    k("ttt_length", "7", true, "K, unrolled draft steps of the TTT objective"),
    k("step_weight_decay", "0.8", true, "step k's loss is weighted step_weight_decay^k"),
    k(
        "loss",
        "\"soft_ce\"",
        true,
        "objective: soft_ce | tv (mean over pm of 1-α) | lk (λ·KL + (1-λ)(1-α), λ = exp(-α) detached)",
    ),
    k(
        "precision",
        "\"f32\"",
        true,
        "f32, or bf16: bf16 activations over f32 master weights and optimizer state (for CUDA; slower on the CPU)",
    ),
    k("log_every", "10", false, "write a metrics.jsonl line every N optimizer steps"),
    k("eval_every", "0", false, "evaluate on held-out data every N steps (0: only at the end)"),
    k("save_every", "0", false, "save a checkpoint every N steps (0: only at the end)"),
    k("keep_last", "3", false, "keep the newest N checkpoints (0: keep all)"),
    k("data.train", "required", true, "training shard directories (aerie-shard/1)"),
    k("data.eval", "[]", false, "held-out shard directories"),
    k(
        "data.eval_fraction",
        "0.0",
        true,
        "without data.eval: hold out this fraction of training samples (hash of dataset position and sample index)",
    ),
    k("data.batch_tokens", "4096", true, "token budget of one micro-batch, B·Lmax with padding counted"),
    k("data.max_length", "unset", true, "skip samples longer than this many tokens"),
    k("data.bucket_window", "256", true, "samples per shuffled window sorted by length before batching"),
    k("data.eval_batch_size", "4", false, "samples per forward during evaluation"),
    k("data.eval_max_samples", "unset", false, "evaluate on at most this many held-out samples per eval set"),
    k("init.kind", "required", true, "fresh | warm_start"),
    k("init.target_config", "target.path", true, "fresh: the target's config.json (or model directory)"),
    k("init.vocab", "unset", true, "draft vocab file from `aerie vocab build` (d2t/t2d); required for fresh"),
    k("init.drafter", "unset", true, "warm_start: the drafter directory"),
    k(
        "init.allow_vocab_override",
        "false",
        true,
        "warm_start: switch to init.vocab when it differs from the drafter's map",
    ),
    k(
        "init.from_target",
        "false",
        true,
        "fresh: lm_head rows and final norm from the target, fc passing the last aux feature, o_proj/down_proj zero",
    ),
    k("init.shape.hidden_size", "target's", true, "fresh: H"),
    k("init.shape.intermediate_size", "target's", true, "fresh: I"),
    k("init.shape.num_attention_heads", "target's", true, "fresh: nH"),
    k("init.shape.num_key_value_heads", "target's", true, "fresh: nKV"),
    k("init.shape.head_dim", "target's", true, "fresh: d"),
    k("init.shape.rms_norm_eps", "target's", true, "fresh: RMSNorm epsilon"),
    k("init.shape.rope_theta", "target's", true, "fresh: RoPE base"),
    k("init.shape.max_position_embeddings", "target's", true, "fresh: context length"),
    k("init.shape.aux_layer_ids", "[1, N/2-1, N-4]", true, "fresh: target layers consumed, output-of-layer convention"),
    k("init.shape.fc_norm", "false", true, "fresh: EAGLE-3.1 per-feature norms before fc"),
    k("init.shape.norm_output", "false", true, "fresh: EAGLE-3.1 post-norm state fed to the next step"),
    k("init.shape.mla.q_lora_rank", "unset", true, "fresh MLA drafter: query latent width (all five mla keys or none)"),
    k("init.shape.mla.kv_lora_rank", "unset", true, "fresh MLA drafter: key/value latent width"),
    k("init.shape.mla.qk_nope_head_dim", "unset", true, "fresh MLA drafter: per-head query/key width without RoPE"),
    k(
        "init.shape.mla.qk_rope_head_dim",
        "unset",
        true,
        "fresh MLA drafter: per-head rotated width (one key for all heads)",
    ),
    k("init.shape.mla.v_head_dim", "unset", true, "fresh MLA drafter: per-head value width"),
    k("target.path", "unset", true, "target model directory, or a safetensors file with its head and embedding"),
    k("target.head", "target.path", true, "where lm_head.weight (the teacher) comes from"),
    k("target.embedding", "target.path", true, "where the input embedding comes from"),
    k("target.head_chunk_rows", "8192", true, "head rows per chunk of the full-vocabulary teacher pass"),
    k("optim.lr", "1e-4", true, "peak learning rate"),
    k("optim.warmup_ratio", "0.015", true, "share of steps in linear warm-up; cosine to 0 follows"),
    k("optim.betas", "[0.9, 0.999]", true, "AdamW (β1, β2)"),
    k("optim.eps", "1e-8", true, "AdamW epsilon"),
    k("optim.weight_decay", "0.0", true, "decoupled weight decay"),
    k("optim.max_grad_norm", "0.5", true, "global gradient-norm clip (0: off)"),
    k("optim.grad_accumulation", "1", true, "micro-batches per device per optimizer step"),
    k("optim.epochs", "1", true, "passes over the training data (ignored with max_steps)"),
    k(
        "optim.max_steps",
        "unset",
        true,
        "stop after this many optimizer steps (0: save and evaluate the initial drafter)",
    ),
    k(
        "optim.anchor_weight",
        "0.0",
        true,
        "L2-SP: λ of λ/2·Σ‖θ − θ₀‖² toward the warm start's weights θ₀ (0: off; needs init.kind = \"warm_start\")",
    ),
    k(
        "optim.replay_weight",
        "0.0",
        true,
        "on-policy replay: β of the soft-CE added again at greedy decoding's cycle starts (0: off; soft_ce only)",
    ),
    k("select.every_steps", "0", false, "decode held-out prompts every N steps and after the last (0: the last only)"),
    k("select.prompts", "required", false, "held-out prompts (JSONL in eval decode's formats, or a named set)"),
    k("select.k", "2", false, "drafts per cycle of the greedy chain decoded"),
    k("select.max_new_tokens", "64", false, "new tokens per answer at most"),
    k("select.max_prompts", "unset", false, "decode only the first N prompts"),
    k("select.target", "target.path", false, "the target model directory decoded against"),
    k("select.template", "\"auto\"", false, "chat template: auto, a built-in name, or a .jinja file"),
];

/// The entry of `key`, if it is a key.
pub fn find(key: &str) -> Option<&'static KeyDoc> {
    KEYS.iter().find(|k| k.key == key)
}

/// Levenshtein distance (unit costs), on chars.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn split(key: &str) -> (&str, &str) {
    key.rsplit_once('.').unwrap_or(("", key))
}

/// Edit distance, except that a name that is a prefix of the other (3 chars or more) counts as 1:
/// `warmup` is close to `warmup_ratio`.
fn name_distance(a: &str, b: &str) -> usize {
    let prefix = a.len().min(b.len()) >= 3 && (a.starts_with(b) || b.starts_with(a));
    if prefix && a != b { 1 } else { edit_distance(a, b) }
}

/// The valid key (or section) nearest to the unknown `key`: the smallest edit distance between
/// last segments, ties broken by preferring the same section, then the full-path distance. `None`
/// when nothing is close (more than a third of the name, at least 2, would have to change).
pub fn suggest(key: &str) -> Option<&'static str> {
    let (section, name) = split(key);
    let candidates = KEYS.iter().map(|k| k.key).chain(SECTIONS.iter().copied());
    let (best, score) = candidates
        .map(|c| {
            let (c_section, c_name) = split(c);
            (c, (name_distance(name, c_name), usize::from(c_section != section), edit_distance(key, c)))
        })
        .min_by_key(|&(c, score)| (score, c))?;
    let limit = (name.chars().count() / 3).max(2);
    (score.0 <= limit).then_some(best)
}

fn unknown(key: &str, source: &Path) -> Error {
    let section = split(key).0;
    let hint = match suggest(key) {
        Some(s) => format!("; did you mean `{s}`?"),
        None => {
            let here: Vec<&str> = KEYS.iter().map(|k| k.key).filter(|k| split(k).0 == section).collect();
            format!("; valid keys{}: {}", if section.is_empty() { "" } else { " here" }, here.join(", "))
        }
    };
    Error::config(source, format!("unknown key `{key}`{hint}"))
}

/// serde's words for a value of the wrong type in this field's words: "expected f64" is "expected
/// a number", a sequence is a list, a field is a key.
pub(super) fn plain_words(message: &str) -> String {
    [
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected u32", "expected a whole number, 0 or more"),
        ("expected a sequence", "expected a list, e.g. [\"a\", \"b\"]"),
        ("missing field", "missing key"),
    ]
    .iter()
    .fold(message.to_owned(), |m, (serde, plain)| m.replace(serde, plain))
}

/// Check every key of `table` (found under `prefix`) against the table of keys.
pub fn check_table(table: &toml::Table, prefix: &str, source: &Path) -> Result<()> {
    for (name, value) in table {
        let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        if SECTIONS.contains(&key.as_str()) {
            match value {
                toml::Value::Table(t) => check_table(t, &key, source)?,
                _ => return Err(Error::config(source, format!("`{key}` must be a table ([{key}])"))),
            }
        } else if find(&key).is_none() {
            return Err(unknown(&key, source));
        }
    }
    Ok(())
}

/// Parse a `--set` value: a TOML value (`1e-5`, `true`, `[1, 2]`, `"text"`), or else the bare
/// text as a string (`--set output_dir=runs/x`).
fn parse_value(raw: &str) -> toml::Value {
    let wrapped = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&wrapped) {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

/// Apply `--set key=value` to a parsed config table.
pub fn set(table: &mut toml::Table, key: &str, raw: &str) -> Result<()> {
    let source = Path::new("--set");
    if SECTIONS.contains(&key) {
        let first = KEYS.iter().map(|k| k.key).find(|k| split(k).0 == key).unwrap_or("optim.lr");
        return Err(Error::config(
            source,
            format!(
                "`{key}` is a section, not a key: set one of its keys, e.g. `--set {first}=...` (configs/README.md lists them)"
            ),
        ));
    }
    if find(key).is_none() {
        return Err(unknown(key, source));
    }
    let mut node = table;
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().expect("split yields at least one part");
    let mut path = String::new();
    for part in parts {
        path = if path.is_empty() { part.to_string() } else { format!("{path}.{part}") };
        let entry = node.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(Error::config(source, format!("`{path}` is not a table"))),
        };
    }
    node.insert(leaf.to_string(), parse_value(raw));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(edit_distance("lr", "lr"), 0);
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("optim.lrr"), Some("optim.lr"));
        assert_eq!(suggest("optim.warmup"), Some("optim.warmup_ratio"));
        assert_eq!(suggest("lr"), Some("optim.lr"));
        assert_eq!(suggest("data.bach_tokens"), Some("data.batch_tokens"));
        assert_eq!(suggest("ttt_lenght"), Some("ttt_length"));
        assert_eq!(suggest("completely_unrelated_thing"), None);
    }

    #[test]
    fn set_parses_values_and_refuses_unknown_keys() {
        let mut t = toml::Table::new();
        set(&mut t, "optim.lr", "5e-5").unwrap();
        set(&mut t, "output_dir", "runs/x").unwrap();
        set(&mut t, "init.shape.aux_layer_ids", "[1, 2, 3]").unwrap();
        assert_eq!(t["optim"]["lr"].as_float(), Some(5e-5));
        assert_eq!(t["output_dir"].as_str(), Some("runs/x"));
        assert_eq!(t["init"]["shape"]["aux_layer_ids"].as_array().map(Vec::len), Some(3));
        let e = set(&mut t, "optim.learning_rate", "1").unwrap_err().to_string();
        assert!(e.contains("unknown key `optim.learning_rate`"), "{e}");
        // A section given as a key: it suggested the section itself ("did you mean `optim`?").
        let e = set(&mut t, "optim", "1").unwrap_err().to_string();
        assert!(e.contains("`optim` is a section, not a key") && e.contains("--set optim."), "{e}");
    }
}
