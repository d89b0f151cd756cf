//! Self-distillation data: every assistant turn of a chat dataset replaced by the target's own
//! answer (`aerie regenerate`).
//!
//! # What is generated
//!
//! Conversations are read by [`aerie_data::readers`] (ShareGPT JSON, JSONL, parquet) and
//! normalised by [`aerie_data::conversation::normalize`] exactly as `aerie data prepare` does
//! (same roles, same drop rules). Then, turn by turn, the prompt of assistant turn i is the chat
//! template's render of everything before it, the target's OWN earlier answers included, with
//! `add_generation_prompt=true`, tokenised without added special tokens (the template carries
//! them). The target decodes from that prompt: greedy at temperature 0, otherwise seeded
//! temperature/top-p sampling whose random stream depends only on the seed, the record's position
//! in the input and the turn, so a resumed run draws exactly what an uninterrupted one draws.
//! Decoding stops after an eos id (the target's `eos_token_id`, `generation_config.json`'s, and
//! the tokenizer's `eos_token`), after `max_new_tokens`, or when prompt plus answer reach
//! `max_length`. The answer is the generated ids without the stopping eos, decoded with special
//! tokens skipped.
//!
//! Rules on top of normalisation, each counted in the report:
//! - a conversation is cut before its first tool turn (the tool answered the ORIGINAL
//!   assistant's call, which is gone) — `cut.tool_turn`;
//! - a turn whose prompt already has `max_length` tokens ends the conversation before that turn
//!   — `cut.prompt_too_long`, or `dropped.prompt_too_long` when it is the first one;
//! - an empty (whitespace-only) answer ends the conversation before that turn —
//!   `cut.empty_response` / `dropped.empty_response`;
//! - a template error on a prefix drops the conversation — `dropped.template_error`.
//!
//! # Output and resume
//!
//! One JSON object per line: `{"id", "source_index", "conversations": [{"from", "value"}]}`,
//! with ShareGPT role names (`system`, `human`, `gpt`), which every aerie reader reads back.
//! `source_index` is the record's position in the input. Lines are appended to `OUT.partial`,
//! each flushed and fsynced; the options are kept in `OUT.partial.meta.json`. A rerun after
//! `kill -9` drops any trailing incomplete line, checks the options, and continues after the
//! `source_index` of the last complete line, so the finished file is byte-identical to an
//! uninterrupted run's (same backend and thread count: the float sums must be the same). At the
//! end the report is written to `OUT`'s `.report.json` sibling and `OUT.partial` is renamed to
//! `OUT`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use aerie_data::conversation::{Message, NormalizeOptions, Role, normalize};
use aerie_data::readers::{ConversationReader, ProgressUnit, ReadOptions, ReadReport};
use aerie_data::template::{ChatTemplate, TemplateChoice};
use aerie_data::tokenizer::TokenizerFiles;
use aerie_model::TargetModel;
use burn::tensor::{DType, Tensor, backend::Backend};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The state file's format tag.
pub const REGENERATE_FORMAT: &str = "aerie-regenerate/1";

/// What to regenerate and how.
#[derive(Debug, Clone)]
pub struct RegenerateOptions {
    /// Chat data (ShareGPT JSON array, JSONL, parquet file or directory).
    pub data: PathBuf,
    /// The output JSONL file.
    pub out: PathBuf,
    /// Tokenizer directory; `None` = the target directory.
    pub tokenizer: Option<PathBuf>,
    /// Target name recorded in the state file (a path or hub id).
    pub target_name: String,
    /// Reader options.
    pub read: ReadOptions,
    /// Normalisation rules (as `aerie data prepare`).
    pub normalize: NormalizeOptions,
    /// Chat template.
    pub template: TemplateChoice,
    /// 0 = greedy; otherwise softmax temperature.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 = no nucleus cut. Ignored when greedy.
    pub top_p: f32,
    /// Sampling seed.
    pub seed: u64,
    /// New tokens per assistant turn at most.
    pub max_new_tokens: usize,
    /// Prompt plus answer at most this many tokens; `None` = no limit.
    pub max_length: Option<usize>,
    /// Stop once the output holds this many records.
    pub max_samples: Option<u64>,
    /// Replace an existing `out`, and start over when `OUT.partial` was made with other options.
    pub overwrite: bool,
}

impl RegenerateOptions {
    /// Defaults: greedy, 512 new tokens, 2048 tokens of context, the tokenizer's own template.
    pub fn new(data: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        Self {
            data: data.into(),
            out: out.into(),
            tokenizer: None,
            target_name: String::new(),
            read: ReadOptions::default(),
            normalize: NormalizeOptions::default(),
            template: TemplateChoice::Auto,
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            max_new_tokens: 512,
            max_length: Some(2048),
            max_samples: None,
            overwrite: false,
        }
    }

    fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::Invalid(format!("temperature {} must be a finite number >= 0", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Invalid(format!("top-p {} must be in (0, 1]", self.top_p)));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::Invalid("max-new-tokens must be at least 1".into()));
        }
        if self.max_length == Some(0) {
            return Err(Error::Invalid("max-length must be at least 1 (or unset for no limit)".into()));
        }
        if self.max_samples == Some(0) {
            return Err(Error::Invalid("max-samples must be at least 1".into()));
        }
        Ok(())
    }
}

/// Where a run stands, reported after every generated token and every record.
#[derive(Debug, Clone, Copy)]
pub struct RegenerateProgress {
    /// Records in the output (resumed ones included).
    pub records: u64,
    /// Records found in `OUT.partial` at the start.
    pub resumed_records: u64,
    /// The cap on records, when one was given.
    pub max_samples: Option<u64>,
    /// Tokens generated by this run.
    pub tokens: u64,
    /// Input read so far, in `unit`s.
    pub input_done: u64,
    /// Input size, in `unit`s.
    pub input_total: u64,
    /// Bytes (JSON, JSONL) or rows (parquet).
    pub unit: ProgressUnit,
}

/// What a run did. Counters are for this run; `records` is the whole output.
#[derive(Debug, Clone, Serialize)]
pub struct RegenerateReport {
    /// The input.
    pub data: PathBuf,
    /// The output.
    pub out: PathBuf,
    /// The target as named on the command line.
    pub target: String,
    /// The chat template's name.
    pub template: String,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Sampling seed.
    pub seed: u64,
    /// Cap on new tokens per turn.
    pub max_new_tokens: usize,
    /// Cap on prompt plus answer.
    pub max_length: Option<usize>,
    /// The ids decoding stops at.
    pub eos_token_ids: Vec<u32>,
    /// Records in the output file.
    pub records: u64,
    /// Records already in `OUT.partial` when this run started.
    pub resumed_records: u64,
    /// Records written by this run.
    pub written_records: u64,
    /// Input conversations this run looked at (after the resumed ones).
    pub conversations: u64,
    /// Assistant turns regenerated (kept in the output).
    pub turns_regenerated: u64,
    /// Tokens generated (every decode step, cut turns included).
    pub tokens_generated: u64,
    /// Prompt tokens fed (every turn's prefill).
    pub prompt_tokens: u64,
    /// Wall time of this run's generation and writes.
    pub seconds: f64,
    /// `tokens_generated / seconds`.
    pub tokens_per_second: f64,
    /// Time spent in prompt prefills (up to each turn's first token).
    pub prefill_seconds: f64,
    /// Prompt tokens per second of prefill.
    pub prefill_tokens_per_second: f64,
    /// Tokens after each turn's first, per second of decoding (one token per forward, KV cache).
    pub decode_tokens_per_second: f64,
    /// Turns that ended with an eos id.
    pub stopped_by_eos: u64,
    /// Turns that hit `max_new_tokens`.
    pub stopped_by_max_new_tokens: u64,
    /// Turns that hit `max_length` first.
    pub stopped_by_max_length: u64,
    /// Conversations dropped, per reason (normalisation reasons as `aerie data prepare` names
    /// them, plus `prompt_too_long`, `empty_response`, `template_error`).
    pub dropped: BTreeMap<String, u64>,
    /// Conversations shortened, per reason (`tool_turn`, `prompt_too_long`, `empty_response`).
    pub cut: BTreeMap<String, u64>,
    /// What the reader met (malformed records, truncation).
    pub read: ReadReport,
}

/// `OUT.partial`: the file being appended to.
pub fn partial_path(out: &Path) -> PathBuf {
    with_suffix(out, ".partial")
}

/// `OUT.partial.meta.json`: the options of the run that owns `OUT.partial`.
pub fn meta_path(out: &Path) -> PathBuf {
    with_suffix(out, ".partial.meta.json")
}

/// The report beside `out`: `x.jsonl` → `x.report.json`.
pub fn report_path(out: &Path) -> PathBuf {
    out.with_extension("report.json")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Data(aerie_data::Error::io(path, e))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// splitmix64: the sampling stream of one (seed, record, turn).
struct Rng(u64);

impl Rng {
    fn for_turn(seed: u64, source_index: u64, turn: u64) -> Self {
        let mut r = Rng(seed);
        let a = r.next_u64() ^ source_index.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mut r = Rng(a);
        let b = r.next_u64() ^ turn.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7);
        Rng(b)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Draw a token from `logits` at `temperature` with nucleus `top_p`, in f64 on the host.
/// Deterministic for a given stream: ties in the nucleus sort go to the lower id.
fn sample(logits: &[f32], temperature: f32, top_p: f32, rng: &mut Rng) -> u32 {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = temperature as f64;
    let weight = |l: f32| if l.is_nan() { 0.0 } else { ((l as f64 - max) / t).exp() };
    let mut cand: Vec<(f64, u32)> = logits.iter().enumerate().map(|(i, &l)| (weight(l), i as u32)).collect();
    if top_p < 1.0 {
        cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let total: f64 = cand.iter().map(|c| c.0).sum();
        let mut cum = 0.0;
        let mut keep = cand.len();
        for (i, c) in cand.iter().enumerate() {
            cum += c.0;
            if cum >= top_p as f64 * total {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    let total: f64 = cand.iter().map(|c| c.0).sum();
    let u = rng.unit() * total;
    let mut cum = 0.0;
    for &(w, id) in &cand {
        cum += w;
        if u < cum {
            return id;
        }
    }
    cand.iter().rev().find(|c| c.0 > 0.0).map_or(cand[0].1, |c| c.1)
}

/// The eos ids decoding stops at: the target's `eos_token_id`, `generation_config.json`'s, and
/// the tokenizer's `eos_token`, deduplicated, sorted.
fn eos_ids<B: Backend>(target: &TargetModel<B>, target_dir: &Path, tok: &TokenizerFiles) -> Result<Vec<u32>> {
    let mut ids = target.spec().eos_token_ids.clone();
    let gen_cfg = target_dir.join("generation_config.json");
    if let Ok(bytes) = std::fs::read(&gen_cfg) {
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Invalid(format!("{}: not valid JSON: {e}", gen_cfg.display())))?;
        match v.get("eos_token_id") {
            Some(Value::Number(n)) => ids.extend(n.as_u64().map(|n| n as u32)),
            Some(Value::Array(list)) => ids.extend(list.iter().filter_map(Value::as_u64).map(|n| n as u32)),
            _ => {}
        }
    }
    if let Some(s) = tok.special_tokens().get("eos_token").and_then(|v| v.as_str().map(str::to_owned))
        && let Some(id) = tok.tokenizer.token_to_id(&s)
    {
        ids.push(id);
    }
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no eos token id (config.json `eos_token_id`, generation_config.json, or the \
             tokenizer's `eos_token`): every answer would run to --max-new-tokens",
            target_dir.display()
        )));
    }
    Ok(ids)
}

/// The options a partial output depends on; a resume must find the same.
fn run_meta(
    opts: &RegenerateOptions,
    target_dir: &Path,
    tok: &TokenizerFiles,
    template: &ChatTemplate,
    eos: &[u32],
) -> Result<Value> {
    let data_abs = std::fs::canonicalize(&opts.data).unwrap_or_else(|_| opts.data.clone());
    let data_bytes = std::fs::metadata(&opts.data).ok().filter(|m| m.is_file()).map(|m| m.len());
    let config = target_dir.join("config.json");
    let config_sha = sha256_hex(&std::fs::read(&config).map_err(|e| io(&config, e))?);
    Ok(json!({
        "format": REGENERATE_FORMAT,
        "data": data_abs.display().to_string(),
        "data_bytes": data_bytes,
        "read": serde_json::to_value(opts.read).expect("plain options serialise"),
        "normalize": serde_json::to_value(&opts.normalize).expect("plain options serialise"),
        "target": opts.target_name,
        "target_config_sha256": config_sha,
        "tokenizer_sha256": tok.digest,
        "template": template.name(),
        "template_sha256": sha256_hex(template.source().as_bytes()),
        "eos_token_ids": eos,
        "temperature": opts.temperature,
        "top_p": if opts.temperature > 0.0 { opts.top_p } else { 1.0 },
        "seed": if opts.temperature > 0.0 { opts.seed } else { 0 },
        "max_new_tokens": opts.max_new_tokens,
        "max_length": opts.max_length,
    }))
}

fn meta_differences(found: &Value, want: &Value) -> Vec<String> {
    let (Some(f), Some(w)) = (found.as_object(), want.as_object()) else {
        return vec!["not a JSON object".into()];
    };
    let mut keys: Vec<&String> = f.keys().chain(w.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| f.get(*k) != w.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or("(absent)".to_owned(), Value::to_string);
            format!("{k}: {} then, {} now", show(f.get(k)), show(w.get(k)))
        })
        .collect()
}

fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Directory fsync is best effort (some filesystems refuse it); the data files are fsynced.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// An existing `OUT.partial`: cut any incomplete last line, count the records, and return
/// (records, source index of the last one).
fn recover_partial(path: &Path) -> Result<(u64, Option<u64>)> {
    let mut file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| io(path, e))?;
    let mut reader = BufReader::new(&mut file);
    let (mut records, mut complete_len, mut pos) = (0u64, 0u64, 0u64);
    let mut last: Option<Vec<u8>> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(|e| io(path, e))?;
        if n == 0 {
            break;
        }
        pos += n as u64;
        if line.last() == Some(&b'\n') {
            records += 1;
            complete_len = pos;
            last = Some(std::mem::take(&mut line));
        }
    }
    drop(reader);
    if complete_len < pos {
        file.set_len(complete_len).map_err(|e| io(path, e))?;
        file.sync_all().map_err(|e| io(path, e))?;
    }
    let last_index = match last {
        None => None,
        Some(bytes) => {
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
                Error::Invalid(format!(
                    "{}: record {records} (the last complete line) is not JSON ({e}); delete the file \
                     to start over",
                    path.display()
                ))
            })?;
            Some(v.get("source_index").and_then(Value::as_u64).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: record {records} has no `source_index`; not written by aerie regenerate?",
                    path.display()
                ))
            })?)
        }
    };
    Ok((records, last_index))
}

/// The ShareGPT name of a role.
fn sharegpt_role(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "human",
        Role::Assistant => "gpt",
        Role::Tool => "tool",
    }
}

/// Why decoding of a turn ended.
enum Stop {
    Eos,
    MaxNewTokens,
    MaxLength,
}

/// Regenerate the assistant turns of `opts.data` with `target` (loaded from `target_dir`,
/// which also holds `generation_config.json` when there is one) into `opts.out`.
pub fn regenerate<B: Backend>(
    target: &TargetModel<B>,
    target_dir: &Path,
    opts: &RegenerateOptions,
    progress: &mut dyn FnMut(&RegenerateProgress),
) -> Result<RegenerateReport> {
    opts.validate()?;
    let out = &opts.out;
    let partial = partial_path(out);
    let meta_file = meta_path(out);
    if out.exists() && !opts.overwrite {
        return Err(Error::Invalid(format!(
            "{} already exists (a finished regeneration); pass --overwrite to replace it",
            out.display()
        )));
    }
    if !opts.data.exists() {
        return Err(Error::Invalid(format!("{}: no such file or directory (--data)", opts.data.display())));
    }
    let tok_dir = opts.tokenizer.clone().unwrap_or_else(|| target_dir.to_owned());
    let tok = TokenizerFiles::load(&tok_dir)?;
    let spec = target.spec();
    if tok.tokenizer_vocab_size > spec.vocab_size || tok.model_vocab_size.is_some_and(|v| v != spec.vocab_size) {
        return Err(Error::Invalid(format!(
            "{}: the tokenizer has {} tokens{}, but the target {} has a vocabulary of {}: they do not \
             belong together",
            tok.dir.join("tokenizer.json").display(),
            tok.tokenizer_vocab_size,
            tok.model_vocab_size.map(|v| format!(" (its config.json says {v})")).unwrap_or_default(),
            target_dir.display(),
            spec.vocab_size
        )));
    }
    let template = ChatTemplate::resolve(&opts.template, &tok)?;
    let eos = eos_ids(target, target_dir, &tok)?;
    let meta = run_meta(opts, target_dir, &tok, &template, &eos)?;

    // Resume or start.
    let mut resume = None;
    if partial.exists() {
        let found: Option<Value> = std::fs::read(&meta_file).ok().and_then(|b| serde_json::from_slice(&b).ok());
        match found {
            Some(f) if f == meta => resume = Some(recover_partial(&partial)?),
            _ if opts.overwrite => {}
            Some(f) => {
                return Err(Error::Invalid(format!(
                    "{} was started with other options:\n  - {}\ndelete it and {} (or pass --overwrite) \
                     to start over",
                    partial.display(),
                    meta_differences(&f, &meta).join("\n  - "),
                    meta_file.display()
                )));
            }
            None => {
                return Err(Error::Invalid(format!(
                    "{} exists but {} is missing or unreadable, so it cannot be resumed safely; delete \
                     it (or pass --overwrite) to start over",
                    partial.display(),
                    meta_file.display()
                )));
            }
        }
    }
    let (resumed_records, skip_through) = match resume {
        Some((n, last)) => (n, last),
        None => {
            if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
            }
            aerie_data::shard::write_bytes_atomic(
                &meta_file,
                serde_json::to_string_pretty(&meta).expect("JSON").as_bytes(),
            )?;
            File::create(&partial).and_then(|f| f.sync_all()).map_err(|e| io(&partial, e))?;
            sync_parent(&partial)?;
            (0, None)
        }
    };
    let mut file = OpenOptions::new().append(true).open(&partial).map_err(|e| io(&partial, e))?;
    file.seek(SeekFrom::End(0)).map_err(|e| io(&partial, e))?;

    let mut reader = ConversationReader::open(&opts.data, &opts.read)?;
    let mut report = RegenerateReport {
        data: opts.data.clone(),
        out: out.clone(),
        target: opts.target_name.clone(),
        template: template.name().to_owned(),
        temperature: opts.temperature,
        top_p: opts.top_p,
        seed: opts.seed,
        max_new_tokens: opts.max_new_tokens,
        max_length: opts.max_length,
        eos_token_ids: eos.clone(),
        records: resumed_records,
        resumed_records,
        written_records: 0,
        conversations: 0,
        turns_regenerated: 0,
        tokens_generated: 0,
        prompt_tokens: 0,
        seconds: 0.0,
        tokens_per_second: 0.0,
        prefill_seconds: 0.0,
        prefill_tokens_per_second: 0.0,
        decode_tokens_per_second: 0.0,
        stopped_by_eos: 0,
        stopped_by_max_new_tokens: 0,
        stopped_by_max_length: 0,
        dropped: BTreeMap::new(),
        cut: BTreeMap::new(),
        read: ReadReport::default(),
    };
    let start = Instant::now();
    let limit = opts.max_length.unwrap_or(usize::MAX);
    let (mut decode_seconds, mut decode_tokens) = (0f64, 0u64);
    let greedy = opts.temperature == 0.0;
    let mut input: (u64, u64, ProgressUnit);
    let snapshot = |report: &RegenerateReport, input: (u64, u64, ProgressUnit)| RegenerateProgress {
        records: report.records,
        resumed_records,
        max_samples: opts.max_samples,
        tokens: report.tokens_generated,
        input_done: input.0,
        input_total: input.1,
        unit: input.2,
    };
    while opts.max_samples.is_none_or(|m| report.records < m) {
        let Some(raw) = reader.next() else { break };
        let raw = raw?;
        input = reader.progress();
        let source_index = raw.index;
        if skip_through.is_some_and(|s| source_index <= s) {
            continue;
        }
        report.conversations += 1;
        let normalized = match normalize(raw, &opts.normalize) {
            Ok(n) => n,
            Err(reason) => {
                *report.dropped.entry(reason.as_str().to_owned()).or_default() += 1;
                continue;
            }
        };
        let conv = normalized.conversation;
        let mut messages = conv.messages;
        if let Some(t) = messages.iter().position(|m| m.role == Role::Tool) {
            messages.truncate(t);
            while messages.last().is_some_and(|m| m.role != Role::Assistant) {
                messages.pop();
            }
            *report.cut.entry("tool_turn".into()).or_default() += 1;
        }
        let mut answered: Vec<Message> = Vec::with_capacity(messages.len());
        let mut stop_reason: Option<&'static str> = None;
        let mut turn = 0u64;
        let mut kept_turns = 0u64;
        for m in messages {
            if m.role != Role::Assistant {
                answered.push(m);
                continue;
            }
            let prompt = match template.render(&answered, true) {
                Ok(p) => p,
                Err(_) => {
                    stop_reason = Some("template_error");
                    kept_turns = 0;
                    break;
                }
            };
            let enc = tok.tokenizer.encode(prompt.as_str(), false).map_err(|e| {
                Error::Invalid(format!("{}: cannot tokenise conversation `{}`: {e}", tok_dir.display(), conv.id))
            })?;
            let ids = enc.get_ids();
            if ids.is_empty() || ids.len() >= limit {
                stop_reason = Some("prompt_too_long");
                break;
            }
            let budget = opts.max_new_tokens.min(limit - ids.len());
            report.prompt_tokens += ids.len() as u64;
            let mut rng = Rng::for_turn(opts.seed, source_index, turn);
            turn += 1;
            let turn_start = Instant::now();
            let mut first_token_at: Option<Instant> = None;
            let generated = {
                let report_ref = &mut report;
                let mut pick = |logits: Tensor<B, 1>| -> u32 {
                    let token = if greedy {
                        logits.argmax(0).into_data().iter::<i64>().next().expect("one id") as u32
                    } else {
                        let row: Vec<f32> = logits.cast(DType::F32).into_data().into_vec::<f32>().expect("f32 logits");
                        sample(&row, opts.temperature, opts.top_p, &mut rng)
                    };
                    if first_token_at.is_none() {
                        first_token_at = Some(Instant::now());
                        report_ref.prefill_seconds += turn_start.elapsed().as_secs_f64();
                    }
                    report_ref.tokens_generated += 1;
                    progress(&snapshot(report_ref, input));
                    token
                };
                target.generate_with(ids, budget, &eos, &mut pick)?
            };
            if let Some(t) = first_token_at {
                decode_seconds += t.elapsed().as_secs_f64();
                decode_tokens += generated.len() as u64 - 1;
            }
            let (answer_ids, stop) = match generated.last() {
                Some(t) if eos.contains(t) => (&generated[..generated.len() - 1], Stop::Eos),
                _ if budget < opts.max_new_tokens => (&generated[..], Stop::MaxLength),
                _ => (&generated[..], Stop::MaxNewTokens),
            };
            let text = tok
                .tokenizer
                .decode(answer_ids, true)
                .map_err(|e| Error::Invalid(format!("{}: cannot decode generated ids: {e}", tok_dir.display())))?;
            if text.trim().is_empty() {
                stop_reason = Some("empty_response");
                break;
            }
            match stop {
                Stop::Eos => report.stopped_by_eos += 1,
                Stop::MaxNewTokens => report.stopped_by_max_new_tokens += 1,
                Stop::MaxLength => report.stopped_by_max_length += 1,
            }
            answered.push(Message::new(Role::Assistant, text));
            kept_turns += 1;
        }
        while answered.last().is_some_and(|m| m.role != Role::Assistant) {
            answered.pop();
        }
        if kept_turns == 0 {
            let reason = stop_reason.unwrap_or("no_assistant_turn");
            *report.dropped.entry(reason.to_owned()).or_default() += 1;
            continue;
        }
        if let Some(reason) = stop_reason {
            *report.cut.entry(reason.to_owned()).or_default() += 1;
        }
        let record = json!({
            "id": conv.id,
            "source_index": source_index,
            "conversations": answered
                .iter()
                .map(|m| json!({"from": sharegpt_role(m.role), "value": m.content}))
                .collect::<Vec<_>>(),
        });
        let mut line = serde_json::to_string(&record).expect("JSON");
        line.push('\n');
        file.write_all(line.as_bytes()).map_err(|e| io(&partial, e))?;
        file.sync_data().map_err(|e| io(&partial, e))?;
        report.records += 1;
        report.written_records += 1;
        report.turns_regenerated += kept_turns;
        progress(&snapshot(&report, input));
    }
    input = reader.progress();
    progress(&snapshot(&report, input));
    report.read = reader.into_report();
    report.seconds = start.elapsed().as_secs_f64();
    report.tokens_per_second = report.tokens_generated as f64 / report.seconds.max(1e-9);
    report.prefill_tokens_per_second = report.prompt_tokens as f64 / report.prefill_seconds.max(1e-9);
    report.decode_tokens_per_second = decode_tokens as f64 / decode_seconds.max(1e-9);
    for _ in 0..report.read.malformed {
        *report.dropped.entry("malformed".into()).or_default() += 1;
    }
    file.sync_all().map_err(|e| io(&partial, e))?;
    drop(file);
    if report.records == 0 {
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_file(&meta_file);
        return Err(Error::Invalid(format!(
            "{}: no conversation could be regenerated ({} records read; dropped per reason: {})",
            opts.data.display(),
            report.read.records,
            serde_json::to_string(&report.dropped).unwrap_or_default()
        )));
    }
    aerie_data::shard::write_bytes_atomic(
        &report_path(out),
        serde_json::to_string_pretty(&report).expect("JSON").as_bytes(),
    )?;
    std::fs::rename(&partial, out).map_err(|e| io(out, e))?;
    sync_parent(out)?;
    let _ = std::fs::remove_file(&meta_file);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_deterministic_and_respects_top_p() {
        let logits = [0.0f32, 1.0, 2.0, 3.0, -1.0];
        let draw = |seed, idx, turn, top_p| {
            let mut r = Rng::for_turn(seed, idx, turn);
            (0..50).map(|_| sample(&logits, 1.0, top_p, &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 3, 1, 1.0), draw(7, 3, 1, 1.0));
        assert_ne!(draw(7, 3, 1, 1.0), draw(7, 4, 1, 1.0));
        assert_ne!(draw(7, 3, 1, 1.0), draw(7, 3, 2, 1.0));
        // Nucleus 0.5: token 3 alone holds e^3 / Σ ≈ 0.64 of the mass.
        assert!(draw(1, 0, 0, 0.5).iter().all(|&t| t == 3));
        // Nucleus 0.9 keeps tokens 3 and 2 (0.64 + 0.24) and then 1.
        assert!(draw(1, 0, 0, 0.9).iter().all(|&t| (1..=3).contains(&t)));
        // A low temperature is nearly greedy.
        let mut r = Rng::for_turn(0, 0, 0);
        assert!((0..50).all(|_| sample(&logits, 0.01, 1.0, &mut r) == 3));
    }

    #[test]
    fn partial_recovery_cuts_the_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.jsonl.partial");
        std::fs::write(&p, "{\"source_index\": 0}\n{\"source_index\": 4}\n{\"source_ind").unwrap();
        assert_eq!(recover_partial(&p).unwrap(), (2, Some(4)));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"source_index\": 0}\n{\"source_index\": 4}\n");
        std::fs::write(&p, "").unwrap();
        assert_eq!(recover_partial(&p).unwrap(), (0, None));
        std::fs::write(&p, "not json\n").unwrap();
        assert!(recover_partial(&p).unwrap_err().to_string().contains("not JSON"));
    }

    #[test]
    fn paths_beside_the_output() {
        let out = Path::new("d/regen.jsonl");
        assert_eq!(partial_path(out), Path::new("d/regen.jsonl.partial"));
        assert_eq!(meta_path(out), Path::new("d/regen.jsonl.partial.meta.json"));
        assert_eq!(report_path(out), Path::new("d/regen.report.json"));
    }
}
