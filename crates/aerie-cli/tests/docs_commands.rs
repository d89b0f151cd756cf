//! The docs are tests (issue 44 §1): every `aerie ...` command printed in README.md and
//! docs/*.md is checked against the real binary, so a documented command that no longer parses
//! or no longer works fails here instead of on the user's GPU node.
//!
//! What is extracted: every line of a fenced block that starts with `aerie ` (after a `$ ` prompt
//! and `NAME=value` environment assignments; `cargo run -p aerie-cli --` counts as `aerie`;
//! `\` continuations joined, `# comments` cut) and every inline `` `aerie ...` `` span (`\|` of
//! a table read as `|`).
//!
//! How each is checked (docs/commands.md, "The docs are tests", says the same for users):
//! - A **synopsis** (it has `[optional]` parts, `...`/`…`, `(a | b)` groups or `a|b`
//!   alternatives) is a reference form: its required part must parse (one variant per
//!   alternative), missing arguments allowed, and every `--flag` it names, optional ones
//!   included, must be in `aerie <command> --help`.
//! - An inline span may be a **fragment** (`aerie capture --engine sglang --tp 8`): it must parse
//!   except for the required arguments it leaves out (clap checks every flag name and value it
//!   meets before it reports missing arguments), or end in a flag that prose names without its
//!   value (`aerie project --costs`).
//! - Any other line of a fenced block is a **command** a user copies: it must parse in full.
//!   Every complete command (a fenced one, or an inline span that happens to be complete) is
//!   either run here for real ([`RUNS`], tier 2) or listed in [`CANNOT_RUN`] with the reason;
//!   the test fails on a command that is neither, and on a list entry that no longer appears in
//!   the docs, so the lists stay honest.
//!
//! Parsing (tier 1) runs the binary with `AERIE_PARSE_ONLY=1` (main.rs): it stops after clap,
//! value parsers included, so model flags still resolve their Hub ids and `--prompts mtbench`
//! its asset. The command text stays as printed except for [the substitutions](substitute):
//! `$VAR` values ([`VARS`]), `<placeholder>` → a file name, `~` → a scratch `$HOME`, absolute
//! paths re-rooted in the scratch directory. Inputs the command names are then made to exist
//! ([`Role`]): each path a flag reads is created from a tiny fixture when it is missing, and
//! each Hub id of [`HUB_IDS`] is put in an offline Hugging Face cache (`HF_HUB_OFFLINE=1`)
//! holding the same fixture, so `--target moonshotai/Kimi-K2.5` resolves as printed.

mod common;
#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;

use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
use aerie_model::checkpoint::{Dtype, SaveOptions, save_drafter};
use aerie_model::{AuxConvention, AuxLayers};
use common::{aerie_cmd, s};

/// Values of the shell variables the docs' recipes use (docs/shard-format.md's experiments).
const VARS: &[(&str, &str)] = &[
    ("$AERIE_SGLANG_PYTHON", "python3"),
    ("$NAME", "bf16-topk32"),
    ("$Q", "q"),
    ("$M", "m"),
    ("$D", "bf16"),
    ("$E", "bf16"),
    ("$K", "32"),
];

/// The Hub ids the docs name, put in the offline Hub cache (`org/name` paths such as
/// `run-a/checkpoint` are the user's directories: made locally).
const HUB_IDS: &[&str] = &["moonshotai/Kimi-K2.5", "AQ-MedAI/Kimi-K2-Instruct-eagle3"];

/// Values for upper-case placeholders where the flag wants a number or a name, not a path
/// (`--draft-vocab N`); other placeholders (`DIR`, `PREPARED`, `URL`) stay as printed: they are
/// file names in the scratch directory, made to exist when the flag reads one.
const PLACEHOLDER_VALUES: &[(&str, &str)] =
    &[("--draft-vocab", "64"), ("--k", "2"), ("--dtype", "bf16"), ("--teacher", "final-hidden")];

/// Complete documented commands that cannot run here, grouped by the reason. Every complete
/// command the docs print must be here or in [`RUNS`]; an entry no longer in the docs fails.
const CANNOT_RUN: &[(&str, &[&str])] = &[
    (
        "SGLang or vLLM with Kimi-K2.5 on 8 GPUs (tests/kimi_job.rs runs the job on the miniature)",
        &[
            "aerie capture --engine sglang --tp 8 --self-test --target KIMI --data PREPARED",
            "aerie capture --engine sglang --tp 8 --self-test --target <Kimi-K2.5> --data <PREPARED> --aux-layers 1,29,57",
            "aerie capture --engine sglang --tp 8 --target <Kimi-K2.5> --data <PREPARED> --out <SHARDS> --aux-layers 1,29,57 --teacher topk:64 --max-batch-tokens 32768 --shard-tokens 32768",
            "aerie capture --engine vllm --tp 8 --device cuda:0 --self-test --target <Kimi-K2.5> --data <PREPARED> --aux-layers 1,29,57 --engine-arg=--trust-remote-code",
            "aerie capture --engine vllm --tp 8 --device cuda:0 --target <Kimi-K2.5> --data <PREPARED> --out <SHARDS> --aux-layers 1,29,57 --teacher topk:64 --max-batch-tokens 32768 --shard-tokens 32768 --engine-arg=--trust-remote-code --engine-arg=--vllm-tmp --engine-arg=<FAST LOCAL DIR>",
            "aerie capture --engine sglang --tp 8 --target KIMI --data PREPARED --out SHARDS --aux-layers 1,29,57 --dtype fp8-e4m3 --teacher final-hidden+topk:32",
            "aerie capture --engine sglang --tp 8 --self-test --target /models/Kimi-K2.5 --data PREPARED",
            "aerie capture --engine sglang --tp 8 --target /models/Kimi-K2.5 --data PREPARED --out SHARDS --aux-layers 1,29,57 --teacher topk:64 --engine-arg=--trust-remote-code",
            "aerie eval serve --engine sglang --target moonshotai/Kimi-K2.5 --drafter /models/kimi-k25-eagle3-sglang --prompts mtbench --k 2,3 --predict-from SHARDS --costs-out k25.toml --engine-arg=--tp --engine-arg=8 --engine-arg=--trust-remote-code",
            "aerie eval serve --engine sglang --target /models/Kimi-K2.5 --drafter drafter-sglang --prompts mtbench --k 2,3 --max-new-tokens 256 --predict-from SHARDS --costs-out k25-sglang.toml --engine-arg=--tp --engine-arg=8 --engine-arg=--trust-remote-code --engine-arg=--mem-fraction-static --engine-arg=0.85",
            "aerie eval serve --engine vllm --target /models/Kimi-K2.5 --drafter drafter-vllm --prompts mt_bench.jsonl --k 2,3 --max-new-tokens 256 --costs-out k25-vllm.toml --engine-arg=--tensor-parallel-size --engine-arg=8 --engine-arg=--trust-remote-code",
        ],
    ),
    (
        "starts vLLM's CPU build: minutes (tests/serve_vllm.rs runs it on the quickstart's drafter)",
        &[
            "aerie eval serve --engine vllm --target aerie-quickstart/smollm2 --drafter aerie-quickstart/drafter-sglang --prompts ~/.cache/aerie/assets/mtbench/question.jsonl --max-prompts 8 --k 1,2,3 --max-new-tokens 128 --predict --costs-out vllm-costs.toml",
            "aerie eval serve --engine vllm --target WORK/smollm2 --drafter tests/fixtures/smollm2-135m-eagle3 --prompts mt8.jsonl --k 1,2,3 --max-new-tokens 64 --predict --costs-out vllm-costs.toml",
        ],
    ),
    (
        "the cost surface on a GPU node or of a running server (tests/serve_vllm.rs and serve_sglang.rs sweep it on the CPU)",
        &[
            "aerie eval serve --engine sglang --target DIR --drafter DRAFTER --prompts mtbench --max-prompts 16 --k 1,2,3 --concurrency 1,4,16,64 --context short,long --costs-out surface.toml --heatmap surface.png",
            "aerie eval serve --engine sglang --target moonshotai/Kimi-K2.5 --drafter /models/kimi-k2.5-eagle3 --prompts mtbench --max-prompts 64 --k 1,2,3 --concurrency 1,4,16,64 --context short,long --costs-out k25-surface.toml --heatmap k25-surface.png --engine-arg=--tp --engine-arg=8 --engine-arg=--trust-remote-code",
            "aerie measure --server URL --prompts mtbench --concurrency 1,4,16,64 --context short,long --out surface.toml",
            "aerie measure --server URL --prompts mtbench --concurrency 1,4,16,64 --context short,long --out surface.toml --heatmap surface.png",
            "aerie measure --server http://127.0.0.1:30000 --prompts mtbench --max-prompts 64 --concurrency 1,4,16,64 --context short,long --out k25-surface.toml",
            "aerie project --costs k25-surface.toml --concurrency 16 --context long",
            "aerie project --costs surface.toml --concurrency 16 --context long",
        ],
    ),
    (
        "talks to a serving engine already running (tests/regenerate_server.rs, tests/serve_*.rs start one)",
        &[
            "aerie doctor --server http://127.0.0.1:30000 --drafter /models/kimi-k2.5-eagle3 --concurrency 1",
            "aerie doctor --server URL",
            "aerie measure --server URL --prompts mtbench",
            "aerie measure --server http://127.0.0.1:30000 --prompts mt_bench.jsonl --out costs.toml",
            "aerie regenerate --server http://HOST:30000 --api sglang --tokenizer moonshotai/Kimi-K2.5 --data chats.jsonl --out /data/kimi-k25/regen.jsonl --template-kwarg thinking=true --max-new-tokens 4096 --max-length 8192 --concurrency 64",
            "aerie regenerate --server http://HOST:8000 --api vllm --tokenizer moonshotai/Kimi-K2.5 --data chats.jsonl --out regen.jsonl --template-kwarg thinking=true --max-new-tokens 4096 --concurrency 64",
            "aerie regenerate --server http://127.0.0.1:PORT --tokenizer SMOLLM2 --data mt8.jsonl --out c1.jsonl --max-new-tokens 64 --concurrency 1",
            "aerie regenerate --server http://HOST:30000 --api sglang --tokenizer moonshotai/Kimi-K2.5 --data chats.jsonl --out regen.jsonl --template-kwarg thinking=true --max-new-tokens 4096 --max-length 8192 --concurrency 64",
            "aerie regenerate --server http://HOST:8000 --api vllm --tokenizer moonshotai/Kimi-K2.5 --data chats.jsonl --out regen.jsonl --template-kwarg thinking=true --max-new-tokens 4096 --max-length 8192 --concurrency 64",
        ],
    ),
    (
        "downloads from the Hugging Face Hub or PyPI (the clients are tested offline: tests/regenerate.rs)",
        &[
            "aerie hub download moonshotai/Kimi-K2.5 --include '*.json' --include '*.model' --include '*.jinja' --include '*.py'",
            "aerie hub download AQ-MedAI/Kimi-K2-Instruct-eagle3",
            "aerie assets fetch humaneval",
            "aerie quickstart",
        ],
    ),
    (
        "trains for hours or on GPUs (tests/e2e.rs trains the quickstart's config)",
        &[
            "aerie train configs/kimi-k25-finetune.toml --devices cuda:0..7",
            "aerie train CONFIG.toml",
            "aerie train $M/train-$D.toml",
            "aerie train $M/train-$NAME.toml",
            "aerie bench ttt --shape smollm2 --seq-len 64 --ttt-length 2 --steps 1 --device cuda:0",
        ],
    ),
    (
        "the domain-shift benchmark: the quickstart and 16 fine-tunes, about an hour on 2 cores (each of its stages is a command other tests run: tests/e2e.rs, tests/cycle_walk.rs, aerie-train's tests/train/anchor.rs and replay.rs, python/tests/test_specforge_finetune.py)",
        &[
            "aerie bench shift --workdir aerie-shift --replay-weight 1,3 --specforge-wheel .work/gpu/specforge-0.2.0-py3-none-any.whl",
        ],
    ),
    (
        "Kimi-K2.5's drafter shape (vocabulary 163,840, hidden 7168): tens of GB and minutes per step on this CPU",
        &[
            "aerie bench train configs/kimi-k25-finetune.toml",
            "aerie bench train configs/kimi-k25-finetune.toml --set init.drafter=<config-only dir> --seq-len 256 --steps 1 --warmup 0 --json",
            "aerie vocab build /data/kimi-k25/prepared --draft-vocab 32000 --out /data/kimi-k25/vocab.safetensors --keep-from AQ-MedAI/Kimi-K2-Instruct-eagle3",
        ],
    ),
    ("a SmolLM2-shaped TTT benchmark: minutes of CPU beside the other tests", &["aerie bench ttt"]),
    (
        "needs a llama.cpp GGUF file (the SmolLM2 asset is a download; tests/decode.rs imports it when cached)",
        &["aerie import gguf FILE --out DIR"],
    ),
];

/// TEMPORARY: commands whose fix is being landed beside this test (issue 44: `eval serve
/// --target <hub id>`, `--prompts mtbench` resolved as a named prompt set). A failure to parse
/// or to run is tolerated and printed as a note; once one parses and runs, a note says to remove
/// it. Empty once the fix is committed.
const PENDING: &[(&str, &str)] = &[];

/// Documented spans that are not commands: what they are.
const NOT_COMMANDS: &[(&str, &str)] = &[
    (
        "aerie COMMAND --help",
        "the pattern every subcommand's --help follows (each is run by `every_documented_subcommand_has_help`)",
    ),
    ("aerie 0.1.0 (sglang 0.5.2)", "a `created_by` value of shard metadata"),
];

/// What a documented command reads at a path: the fixture created there when it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A tiny Llama target with its byte-level tokenizer and ChatML template (H 32, 4 layers).
    Target,
    /// An EAGLE-3 drafter for that target (aux layers 0, 1, 2; draft vocabulary 64).
    Drafter,
    /// Chat data: ShareGPT JSON for `.json`, else JSONL.
    Chats,
    /// MT-Bench-style prompts (`question_id`, `turns`).
    Prompts,
    /// A costs file (a copy of configs/costs/smollm2-native-cpu-2core.toml).
    Costs,
    /// A run directory with a `metrics.jsonl` of three train lines.
    Run,
    /// The chats prepared with the target's tokenizer (`aerie data prepare`).
    Prepared,
    /// Their capture by the target (`aerie capture`: f32, aux layers 0, 1, 2, teacher
    /// `final-hidden+topk:32`, so that `shards convert --teacher topk:K` has the top-k to keep).
    Shards,
}

/// The role of the value of `flag` (`""` for a positional argument) of the subcommand `cmd`.
fn role(cmd: &str, flag: &str) -> Option<Role> {
    use Role::*;
    Some(match (cmd, flag) {
        (_, "--target" | "--target-head" | "--tokenizer") => Target,
        (_, "--drafter" | "--keep-from") => Drafter,
        ("inspect" | "export" | "compare", "") => Drafter,
        ("data prepare" | "regenerate", "--data") => Chats,
        ("capture", "--data") => Prepared,
        ("data show" | "vocab build", "") => Prepared,
        (_, "--prompts") => Prompts,
        (_, "--costs") => Costs,
        ("plot", "") => Run,
        ("eval loss" | "eval accept" | "compare", "--data") | (_, "--predict-from") => Shards,
        ("shards convert" | "shards verify" | "bench shards", "") => Shards,
        _ => return None,
    })
}

/// One `aerie` span of the docs.
#[derive(Debug, Clone)]
struct Doc {
    file: String,
    line: usize,
    /// Normalised: one line, single spaces, `aerie` first.
    text: String,
    /// From a fenced block (a command to copy) rather than an inline span.
    fenced: bool,
}

impl Doc {
    fn at(&self) -> String {
        format!("{}:{}: `{}`", self.file, self.line, self.text)
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// README.md and docs/*.md, repository-relative.
fn doc_files() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(workspace().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every `aerie` span of one markdown text.
fn extract(file: &str, text: &str) -> Vec<Doc> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    let mut prose = String::new();
    // (byte offset in `prose`, line number) to map inline spans back to lines.
    let mut prose_lines: Vec<(usize, usize)> = Vec::new();
    while i < lines.len() {
        if lines[i].trim_start().starts_with("```") {
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                let start = i;
                let mut joined = lines[i].to_owned();
                while joined.trim_end().ends_with('\\') && i + 1 < lines.len() {
                    joined = format!("{} {}", joined.trim_end().trim_end_matches('\\'), lines[i + 1]);
                    i += 1;
                }
                if let Some(cmd) = command_of_line(&joined) {
                    out.push(Doc { file: file.into(), line: start + 1, text: cmd, fenced: true });
                }
                i += 1;
            }
            i += 1;
            continue;
        }
        prose_lines.push((prose.len(), i + 1));
        prose.push_str(lines[i]);
        prose.push('\n');
        i += 1;
    }
    // Inline code spans (they may wrap over lines).
    let mut rest = prose.as_str();
    let mut offset = 0;
    while let Some(open) = rest.find('`') {
        let ticks = rest[open..].chars().take_while(|&c| c == '`').count();
        let after = &rest[open + ticks..];
        let fence = "`".repeat(ticks);
        let Some(close) = after.find(&fence) else { break };
        let span = &after[..close];
        let line = prose_lines.iter().rev().find(|(o, _)| *o <= offset + open).map_or(0, |(_, l)| *l);
        let span = squash(&span.replace("\\|", "|"));
        if span.starts_with("aerie ") {
            out.push(Doc { file: file.into(), line, text: span, fenced: false });
        }
        let consumed = open + ticks + close + ticks;
        offset += consumed;
        rest = &rest[consumed..];
    }
    out
}

/// The `aerie` command of one (joined) line of a fenced block, if it is one.
fn command_of_line(line: &str) -> Option<String> {
    let mut l = line.trim();
    l = l.strip_prefix("$ ").unwrap_or(l);
    // Environment assignments before the command (`RAYON_NUM_THREADS=1 aerie train ...`).
    while let Some((first, rest)) = l.split_once(' ') {
        let is_env = first.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        });
        if !is_env {
            break;
        }
        l = rest.trim_start();
    }
    let l =
        if let Some(rest) = l.strip_prefix("cargo run -p aerie-cli -- ") { format!("aerie {rest}") } else { l.into() };
    if !l.starts_with("aerie ") {
        return None;
    }
    let l = match l.find(" #") {
        Some(at) => &l[..at],
        None => &l,
    };
    Some(squash(l))
}

fn all_docs() -> Vec<Doc> {
    let root = workspace();
    doc_files().iter().flat_map(|f| extract(f, &std::fs::read_to_string(root.join(f)).unwrap())).collect()
}

/// A synopsis: it has optional parts, repetition or alternatives (`(a | b)`, `sglang|vllm`).
fn is_synopsis(text: &str) -> bool {
    ['[', '(', '|', '…'].iter().any(|c| text.contains(*c)) || text.contains("...")
}

/// `text` with `$VAR`s and `<placeholders>` substituted (see the module doc).
fn substitute(text: &str) -> String {
    let mut t = text.to_owned();
    for (var, value) in VARS {
        t = t.replace(var, value);
    }
    // `<Kimi-K2.5>`, `<FAST LOCAL DIR>` → `kimi-k2.5`, `fast-local-dir`.
    while let (Some(a), Some(b)) = (t.find('<'), t.find('>')) {
        if b < a {
            break;
        }
        let name = t[a + 1..b].to_lowercase().replace(' ', "-");
        t.replace_range(a..=b, &name);
    }
    t
}

/// Shell words: whitespace-separated, single and double quotes removed.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    let mut any = false;
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (_, c) => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// The variants of a synopsis's required part: `[...]` dropped, `(a | b)` and `x|y` expanded,
/// a spaced ` | ` (a shell pipe) cut, `...` dropped. Not a synopsis: itself, with `x|y` expanded.
fn variants(text: &str) -> Vec<String> {
    // Optional parts.
    let mut required = String::new();
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            c if depth == 0 => required.push(c),
            _ => {}
        }
    }
    // Alternative groups: one variant per branch.
    let mut texts = vec![required];
    while let Some(t) = texts.iter().find(|t| t.contains('(')).cloned() {
        texts.retain(|x| *x != t);
        let (a, b) = (t.find('(').unwrap(), t.find(')').unwrap());
        for branch in t[a + 1..b].split(" | ") {
            texts.push(format!("{}{}{}", &t[..a], branch, &t[b + 1..]));
        }
    }
    let mut out = Vec::new();
    for t in texts {
        let t = t.split(" | ").next().unwrap().replace("...", " ").replace('…', " ");
        // `x|y` in a word: one variant per alternative (the product over words).
        let mut acc = vec![String::new()];
        for w in t.split_whitespace() {
            let alts: Vec<&str> = if w.contains('|') { w.split('|').collect() } else { vec![w] };
            acc = acc.iter().flat_map(|a| alts.iter().map(move |x| format!("{a} {x}"))).collect();
        }
        out.extend(acc.into_iter().map(|a| a.trim().to_owned()));
    }
    out.sort();
    out.dedup();
    out
}

/// The flags of one subcommand, from its `--help`: name → takes a value.
#[derive(Debug, Default, Clone)]
struct Flags(BTreeMap<String, bool>);

/// The subcommand path of `args` (`["eval", "serve", ...]` → `eval serve`) and its flags,
/// each help read once.
struct Cli {
    helps: BTreeMap<String, (bool, Flags)>,
}

impl Cli {
    fn new() -> Self {
        Self { helps: BTreeMap::new() }
    }

    /// `(has subcommands, flags)` of `aerie <path> --help`, `None` when it is no subcommand.
    fn help(&mut self, path: &str) -> Option<(bool, Flags)> {
        if let Some(h) = self.helps.get(path) {
            return Some(h.clone());
        }
        let out = aerie_cmd().args(path.split_whitespace()).arg("--help").output().unwrap();
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut flags = Flags::default();
        for line in text.lines() {
            let l = line.trim_start();
            if !l.starts_with('-') {
                continue;
            }
            for part in l.split(", ") {
                let Some(name) = part.split_whitespace().next().filter(|n| n.starts_with("--")) else { continue };
                let takes = part.split_whitespace().nth(1).is_some_and(|v| v.starts_with('<') || v.starts_with("[<"));
                flags.0.insert(name.trim_end_matches(',').to_owned(), takes);
            }
        }
        let entry = (text.contains("\nCommands:"), flags);
        self.helps.insert(path.to_owned(), entry.clone());
        Some(entry)
    }

    /// The subcommand path that `args` (after `aerie`) name, and its flags.
    fn path_of(&mut self, args: &[String]) -> Option<(String, Flags)> {
        let mut path = String::new();
        let mut flags = None;
        for a in args {
            let (nested, f) = self.help(&path)?;
            if !nested || a.starts_with('-') {
                flags = Some(f);
                break;
            }
            path = format!("{path} {a}").trim().to_owned();
        }
        let flags = match flags {
            Some(f) => f,
            None => self.help(&path)?.1,
        };
        Some((path, flags))
    }
}

/// The (flag or `""`, value) pairs of `args` after the subcommand path.
fn values(args: &[String], path: &str, flags: &Flags) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut it = args.iter().skip(path.split_whitespace().count()).peekable();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if let Some(flag) = a.strip_prefix("--").map(|_| a.as_str()) {
            if let Some((f, v)) = flag.split_once('=') {
                out.push((f.to_owned(), v.to_owned()));
            } else if flags.0.get(flag).copied().unwrap_or(false)
                && let Some(v) = it.next()
            {
                out.push((flag.to_owned(), v.clone()));
            }
        } else if !a.starts_with('-') {
            out.push((String::new(), a.clone()));
        }
    }
    out
}

/// The fixtures, built once, and the scratch directory commands run in.
struct World {
    root: tempfile::TempDir,
    fixtures: PathBuf,
    next: usize,
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl World {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let fixtures = root.path().join("fixtures");
        fixture::write_target(&fixtures.join("target"), 32, 4, 21);
        write_drafter(&fixtures.join("drafter"));
        fixture::write_jsonl(&fixtures.join("chats.jsonl"), &fixture::conversations(6));
        let array = serde_json::Value::Array(fixture::conversations(6));
        std::fs::write(fixtures.join("chats.json"), array.to_string()).unwrap();
        std::fs::write(
            fixtures.join("prompts.jsonl"),
            concat!(
                r#"{"question_id": 81, "category": "writing", "turns": ["Say hi.", "Again?"]}"#,
                "\n",
                r#"{"question_id": 82, "category": "math", "turns": ["Why is 3 odd?", "And 5?"]}"#,
                "\n"
            ),
        )
        .unwrap();
        std::fs::copy(workspace().join("configs/costs/smollm2-native-cpu-2core.toml"), fixtures.join("costs.toml"))
            .unwrap();
        write_run(&fixtures.join("run"));
        Self { root, fixtures, next: 0 }
    }

    /// A fresh working directory (a clone's root: `configs/`, `tests/` link to the repository's)
    /// with its own `$HOME`, `$AERIE_HOME` (MT-Bench cached) and offline Hub cache.
    fn workdir(&mut self) -> PathBuf {
        self.next += 1;
        let dir = self.root.path().join(format!("w{}", self.next));
        std::fs::create_dir_all(dir.join("home")).unwrap();
        for link in ["configs", "tests", "scripts", "python"] {
            std::os::unix::fs::symlink(workspace().join(link), dir.join(link)).unwrap();
        }
        // `--prompts mtbench` resolves to the pinned asset: cached, as `aerie assets fetch` leaves it.
        let spec = aerie_hub::assets::Asset::Mtbench.spec();
        let asset = dir.join("home/.cache/aerie/assets").join(spec.name).join(spec.file_name());
        std::fs::create_dir_all(asset.parent().unwrap()).unwrap();
        std::fs::copy(self.fixtures.join("prompts.jsonl"), &asset).unwrap();
        let size = std::fs::metadata(&asset).unwrap().len();
        let sidecar = serde_json::json!({
            "package": spec.package, "version": spec.version, "wheel_url": "file:///fixture",
            "wheel_sha256": spec.wheel_sha256, "inner_path": spec.inner_path, "sha256": "fixture", "size": size,
        });
        std::fs::write(format!("{}.json", asset.display()), sidecar.to_string()).unwrap();
        dir
    }

    /// Make `path` (relative to `dir`) hold the fixture of `role` when it does not exist.
    fn stage(&self, dir: &Path, role: Role, value: &str) {
        let path = dir.join(value);
        // A run directory an earlier command's checkpoint made (`runs/x/final`): its metrics, as
        // the training that wrote the checkpoint leaves them.
        if role == Role::Run && path.is_dir() && !path.join("metrics.jsonl").exists() {
            std::fs::copy(self.fixtures.join("run/metrics.jsonl"), path.join("metrics.jsonl")).unwrap();
        }
        if path.exists() {
            return;
        }
        // `--prompts mtbench` names the cached asset, not a file to make.
        if role == Role::Prompts && value == "mtbench" {
            return;
        }
        if matches!(role, Role::Target | Role::Drafter) && HUB_IDS.contains(&value) {
            return self.stage_hub(dir, role, value);
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        let f = &self.fixtures;
        match role {
            Role::Target => std::os::unix::fs::symlink(f.join("target"), &path).unwrap(),
            Role::Drafter => std::os::unix::fs::symlink(f.join("drafter"), &path).unwrap(),
            Role::Run => std::os::unix::fs::symlink(f.join("run"), &path).unwrap(),
            Role::Chats if value.ends_with(".json") => drop(std::fs::copy(f.join("chats.json"), &path).unwrap()),
            Role::Chats => drop(std::fs::copy(f.join("chats.jsonl"), &path).unwrap()),
            Role::Prompts => drop(std::fs::copy(f.join("prompts.jsonl"), &path).unwrap()),
            Role::Costs => drop(std::fs::copy(f.join("costs.toml"), &path).unwrap()),
            Role::Prepared => std::os::unix::fs::symlink(self.prepared(), &path).unwrap(),
            Role::Shards => std::os::unix::fs::symlink(self.shards(), &path).unwrap(),
        }
    }

    /// The fixture chats prepared with the fixture target's tokenizer, made on first use.
    fn prepared(&self) -> PathBuf {
        let (f, prepared) = (&self.fixtures, self.fixtures.join("prepared"));
        if !prepared.exists() {
            let (chats, target) = (f.join("chats.jsonl"), f.join("target"));
            let args = ["data", "prepare", "--data", s(&chats), "--tokenizer", s(&target)];
            fixture_run(aerie_cmd().args(args).arg("--out").arg(&prepared));
        }
        prepared
    }

    /// Their capture by the fixture target, made on first use.
    fn shards(&self) -> PathBuf {
        let (f, shards) = (&self.fixtures, self.fixtures.join("shards"));
        if !shards.exists() {
            let (target, prepared) = (f.join("target"), self.prepared());
            let args = ["capture", "--target", s(&target), "--data", s(&prepared), "--aux-layers", "0,1,2"];
            fixture_run(
                aerie_cmd()
                    .args(args)
                    .args(["--dtype", "f32", "--teacher", "final-hidden+topk:32", "--out"])
                    .arg(&shards),
            );
        }
        shards
    }
}

fn fixture_run(c: &mut std::process::Command) {
    let out = c.output().unwrap();
    assert!(out.status.success(), "making a fixture with {c:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl World {
    /// `org/name` in the working directory's offline Hub cache, its snapshot the role's fixture.
    fn stage_hub(&self, dir: &Path, role: Role, id: &str) {
        let repo = id.split('@').next().unwrap();
        let folder = dir.join("hub").join(format!("models--{}", repo.replace('/', "--")));
        std::fs::create_dir_all(folder.join("snapshots")).unwrap();
        std::fs::create_dir_all(folder.join("refs")).unwrap();
        std::fs::write(folder.join("refs/main"), COMMIT).unwrap();
        let snap = folder.join("snapshots").join(COMMIT);
        if !snap.exists() {
            let fixture = if role == Role::Drafter { "drafter" } else { "target" };
            std::os::unix::fs::symlink(self.fixtures.join(fixture), snap).unwrap();
        }
    }
}

/// The drafter for the fixture target (as tests/decode.rs builds it).
fn write_drafter(dir: &Path) {
    let mut cfg = tiny_config();
    cfg.hidden_size = 32;
    cfg.target_hidden_size = 32;
    cfg.intermediate_size = 48;
    cfg.head_dim = 8;
    cfg.vocab_size = fixture::VOCAB;
    cfg.draft_vocab_size = 64;
    cfg.aux_layers = AuxLayers { ids: vec![0, 1, 2], convention: AuxConvention::OutputOfLayer };
    let opts = SaveOptions { include_embedding: false, ..SaveOptions::default() };
    save_drafter(&random_drafter(&cfg, Dtype::F32, 3), dir, &opts).unwrap();
}

/// A run directory whose `metrics.jsonl` has three train lines, what `aerie plot` draws.
fn write_run(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let lines: Vec<String> = (1..=3u64)
        .map(|step| {
            let r = aerie_train::metrics::TrainRecord {
                kind: "train".into(),
                step: step * 10,
                epoch: 0,
                loss: 5.0 / step as f64,
                loss_k: vec![4.0 / step as f64, 5.0 / step as f64],
                acc_k: vec![0.1 * step as f64, 0.05 * step as f64],
                alpha_k: vec![0.1 * step as f64, 0.05 * step as f64],
                accept_length: 1.0 + 0.1 * step as f64,
                lr: 1e-4,
                grad_norm: 1.0,
                tokens_per_s: 100.0,
                padded_tokens_per_s: 120.0,
                tokens: 1000.0 * step as f64,
                elapsed_s: 10.0 * step as f64,
                anchor_penalty: None,
                replay_starts: None,
            };
            serde_json::to_string(&r).unwrap()
        })
        .collect();
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
}

/// The arguments (after `aerie`) of a variant, ready for `dir`: `~` is `dir/home`, absolute
/// paths are re-rooted in `dir`, placeholder numbers filled in.
fn arguments(variant: &str, dir: &Path) -> Vec<String> {
    let home = dir.join("home");
    let mut args: Vec<String> = words(variant)
        .into_iter()
        .skip(1)
        .map(|w| {
            let reroot = |v: &str| -> String {
                if let Some(rest) = v.strip_prefix("~/") {
                    format!("{}/{rest}", home.display())
                } else if v.starts_with('/') {
                    format!("{}{v}", dir.display())
                } else {
                    v.to_owned()
                }
            };
            match w.split_once('=') {
                Some((f, v)) if f.starts_with("--") => format!("{f}={}", reroot(v)),
                _ => reroot(&w),
            }
        })
        .collect();
    for i in 1..args.len() {
        let placeholder = args[i].chars().all(|c| c.is_ascii_uppercase() || c == '_') && !args[i].is_empty();
        if placeholder && let Some((_, v)) = PLACEHOLDER_VALUES.iter().find(|(f, _)| *f == args[i - 1]) {
            args[i] = (*v).to_owned();
        }
    }
    args
}

/// What parsing a variant gave.
enum Parsed {
    /// The subcommand path `aerie` printed.
    Complete(String),
    /// Only required arguments were missing.
    Fragment,
    /// It ends in a flag without its value: prose naming the flag (`aerie project --costs`).
    FlagNamed,
    /// Anything else: clap's message.
    Error(String),
}

/// The environment every documented command runs in: scratch `$HOME`, offline Hub cache, no
/// index to download from.
fn env_for(c: &mut std::process::Command, dir: &Path) {
    c.current_dir(dir)
        .env("HOME", dir.join("home"))
        .env("AERIE_HOME", dir.join("home/.cache/aerie"))
        .env("HF_HUB_CACHE", dir.join("hub"))
        .env("HF_HUB_OFFLINE", "1")
        .env("AERIE_PYPI_URL", "http://127.0.0.1:9/simple")
        .env_remove("HF_HOME")
        .env_remove("HF_TOKEN")
        .env_remove("NO_COLOR")
        .env_remove("AERIE_PARSE_ONLY");
}

/// Stage `args`' inputs in `dir` and parse them with `AERIE_PARSE_ONLY=1`.
fn parse(world: &World, cli: &mut Cli, args: &[String], dir: &Path) -> Parsed {
    if let Some((path, flags)) = cli.path_of(args) {
        for (flag, value) in values(args, &path, &flags) {
            if let Some(r) = role(&path, &flag) {
                world.stage(dir, r, &value);
            }
        }
    }
    let mut c = aerie_cmd();
    env_for(&mut c, dir);
    let out = c.env("AERIE_PARSE_ONLY", "1").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Parsed::Complete(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else if stderr.contains("the following required arguments were not provided") {
        Parsed::Fragment
    } else if stderr.contains("a value is required for") && args.last().is_some_and(|a| a.starts_with("--")) {
        Parsed::FlagNamed
    } else {
        Parsed::Error(stderr.trim().to_owned())
    }
}

/// Tier 1: every documented span parses as its kind says, the flags of every synopsis exist,
/// and every complete command is run ([`RUNS`]) or listed ([`CANNOT_RUN`]).
#[test]
fn every_documented_command_parses() {
    let docs = all_docs();
    assert!(docs.len() > 100, "found only {} aerie spans: is the extraction broken?", docs.len());
    let mut world = World::new();
    let mut cli = Cli::new();
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let mut complete: BTreeSet<String> = BTreeSet::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let (mut n_complete, mut n_fragment) = (0, 0);
    for doc in &docs {
        seen.insert(doc.text.clone());
        if NOT_COMMANDS.iter().any(|(t, _)| *t == doc.text) {
            continue;
        }
        let synopsis = is_synopsis(&doc.text);
        let text = substitute(&doc.text);
        let pending = PENDING.iter().find(|(t, _)| *t == doc.text);
        let mut problems = Vec::new();
        let mut all_complete = true;
        for variant in variants(&text) {
            let dir = world.workdir();
            let args = arguments(&variant, &dir);
            let parsed = parse(&world, &mut cli, &args, &dir);
            all_complete &= matches!(parsed, Parsed::Complete(_));
            match parsed {
                Parsed::Complete(_) => n_complete += 1,
                Parsed::Fragment | Parsed::FlagNamed if synopsis || !doc.fenced => n_fragment += 1,
                Parsed::Fragment | Parsed::FlagNamed => {
                    problems.push(format!("`{variant}` lacks arguments (a fenced command must be complete)"))
                }
                Parsed::Error(e) => problems.push(format!("`{variant}`: {e}")),
            }
        }
        // Every flag a synopsis names, optional ones included, is one of its command's.
        if synopsis {
            // The flags of every command the variants name (`aerie bench ttt|train`: both).
            let mut known = BTreeSet::new();
            let mut paths = BTreeSet::new();
            for variant in variants(&text) {
                let args: Vec<String> = words(&variant).into_iter().skip(1).collect();
                if let Some((path, flags)) = cli.path_of(&args) {
                    known.extend(flags.0.into_keys());
                    paths.insert(path);
                }
            }
            if paths.is_empty() {
                problems.push("names no subcommand of aerie".into());
            }
            for w in words(&text.replace(['[', ']', '(', ')', '|'], " ")) {
                let flag = w.split('=').next().unwrap().trim_end_matches("...").trim_end_matches('…');
                if flag.starts_with("--") && flag.len() > 2 && !known.contains(flag) {
                    problems.push(format!(
                        "`aerie {}` has no flag {flag}",
                        paths.iter().cloned().collect::<Vec<_>>().join("|")
                    ));
                }
            }
        }
        match (pending, problems.is_empty()) {
            (Some((_, why)), false) => notes.push(format!("PENDING {} ({why}): {}", doc.at(), problems.join("; "))),
            (Some(_), true) => notes.push(format!("PENDING {}: parses now", doc.at())),
            (None, false) => failures.push(format!("{}: {}", doc.at(), problems.join("; "))),
            (None, true) => {}
        }
        if all_complete && !synopsis {
            complete.insert(doc.text.clone());
        }
    }
    // Every complete command is run or listed; every entry of the lists is still in the docs.
    let runs: BTreeSet<&str> = RUNS.iter().map(|r| r.text).collect();
    let cannot: BTreeSet<&str> = CANNOT_RUN.iter().flat_map(|(_, texts)| texts.iter().copied()).collect();
    for text in &complete {
        if !runs.contains(text.as_str()) && !cannot.contains(text.as_str()) {
            let at = docs.iter().find(|d| d.text == *text).unwrap().at();
            failures.push(format!("{at}: a complete command neither run (RUNS) nor listed (CANNOT_RUN)"));
        }
    }
    let pending: BTreeSet<&str> = PENDING.iter().map(|(t, _)| *t).collect();
    for listed in runs.iter().chain(&cannot) {
        if !complete.contains(*listed) {
            failures.push(format!("`{listed}`: listed, but not a complete command of the docs (any more)"));
        }
    }
    for listed in pending.iter().chain(NOT_COMMANDS.iter().map(|(t, _)| t)) {
        if !seen.contains(*listed) {
            failures.push(format!("`{listed}`: listed, but no longer in the docs"));
        }
    }
    println!(
        "{} spans: {n_complete} complete and {n_fragment} fragment variants; {} complete commands",
        docs.len(),
        complete.len()
    );
    for n in &notes {
        println!("note: {n}");
    }
    assert!(failures.is_empty(), "documented commands that fail:\n{}", failures.join("\n"));
}

/// A documented command run here for real (tier 2), and what its output must show.
struct Run {
    text: &'static str,
    /// Given the working directory and stdout, asserts what the command must have done.
    check: fn(&Path, &str),
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Tier 2: the complete documented commands that run in seconds here.
const RUNS: &[Run] = &[
    Run { text: "aerie project --costs configs/costs/kimi-k25-8x-rtx-pro-6000.toml", check: projects },
    Run { text: "aerie project --costs vllm-costs.toml", check: projects },
    Run { text: "aerie project --costs k25.toml", check: projects },
    Run { text: "aerie project --costs C", check: projects },
    Run { text: "aerie project --costs k25-sglang.toml", check: projects },
    Run {
        text: "aerie eval decode --target smollm2 --drafter drafter-sglang --prompts ~/.cache/aerie/assets/mtbench/question.jsonl --max-prompts 8 --k 3 --max-new-tokens 128 --out decode.json --costs-out smollm2-cpu.toml",
        check: |dir, _| assert!(dir.join("decode.json").is_file() && dir.join("smollm2-cpu.toml").is_file()),
    },
    Run { text: "aerie project --accept decode.json --costs smollm2-cpu.toml", check: projects },
    Run {
        text: "aerie eval decode --target SMOLLM2 --drafter QUICKSTART_DRAFTER --prompts mtbench --max-prompts 4 --max-new-tokens 64 --k 3",
        check: decodes,
    },
    Run {
        text: "aerie eval decode --target WORK/smollm2 --drafter WORK/drafter-sglang --prompts mtbench/question.jsonl --max-prompts 4 --max-new-tokens 64 --k 1",
        check: decodes,
    },
    Run {
        text: "aerie data prepare --data /data/kimi-k25/regen.jsonl --tokenizer moonshotai/Kimi-K2.5 --out /data/kimi-k25/prepared --max-length 4096 --split eval=0.02",
        check: |dir, _| assert!(dir.join("data/kimi-k25/prepared/report.json").is_file()),
    },
    Run {
        text: "aerie data show /data/kimi-k25/prepared --limit 3",
        check: |_, out| assert!(out.contains("[["), "{out}"),
    },
    Run {
        text: "aerie inspect AQ-MedAI/Kimi-K2-Instruct-eagle3 --target moonshotai/Kimi-K2.5",
        check: |_, out| assert!(!out.is_empty()),
    },
    Run {
        text: "aerie export runs/kimi-k25-finetune/final --to speculators --out /models/kimi-k25-eagle3 --target moonshotai/Kimi-K2.5",
        check: |dir, _| assert!(dir.join("models/kimi-k25-eagle3/config.json").is_file()),
    },
    Run {
        text: "aerie plot runs/kimi-k25-finetune --out curves.png",
        check: |dir, _| assert!(dir.join("curves.png").is_file()),
    },
    Run {
        text: "aerie vocab build PREPARED --draft-vocab N --out FILE",
        check: |dir, _| assert!(dir.join("FILE").is_file()),
    },
    Run {
        text: "aerie data prepare --data regen.jsonl --tokenizer ./smollm2 --out prepared",
        check: |dir, _| assert!(dir.join("prepared/report.json").is_file()),
    },
    Run {
        text: "aerie bench generate --target SMOLLM2 --prompts question.jsonl --batch 1,8,32 --max-new-tokens 32",
        check: |_, out| assert!(!out.is_empty()),
    },
    Run {
        text: "aerie regenerate --target SMOLLM2 --data mt8.jsonl --out nat.jsonl --max-new-tokens 64",
        check: |dir, _| assert!(dir.join("nat.jsonl").is_file()),
    },
    Run {
        text: "aerie export RUN/checkpoint-N --to sglang --target /models/Kimi-K2.5 --out drafter-sglang",
        check: |dir, _| assert!(dir.join("drafter-sglang/config.json").is_file()),
    },
    Run {
        text: "aerie export RUN/checkpoint-N --to speculators --target /models/Kimi-K2.5 --out drafter-vllm",
        check: |dir, _| assert!(dir.join("drafter-vllm/config.json").is_file()),
    },
    Run { text: "aerie shards verify DIR", check: |_, out| assert!(!out.is_empty()) },
    Run { text: "aerie bench shards DIR", check: |_, out| assert!(!out.is_empty()) },
    Run {
        text: "aerie bench shards shards-bf16/train --json",
        check: |_, out| assert!(out.trim_start().starts_with('{'), "{out}"),
    },
    Run {
        text: "aerie shards convert $Q/shards/train --dtype fp8-e4m3 --out $M/shards-fp8-e4m3/train",
        check: |dir, _| assert!(dir.join("m/shards-fp8-e4m3/train").is_dir()),
    },
    Run {
        text: "aerie eval accept --drafter $M/run-$D/checkpoint-200 --data $M/shards-$E/eval --target-head $Q/smollm2 --k 3 --json",
        check: json_out,
    },
    Run {
        text: "aerie eval loss --drafter $M/run-$D/checkpoint-200 --data $M/shards-$D/eval --target-head $Q/smollm2 --ttt-length 3 --json",
        check: json_out,
    },
    Run {
        text: "aerie shards convert $Q/shards/train --dtype $D --teacher topk:$K --out $M/shards-$D-topk$K/train",
        check: |dir, _| assert!(dir.join("m/shards-bf16-topk32/train").is_dir()),
    },
    Run {
        text: "aerie export $M/run-$NAME/checkpoint-567 --to sglang --out $M/export-$NAME --target $Q/smollm2",
        check: |dir, _| assert!(dir.join("m/export-bf16-topk32/config.json").is_file()),
    },
    Run {
        text: "aerie eval accept --drafter $M/run-$NAME/checkpoint-567 --data $M/shards-$D-topk$K/eval --target-head $Q/smollm2 --k 3 --json",
        check: json_out,
    },
    Run {
        text: "aerie eval loss --drafter $M/run-$NAME/checkpoint-567 --data $M/shards-$D-topk$K/eval --target-head $Q/smollm2 --ttt-length 3 --json",
        check: json_out,
    },
    Run {
        text: "aerie eval decode --target $Q/smollm2 --drafter $M/export-$NAME --prompts mtbench/question.jsonl --max-prompts 4 --max-new-tokens 64 --k 3 --out dec-$NAME.json",
        check: |dir, _| assert!(dir.join("dec-bf16-topk32.json").is_file()),
    },
    Run {
        text: "aerie compare run-a/checkpoint run-b/checkpoint --names run-a,run-b --data shards/eval --target-head smollm2 --k 4 --costs configs/costs/smollm2-native-cpu-2core.toml --out compare/",
        check: |dir, _| assert!(dir.join("compare").is_dir()),
    },
];

/// `aerie project`'s report names the break-even τ.
fn projects(_: &Path, out: &str) {
    assert!(out.contains("break-even"), "{out}");
}

/// `aerie eval decode`'s report gives τ.
fn decodes(_: &Path, out: &str) {
    assert!(out.contains('τ') || out.contains("tau"), "{out}");
}

/// One JSON object on stdout.
fn json_out(_: &Path, out: &str) {
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v.is_object(), "{out}");
}

/// Tier 2: the documented commands of [`RUNS`] run for real, each doc's in the order it prints
/// them in one working directory (so `aerie project --accept decode.json` reads the report the
/// `aerie eval decode` before it wrote), inputs it does not make staged from the fixtures.
#[test]
fn documented_commands_that_run_here_succeed() {
    let docs = all_docs();
    let mut world = World::new();
    let mut cli = Cli::new();
    let mut dirs: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut ran = BTreeSet::new();
    for doc in &docs {
        let Some(run) = RUNS.iter().find(|r| r.text == doc.text) else { continue };
        if !ran.insert((doc.file.clone(), doc.text.clone())) {
            continue;
        }
        let dir = dirs.entry(doc.file.clone()).or_insert_with(|| world.workdir()).clone();
        let args = arguments(&substitute(&doc.text), &dir);
        let pending = PENDING.iter().find(|(t, _)| *t == doc.text);
        let parsed = matches!(parse(&world, &mut cli, &args, &dir), Parsed::Complete(_));
        let mut c = aerie_cmd();
        env_for(&mut c, &dir);
        let t0 = std::time::Instant::now();
        let out = c.args(&args).output().unwrap();
        if let Some((_, why)) = pending {
            match parsed && out.status.success() {
                true => println!("note: PENDING {} parses and runs now: remove it from PENDING", doc.at()),
                false => {
                    println!("note: PENDING {} ({why}): {}", doc.at(), String::from_utf8_lossy(&out.stderr).trim())
                }
            }
            continue;
        }
        assert!(parsed, "{}: does not parse", doc.at());
        assert!(
            out.status.success(),
            "{} failed ({}):\n{}",
            doc.at(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        (run.check)(&dir, &stdout(&out));
        println!("ran {} in {:.1}s", doc.at(), t0.elapsed().as_secs_f64());
    }
    let missing: Vec<&str> = RUNS.iter().map(|r| r.text).filter(|t| !ran.iter().any(|(_, x)| x == t)).collect();
    assert!(missing.is_empty(), "RUNS entries not in the docs: {missing:?}");
}

/// Every subcommand the docs name answers `--help` (the README's `aerie COMMAND --help`).
#[test]
fn every_documented_subcommand_has_help() {
    let mut cli = Cli::new();
    let mut paths = BTreeSet::new();
    for doc in all_docs() {
        let args: Vec<String> = words(&substitute(&doc.text)).into_iter().skip(1).collect();
        if let Some((path, _)) = cli.path_of(&args)
            && !path.is_empty()
        {
            paths.insert(path);
        }
    }
    assert!(paths.len() > 20, "{paths:?}");
    for path in paths {
        let out = aerie_cmd().args(path.split_whitespace()).arg("--help").output().unwrap();
        assert!(out.status.success(), "aerie {path} --help");
        assert!(stdout(&out).contains("Usage: aerie "), "aerie {path} --help: {}", stdout(&out));
    }
}

#[test]
fn extraction_joins_continuations_and_reads_tables() {
    let md = "text `aerie data show P` and `aerie a\\|b`\n```sh\n$ RAYON_NUM_THREADS=1 aerie eval serve --k 1 \\\n  --json   # note\ncargo run -p aerie-cli -- quickstart\n```\n";
    let docs = extract("x.md", md);
    let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(texts, ["aerie eval serve --k 1 --json", "aerie quickstart", "aerie data show P", "aerie a|b"]);
    assert_eq!(docs[0].line, 3);
    assert!(docs[0].fenced && !docs[2].fenced);
    assert_eq!(
        variants("aerie x A (--a B | --c D) [--e F] --to s|t"),
        ["aerie x A --a B --to s", "aerie x A --a B --to t", "aerie x A --c D --to s", "aerie x A --c D --to t"]
    );
}

/// The parse check tells the three outcomes apart: a stale flag is an error, a span without its
/// required arguments a fragment, a full command complete (with its Hub id resolved offline).
#[test]
fn a_stale_flag_is_an_error_and_a_partial_span_a_fragment() {
    let mut world = World::new();
    let mut cli = Cli::new();
    let mut parse_text = |text: &str| {
        let dir = world.workdir();
        let args = arguments(&substitute(text), &dir);
        parse(&world, &mut cli, &args, &dir)
    };
    let stale = parse_text("aerie eval decode --target DIR --drafter DIR --prompts p.jsonl --no-such-flag");
    assert!(matches!(&stale, Parsed::Error(e) if e.contains("--no-such-flag")));
    assert!(matches!(parse_text("aerie data show"), Parsed::Fragment));
    assert!(matches!(parse_text("aerie project --costs"), Parsed::FlagNamed));
    let hub = parse_text("aerie inspect AQ-MedAI/Kimi-K2-Instruct-eagle3 --target moonshotai/Kimi-K2.5");
    assert!(matches!(&hub, Parsed::Complete(path) if path == "inspect"));
    let bad_value = parse_text("aerie export DIR --to nowhere --out o");
    assert!(matches!(&bad_value, Parsed::Error(e) if e.contains("nowhere")));
}
