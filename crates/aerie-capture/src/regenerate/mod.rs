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
//! Prompt-only records (MT-Bench's `{"turns": [...]}`, or user turns without answers) are
//! answered prompt by prompt, each prompt holding the target's answers to the earlier ones.
//!
//! Rules on top of normalisation, each counted in the report:
//! - a conversation is cut after its `max_turns`-th assistant turn, when that is set —
//!   `cut.max_turns`;
//! - a conversation is cut before its first tool turn (the tool answered the ORIGINAL
//!   assistant's call, which is gone) — `cut.tool_turn`;
//! - a turn whose prompt already has `max_length` tokens ends the conversation before that turn
//!   — `cut.prompt_too_long`, or `dropped.prompt_too_long` when it is the first one;
//! - an empty answer (whitespace-only content and no reasoning) ends the conversation before
//!   that turn — `cut.empty_response` / `dropped.empty_response`;
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
//!
//! # Through a serving engine
//!
//! [`regenerate_server`] sends the same turns to a running server (SGLang `/generate` with
//! aerie's own token ids, or an OpenAI-compatible `/v1/chat/completions`), `--concurrency`
//! requests in flight; see [`server`]. Conversations finish out of order and are written in
//! source order.
//!
//! # Steps
//!
//! One module each: `options` (what is asked and reported), `generate` (one conversation's
//! turns: prompts, answers, drop and cut rules), `engine` (the `TurnEngine` seam and
//! the native batch-1 engine), `server` (the HTTP engine), `sampling` (the seeded sampler) and
//! `output` (the resumable output file protocol). The driver here reads and normalises the
//! input, keeps up to the engine's capacity of conversations in flight, submits each one's next
//! turn when its previous one is answered, and writes finished conversations in source order.

mod engine;
mod generate;
mod options;
mod output;
mod sampling;
pub mod server;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use aerie_data::conversation::{RawConversation, RawTurn, Role, normalize};
use aerie_data::lock::OutputLock;
use aerie_data::readers::{ConversationReader, ProgressUnit};
use aerie_data::template::ChatTemplate;
use aerie_data::tokenizer::TokenizerFiles;
use aerie_model::TargetModel;
use burn::tensor::backend::Backend;

use crate::{Error, Result};
use engine::{NativeEngine, TurnEngine};
use generate::{
    DecodeClock, InFlight, Outcome, Step, Turns, config_eos, count, cut_at_max_turns, cut_at_tool_turn, eos_ids,
};
pub use options::{RegenerateOptions, RegenerateProgress, RegenerateReport};
use output::{Generator, PartialOutput, run_meta};
pub use output::{REGENERATE_FORMAT, meta_path, partial_path, report_path};
pub use sampling::Sampling;
pub use server::{ServerOptions, ServerReport};

/// Regenerate the assistant turns of `opts.data` with `target` (loaded from `target_dir`,
/// which also holds `generation_config.json` when there is one) into `opts.out`.
pub fn regenerate<B: Backend>(
    target: &TargetModel<B>,
    target_dir: &Path,
    opts: &RegenerateOptions,
    progress: &mut dyn FnMut(&RegenerateProgress),
) -> Result<RegenerateReport> {
    let _lock = claim_output(opts)?;
    let tok_dir = opts.tokenizer.clone().unwrap_or_else(|| target_dir.to_owned());
    let tok = TokenizerFiles::load(&tok_dir)?;
    check_tokenizer(&tok, target, target_dir)?;
    let template = ChatTemplate::resolve(&opts.template, &tok)?;
    let eos = eos_ids(&target.spec().eos_token_ids, target_dir, &tok)?;
    let meta = run_meta(opts, Generator::Native { target_dir }, &tok, &template, &eos)?;
    let mut engine = NativeEngine::new(target, &eos, opts.batch_size)?;
    let run = Run { opts, turns: Turns::new(&tok, &tok_dir, &template, opts), eos: &eos };
    run.drive(&mut engine, &meta, progress)
}

/// Regenerate the assistant turns of `opts.data` through the serving engine `server` into
/// `opts.out`. `opts.tokenizer` is required: prompts are rendered and measured (and SGLang's
/// `output_ids` decoded) with it, and its directory's `config.json` / `generation_config.json`
/// add eos ids when present.
pub fn regenerate_server(
    server: &ServerOptions,
    opts: &RegenerateOptions,
    progress: &mut dyn FnMut(&RegenerateProgress),
) -> Result<RegenerateReport> {
    server.validate()?;
    let _lock = claim_output(opts)?;
    let tok_dir: PathBuf = opts.tokenizer.clone().ok_or_else(|| {
        Error::Invalid(
            "--server needs --tokenizer (the served model's tokenizer directory or hub id): aerie renders and \
             measures every prompt with it"
                .into(),
        )
    })?;
    let tok = TokenizerFiles::load(&tok_dir)?;
    let template = ChatTemplate::resolve(&opts.template, &tok)?;
    let eos = eos_ids(&config_eos(&tok_dir)?, &tok_dir, &tok)?;
    let (resolved, api_source) = server::detect(server)?;
    let generator = Generator::Server { api: resolved.api.name(), model: resolved.model.as_deref() };
    let meta = run_meta(opts, generator, &tok, &template, &eos)?;
    let mut engine = server::ServerEngine::start(server, resolved, api_source, &eos);
    let run = Run { opts, turns: Turns::new(&tok, &tok_dir, &template, opts), eos: &eos };
    run.drive(&mut engine, &meta, progress)
}

/// Validate the options, take the output's lock for the whole run (two runs appending to one
/// `OUT.partial` would interleave their records), and refuse a finished output or a missing
/// input before anything runs. The output is looked at only once the lock is held: a run that
/// finished in between has published `OUT` by then.
fn claim_output(opts: &RegenerateOptions) -> Result<OutputLock> {
    opts.validate()?;
    let lock = OutputLock::beside(&opts.out)?;
    // Never the input, and never a report file aerie did not write (one from before reports
    // recorded their format is recognised by its fields).
    aerie_data::owned::check_not_input(&opts.out, "--out", &[("--data", &opts.data)])?;
    aerie_data::owned::check_not_input(&report_path(&opts.out), "the report beside --out", &[("--data", &opts.data)])?;
    aerie_data::owned::check_json_is_ours(
        &report_path(&opts.out),
        "a regenerate report",
        "the report beside --out",
        |v| {
            aerie_data::owned::has_format(v, REGENERATE_FORMAT)
                || ["data", "out", "target", "template", "records"].iter().all(|k| v.get(k).is_some())
        },
    )?;
    // What is at --out decides the advice: a directory is never a regeneration, and
    // --overwrite is suggested only where it would be accepted (a regeneration aerie finished).
    if opts.out.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is a directory: --out names the JSONL file to write, e.g. {}",
            opts.out.display(),
            opts.out.join("regenerated.jsonl").display()
        )));
    }
    if opts.out.exists() && !report_path(&opts.out).exists() {
        return Err(Error::Data(aerie_data::Error::NotOurs {
            path: opts.out.clone(),
            message: format!(
                "exists with no {} beside it, so it is not a regeneration that aerie finished; refusing to \
                 overwrite it: move it away or choose another --out",
                report_path(&opts.out).file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
            ),
        }));
    }
    if opts.out.exists() && !opts.overwrite {
        return Err(Error::Invalid(format!(
            "{} already exists (a finished regeneration); pass --overwrite to replace it",
            opts.out.display()
        )));
    }
    if !opts.data.exists() {
        return Err(Error::Invalid(format!("{}: no such file or directory (--data)", opts.data.display())));
    }
    Ok(lock)
}

/// One run: the options, the turn builder and the eos ids.
struct Run<'a> {
    opts: &'a RegenerateOptions,
    turns: Turns<'a>,
    eos: &'a [u32],
}

/// Conversations admitted but not yet written, in source order, and the finished ones waiting
/// for the earlier ones (the reorder buffer).
#[derive(Default)]
struct Pending {
    order: VecDeque<u64>,
    finished: HashMap<u64, Outcome>,
}

impl Run<'_> {
    /// Read, normalise and regenerate every conversation through `engine`, appending finished
    /// ones in source order to the resumable output made with `meta`; then publish it.
    fn drive(
        &self,
        engine: &mut dyn TurnEngine,
        meta: &serde_json::Value,
        progress: &mut dyn FnMut(&RegenerateProgress),
    ) -> Result<RegenerateReport> {
        let opts = self.opts;
        let mut output = PartialOutput::resume_or_start(&opts.out, meta, opts.overwrite)?;
        let resumed_records = output.resumed_records;
        let mut reader = ConversationReader::open(&opts.data, &opts.read)?;
        let mut report = RegenerateReport::start(opts, self.turns.template, self.eos, resumed_records);
        let start = Instant::now();
        let mut clock = DecodeClock::default();
        let capacity = engine.capacity().max(1);
        let mut slots: Vec<Option<InFlight>> = (0..capacity).map(|_| None).collect();
        let mut pending = Pending::default();
        let mut outstanding = 0usize;
        let mut exhausted = false;
        let mut ticked = 0u64;
        let mut input = reader.progress();
        let snapshot = |report: &RegenerateReport, input: (u64, u64, ProgressUnit), ticked: u64| RegenerateProgress {
            records: report.records,
            resumed_records,
            max_samples: opts.max_samples,
            tokens: report.tokens_generated.max(ticked),
            input_done: input.0,
            input_total: input.1,
            unit: input.2,
        };
        let room = |report: &RegenerateReport, pending: &Pending| {
            opts.max_samples.is_none_or(|m| report.records + (pending.order.len() as u64) < m)
        };
        loop {
            // Admit conversations while the engine has room and the output may still grow.
            while !exhausted && outstanding < capacity && room(&report, &pending) {
                let Some(raw) = reader.next() else {
                    exhausted = true;
                    break;
                };
                let raw = raw?;
                input = reader.progress();
                let source_index = raw.index;
                if output.skip_through.is_some_and(|s| source_index <= s) {
                    continue;
                }
                report.conversations += 1;
                pending.order.push_back(source_index);
                let conv = match normalize(with_answer_slots(raw), &opts.normalize) {
                    Ok(n) => n.conversation,
                    Err(reason) => {
                        pending.finished.insert(source_index, Outcome::Drop(reason.as_str().to_owned()));
                        self.flush(&mut pending, &mut output, &mut report)?;
                        continue;
                    }
                };
                let messages = cut_at_tool_turn(conv.messages, &mut report);
                let messages = cut_at_max_turns(messages, opts.max_turns, &mut report);
                let slot = slots.iter().position(Option::is_none).expect("a free slot below capacity");
                let mut f = InFlight::new(conv.id, source_index, messages, conv.tools);
                match self.turns.advance(slot, &mut f)? {
                    Step::Job(job) => {
                        engine.submit(job)?;
                        outstanding += 1;
                        slots[slot] = Some(f);
                    }
                    Step::Finished(o) => {
                        pending.finished.insert(source_index, o);
                        self.flush(&mut pending, &mut output, &mut report)?;
                    }
                }
            }
            if outstanding == 0 {
                // Everything admitted is written; stop when nothing more may be admitted.
                if exhausted || !room(&report, &pending) {
                    break;
                }
                continue;
            }
            let done = engine.next_done(&mut |n| {
                ticked += n;
                progress(&snapshot(&report, input, ticked));
            })?;
            outstanding -= 1;
            let slot = done.key;
            let mut conv = slots[slot].take().expect("an answer for a conversation in flight");
            match self.turns.answered(&mut conv, done, &mut report, &mut clock)? {
                Step::Job(job) => {
                    engine.submit(job)?;
                    outstanding += 1;
                    slots[slot] = Some(conv);
                }
                Step::Finished(o) => {
                    pending.finished.insert(conv.source_index, o);
                    self.flush(&mut pending, &mut output, &mut report)?;
                }
            }
            progress(&snapshot(&report, input, ticked));
        }
        input = reader.progress();
        progress(&snapshot(&report, input, ticked));
        report.read = reader.into_report();
        report.seconds = start.elapsed().as_secs_f64();
        report.tokens_per_second = report.tokens_generated as f64 / report.seconds.max(1e-9);
        let per_second = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        report.prefill_tokens_per_second = per_second(report.prompt_tokens, report.prefill_seconds);
        report.decode_tokens_per_second = per_second(clock.tokens, clock.seconds);
        for _ in 0..report.read.malformed {
            count(&mut report.dropped, "malformed");
        }
        engine.finish_report(&mut report);
        let closed = output.close()?;
        if report.records == 0 {
            closed.abandon();
            return Err(Error::Invalid(format!(
                "{}: no conversation could be regenerated ({} records read; dropped per reason: {})",
                opts.data.display(),
                report.read.records,
                serde_json::to_string(&report.dropped).unwrap_or_default()
            )));
        }
        closed.publish(&opts.out, &report)?;
        Ok(report)
    }

    /// Write (or count as dropped) the finished conversations at the front of the source order.
    fn flush(&self, pending: &mut Pending, output: &mut PartialOutput, report: &mut RegenerateReport) -> Result<()> {
        while let Some(front) = pending.order.front().copied()
            && let Some(outcome) = pending.finished.remove(&front)
        {
            pending.order.pop_front();
            match outcome {
                Outcome::Drop(reason) => count(&mut report.dropped, &reason),
                Outcome::Write { line, kept_turns, cut } => {
                    output.append(&line)?;
                    report.records += 1;
                    report.written_records += 1;
                    report.turns_regenerated += kept_turns;
                    if let Some(reason) = cut {
                        count(&mut report.cut, reason);
                    }
                }
            }
        }
        Ok(())
    }
}

/// A prompt-only record (MT-Bench's `turns`, or user turns with no answer at all) gets an
/// assistant slot after each user turn, so that every prompt is answered in turn; the slots'
/// text is never used (every assistant turn is replaced). Records with answers are unchanged.
fn with_answer_slots(mut raw: RawConversation) -> RawConversation {
    let role = |t: &RawTurn| Role::from_source(&t.role);
    if raw.turns.iter().any(|t| role(t) == Some(Role::Assistant)) {
        return raw;
    }
    let turns = std::mem::take(&mut raw.turns);
    for t in turns {
        let user = role(&t) == Some(Role::User);
        raw.turns.push(t);
        if user {
            raw.turns.push(RawTurn {
                role: "assistant".into(),
                content: "(to be regenerated)".into(),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
                has_media: false,
                generated: None,
            });
        }
    }
    raw
}

/// Refuse a tokenizer that does not belong to the target (more tokens than the target's
/// vocabulary, or a config that says another size).
fn check_tokenizer<B: Backend>(tok: &TokenizerFiles, target: &TargetModel<B>, target_dir: &Path) -> Result<()> {
    let spec = target.spec();
    if tok.tokenizer_vocab_size > spec.vocab_size || tok.model_vocab_size.is_some_and(|v| v != spec.vocab_size) {
        return Err(Error::Invalid(format!(
            "{}: the tokenizer has {} tokens{}, but the target {} has a vocabulary of {}: they do not \
             belong together",
            tok.file().display(),
            tok.tokenizer_vocab_size,
            tok.model_vocab_size.map(|v| format!(" (its config.json says {v})")).unwrap_or_default(),
            target_dir.display(),
            spec.vocab_size
        )));
    }
    Ok(())
}
