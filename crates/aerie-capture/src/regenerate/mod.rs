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
//!
//! The steps, one module each: `options` (what is asked and reported), `generate` (the
//! generation loop of one conversation), `sampling` (the seeded sampler) and `output` (the
//! resumable output file protocol); [`regenerate()`] runs them in order.

mod batched;
mod generate;
mod options;
mod output;
mod sampling;

use std::path::Path;
use std::time::Instant;

use aerie_data::conversation::normalize;
use aerie_data::readers::{ConversationReader, ProgressUnit};
use aerie_data::template::ChatTemplate;
use aerie_data::tokenizer::TokenizerFiles;
use aerie_model::TargetModel;
use burn::tensor::backend::Backend;

use crate::{Error, Result};
use batched::Pending;
use generate::{DecodeClock, TurnGenerator, cut_at_tool_turn, eos_ids, record_line};
pub use options::{RegenerateOptions, RegenerateProgress, RegenerateReport};
use output::{PartialOutput, run_meta};
pub use output::{REGENERATE_FORMAT, meta_path, partial_path, report_path};

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
    check_tokenizer(&tok, target, target_dir)?;
    let template = ChatTemplate::resolve(&opts.template, &tok)?;
    let eos = eos_ids(target, target_dir, &tok)?;
    let meta = run_meta(opts, target_dir, &tok, &template, &eos)?;
    let mut output = PartialOutput::resume_or_start(out, &meta, opts.overwrite)?;
    let resumed_records = output.resumed_records;

    let mut reader = ConversationReader::open(&opts.data, &opts.read)?;
    let mut report = RegenerateReport::start(opts, &template, &eos, resumed_records);
    let generator = TurnGenerator { target, tok: &tok, tok_dir: &tok_dir, template: &template, eos: &eos, opts };
    let start = Instant::now();
    let mut clock = DecodeClock::default();
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
    // Conversations are regenerated a chunk at a time (a few batches' worth, so the batch stays
    // full while conversations end), and written in source order; a crash loses at most the
    // chunk in flight.
    let chunk_size = if opts.batch_size == 1 { 1 } else { 4 * opts.batch_size };
    let mut input_done = false;
    while !input_done && opts.max_samples.is_none_or(|m| report.records < m) {
        let want = opts.max_samples.map_or(chunk_size, |m| chunk_size.min((m - report.records) as usize));
        let mut chunk = Vec::with_capacity(want);
        while chunk.len() < want {
            let Some(raw) = reader.next() else {
                input_done = true;
                break;
            };
            let raw = raw?;
            let source_index = raw.index;
            if output.skip_through.is_some_and(|s| source_index <= s) {
                continue;
            }
            report.conversations += 1;
            let conv = match normalize(raw, &opts.normalize) {
                Ok(n) => n.conversation,
                Err(reason) => {
                    *report.dropped.entry(reason.as_str().to_owned()).or_default() += 1;
                    continue;
                }
            };
            let messages = cut_at_tool_turn(conv.messages, &mut report);
            chunk.push(Pending { conv_id: conv.id, source_index, messages });
        }
        input = reader.progress();
        let keys: Vec<(String, u64)> = chunk.iter().map(|p| (p.conv_id.clone(), p.source_index)).collect();
        let results =
            generator.chunk(chunk, opts.batch_size, &mut report, &mut clock, &mut |r| progress(&snapshot(r, input)))?;
        for ((conv_id, source_index), done) in keys.into_iter().zip(results) {
            if done.kept_turns == 0 {
                let reason = done.stop_reason.unwrap_or("no_assistant_turn");
                *report.dropped.entry(reason.to_owned()).or_default() += 1;
                continue;
            }
            if let Some(reason) = done.stop_reason {
                *report.cut.entry(reason.to_owned()).or_default() += 1;
            }
            output.append(&record_line(&conv_id, source_index, &done.messages))?;
            report.records += 1;
            report.written_records += 1;
            report.turns_regenerated += done.kept_turns;
            progress(&snapshot(&report, input));
        }
    }
    input = reader.progress();
    progress(&snapshot(&report, input));
    report.read = reader.into_report();
    report.seconds = start.elapsed().as_secs_f64();
    report.tokens_per_second = report.tokens_generated as f64 / report.seconds.max(1e-9);
    report.prefill_tokens_per_second = report.prompt_tokens as f64 / report.prefill_seconds.max(1e-9);
    report.decode_tokens_per_second = clock.tokens as f64 / clock.seconds.max(1e-9);
    for _ in 0..report.read.malformed {
        *report.dropped.entry("malformed".into()).or_default() += 1;
    }
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
    closed.publish(out, &report)?;
    Ok(report)
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
