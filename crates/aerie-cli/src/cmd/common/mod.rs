//! What several subcommands share on the command line: flag groups (draft layout, shard walk,
//! chat input, `eval accept` and `compare`, the serving engine of `eval serve` and `compare
//! --engine` in [`engine`]), `--set KEY=VALUE` and `--same-role` parsing, and the reports one
//! subcommand writes and another reads ([`reports`]), and the stages of commands built from
//! other commands ([`stages`]).

pub mod engine;
pub mod reports;
pub mod stages;

use std::path::{Path, PathBuf};

use aerie_data::conversation::{NormalizeOptions, SameRolePolicy};
use aerie_data::readers::{InputFormat, ReadOptions};
use aerie_eval::accept::AcceptRule;
use aerie_eval::verify::AcceptOptions;
use aerie_model::drafter::shape::{DraftShape, TreeShape};
use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};

use crate::device::DeviceArg;

/// `NAME=VALUE` pairs as template variables (VALUE as JSON, else a string).
pub fn parse_template_kwargs(items: &[String]) -> Result<std::collections::BTreeMap<String, serde_json::Value>> {
    let mut out = std::collections::BTreeMap::new();
    for item in items {
        let Some((name, value)) = item.split_once('=') else {
            bail!("--template-kwarg {item}: expected NAME=VALUE");
        };
        let name = name.trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!("--template-kwarg {item}: `{name}` is not a template variable name");
        }
        let v = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_owned()));
        out.insert(name.to_owned(), v);
    }
    Ok(out)
}

/// Parse `--set KEY=VALUE` items (keys and values trimmed) as `aerie train` and `aerie bench
/// train` take them.
pub fn parse_set(items: &[String]) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => bail!("--set `{s}`: expected KEY=VALUE"),
        })
        .collect()
}

/// Same-role policy on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SameRole {
    /// Merge consecutive same-role turns.
    Merge,
    /// Cut the conversation at the second one.
    Cut,
}

impl SameRole {
    /// The normalisation rule this flag names.
    pub fn policy(self) -> SameRolePolicy {
        match self {
            SameRole::Merge => SameRolePolicy::Merge,
            SameRole::Cut => SameRolePolicy::Cut,
        }
    }
}

/// How chat data is read (`data prepare`, `regenerate`): the input layout, strictness and the
/// same-role policy, so both commands read a file the same way.
#[derive(Args, Debug, Clone)]
pub struct ChatInputArgs {
    /// Input layout: auto, json, jsonl, parquet.
    #[arg(long, default_value = "auto")]
    pub format: String,
    /// Fail on a malformed record or a truncated file instead of skipping with a warning.
    #[arg(long)]
    pub strict: bool,
    /// What to do with consecutive same-role turns.
    #[arg(long, value_enum, default_value = "merge")]
    pub same_role: SameRole,
}

impl ChatInputArgs {
    /// The reader's options.
    pub fn read_options(&self) -> Result<ReadOptions> {
        Ok(ReadOptions { format: self.format.parse::<InputFormat>()?, strict: self.strict })
    }

    /// The normaliser's options.
    pub fn normalize_options(&self) -> NormalizeOptions {
        NormalizeOptions { same_role: self.same_role.policy(), ..NormalizeOptions::default() }
    }
}

/// A count that must be 1 or more (clap's value parser): `--batch-size 0` evaluated nothing
/// and exited 0.
pub fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be 1 or more".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number ({e})")),
    }
}

/// How an evaluation walks captured shards (`eval loss`, `eval accept`, `compare`): batch size,
/// sample limit, the head's chunking and the device.
#[derive(Args, Debug, Clone)]
pub struct ShardPassArgs {
    /// Samples per forward.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub batch_size: usize,
    /// Evaluate only the first N samples.
    #[arg(long)]
    pub max_samples: Option<usize>,
    /// Rows of the target head per chunk of the full-vocabulary pass.
    #[arg(long, default_value_t = 8192, value_parser = at_least_one)]
    pub head_chunk_rows: usize,
    /// `cpu`, `cuda:N` or `wgpu:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
}

/// The draft layout flags of `eval accept`, `eval decode` and `compare`, with SGLang's names in
/// the help, so one chain or tree is described the same way everywhere.
#[derive(Args, Debug, Clone)]
pub struct DraftShapeArgs {
    /// Draft steps K (chain length, or tree depth).
    #[arg(long = "k", default_value_t = 3)]
    pub k: usize,
    /// Children per node of a draft tree (SGLang --speculative-eagle-topk); > 1 drafts a tree.
    #[arg(long, default_value_t = 1)]
    pub topk: usize,
    /// Tokens verified per pass of a tree, root included (SGLang --speculative-num-draft-tokens).
    #[arg(long)]
    pub tree_tokens: Option<usize>,
}

impl DraftShapeArgs {
    /// The layout these flags describe.
    pub fn shape(&self) -> Result<DraftShape> {
        Ok(match (self.topk, self.tree_tokens) {
            (1, None) => DraftShape::Chain { k: self.k },
            (topk, Some(verify_tokens)) => DraftShape::Tree(TreeShape { depth: self.k, topk, verify_tokens }),
            (topk, None) => {
                bail!("--topk {topk} drafts a tree: give --tree-tokens N (tokens verified per pass, root included)")
            }
        })
    }
}

/// Flags shared by `eval accept` and `compare`.
#[derive(Debug, Args)]
pub struct AcceptCommon {
    /// Captured shard directory (aerie-shard/1).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Target lm_head: a safetensors file with `lm_head.weight`, or the target model directory.
    /// Not needed when the shards carry a top-k teacher only. A hub id names the target's
    /// snapshot directory.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target_head: Option<PathBuf>,
    /// Target model to take `embed_tokens` from when a drafter does not ship it; defaults to
    /// --target-head when that is a directory. A directory, file or hub id.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: Option<PathBuf>,
    /// Draft layout.
    #[command(flatten)]
    pub draft: DraftShapeArgs,
    /// Draft temperature; 0 drafts the argmax (as SGLang's EAGLE worker does).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of the draft sampler (temperature > 0).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Verify rule: greedy (draft == target argmax), sampling (Σ min(p, q)), onehot (p(draft)).
    #[arg(long, default_value = "greedy")]
    pub rule: AcceptRule,
    /// The token budget the captured answers were generated with (regenerate's or the engine's
    /// max new tokens): an answer is at most that long, so the end-of-turn token the template
    /// adds after a cut answer is not predicted. Without it, that token is recognised by the
    /// target's argmax (docs/decoding.md).
    #[arg(long, value_name = "N")]
    pub answer_budget: Option<usize>,
    /// How the shards are walked.
    #[command(flatten)]
    pub pass: ShardPassArgs,
}

impl AcceptCommon {
    /// The library options these flags describe.
    pub fn options(&self) -> Result<AcceptOptions> {
        let opts = AcceptOptions {
            shape: self.draft.shape()?,
            temperature: self.temperature,
            seed: self.seed,
            rule: self.rule,
            batch_size: self.pass.batch_size,
            max_samples: self.pass.max_samples,
            head_chunk_rows: self.pass.head_chunk_rows,
            answer_budget: self.answer_budget,
        };
        opts.validate()?;
        Ok(opts)
    }

    /// The shard directory (`--data`), required by offline evaluation.
    pub fn data_dir(&self) -> Result<&Path> {
        self.data
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--data SHARD_DIR is required (captured shards to evaluate on)"))
    }

    /// The target to take `embed_tokens` from: `--target`, else `--target-head` when that is a
    /// directory.
    pub fn target_for_embedding(&self) -> Option<PathBuf> {
        self.target.clone().or_else(|| self.target_head.clone().filter(|p| p.is_dir()))
    }
}

/// A sweep's list flag (`--concurrency 1,4`, `--context short,long`): at least one value, each
/// once (a value given twice would measure one place twice and write it once).
pub fn sweep_list<T: PartialEq + std::fmt::Display>(flag: &str, values: &[T]) -> Result<()> {
    if values.is_empty() {
        bail!("{flag} needs at least one value");
    }
    if let Some((i, v)) = values.iter().enumerate().find(|(i, v)| values[..*i].contains(v)) {
        bail!("{flag}: {v} is given twice (value {})", i + 1);
    }
    Ok(())
}

/// `Ok` when a file can be written at `path`: its parent directory exists (or is created) and a
/// file created in it can be removed again. Checked before an engine starts, so an output that
/// cannot be written fails in a second, not after hours of measurement.
pub fn writable(path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if path.is_dir() {
        bail!("{} is a directory, not a file to write", path.display());
    }
    // The one maker of output directories: a file in the way is named as every writer names it.
    aerie_data::paths::create_output_dir(&parent, path).map_err(|(at, e)| anyhow::anyhow!("{}: {e}", at.display()))?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let probe = parent.join(format!(".aerie-write-check-{}-{nanos}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| format!("{}: cannot write in {}", path.display(), parent.display()))?;
    std::fs::remove_file(&probe)
        .with_context(|| format!("{}: cannot remove a file from {}", path.display(), parent.display()))?;
    Ok(())
}
