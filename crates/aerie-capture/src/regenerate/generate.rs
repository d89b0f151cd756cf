//! One conversation's turns: the chat template's render of everything before an assistant turn
//! (the target's own earlier answers included) becomes the [`TurnJob`] an engine answers; each
//! answer is decoded, checked and appended to the history, and the conversation ends early where
//! a turn cannot be answered. The engine-independent half of the driver.

use std::collections::BTreeMap;
use std::path::Path;

use aerie_data::conversation::{GeneratedIds, Message, Role, split_inline_think};
use aerie_data::template::ChatTemplate;
use aerie_data::tokenizer::TokenizerFiles;
use serde_json::{Value, json};

use super::engine::{Finish, JobKey, TurnDone, TurnJob};
use super::{RegenerateOptions, RegenerateReport};
use crate::{Error, Result};

/// The eos ids decoding stops at: `model_eos` (the target's `eos_token_id`),
/// `generation_config.json`'s in `dir`, and the tokenizer's `eos_token`, deduplicated, sorted.
pub(super) fn eos_ids(model_eos: &[u32], dir: &Path, tok: &TokenizerFiles) -> Result<Vec<u32>> {
    let mut ids = model_eos.to_vec();
    let gen_cfg = dir.join("generation_config.json");
    if let Ok(bytes) = std::fs::read(&gen_cfg) {
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Invalid(format!("{}: not valid JSON: {e}", gen_cfg.display())))?;
        ids.extend(json_ids(v.get("eos_token_id")));
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
            dir.display()
        )));
    }
    Ok(ids)
}

/// `config.json`'s `eos_token_id` in `dir` (a number or a list), when the file is there: the
/// server path has no loaded target to ask.
pub(super) fn config_eos(dir: &Path) -> Result<Vec<u32>> {
    let path = dir.join("config.json");
    let Ok(bytes) = std::fs::read(&path) else { return Ok(Vec::new()) };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Invalid(format!("{}: not valid JSON: {e}", path.display())))?;
    let text = v.get("text_config").and_then(|t| t.get("eos_token_id"));
    Ok(json_ids(v.get("eos_token_id").or(text)).collect())
}

fn json_ids(v: Option<&Value>) -> impl Iterator<Item = u32> + '_ {
    let list: Vec<u32> = match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|n| n as u32).collect(),
        _ => Vec::new(),
    };
    list.into_iter()
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

/// Seconds and tokens of decoding proper (after each turn's first token), over a whole run.
#[derive(Debug, Default)]
pub(super) struct DecodeClock {
    /// Seconds from each turn's first token to its end.
    pub seconds: f64,
    /// Tokens generated after each turn's first.
    pub tokens: u64,
}

/// A conversation in flight: what is left of the source, and the history answered so far.
pub(super) struct InFlight {
    /// The conversation's id.
    pub id: String,
    /// Its position in the input.
    pub source_index: u64,
    rest: std::vec::IntoIter<Message>,
    answered: Vec<Message>,
    /// The record's tool declarations: the target sees them in every prompt, as it would when
    /// serving the conversation.
    tools: Option<Value>,
    turn: u64,
    kept_turns: u64,
    /// `max_new_tokens` of the outstanding job (tells a `max_length` stop from the turn cap).
    budget: usize,
}

impl InFlight {
    pub(super) fn new(id: String, source_index: u64, messages: Vec<Message>, tools: Option<Value>) -> Self {
        let rest = messages.into_iter();
        Self { id, source_index, rest, answered: Vec::new(), tools, turn: 0, kept_turns: 0, budget: 0 }
    }
}

/// What became of a finished conversation, waiting for its turn in the output order.
pub(super) enum Outcome {
    /// A record line to write, the assistant turns it holds, and why it ended early.
    Write { line: String, kept_turns: u64, cut: Option<&'static str> },
    /// Dropped, with the reason.
    Drop(String),
}

/// A conversation's next step: a turn to answer, or its end.
pub(super) enum Step {
    Job(TurnJob),
    Finished(Outcome),
}

/// Everything turns are built and answers read with.
pub(super) struct Turns<'a> {
    /// The tokenizer.
    pub tok: &'a TokenizerFiles,
    /// Where the tokenizer was loaded from (named in errors).
    pub tok_dir: &'a Path,
    /// The chat template.
    pub template: &'a ChatTemplate,
    /// The run's options.
    pub opts: &'a RegenerateOptions,
    /// `<think>` and `</think>` when the vocabulary has them as single tokens.
    pub think: (Option<u32>, Option<u32>),
}

impl<'a> Turns<'a> {
    pub(super) fn new(
        tok: &'a TokenizerFiles,
        tok_dir: &'a Path,
        template: &'a ChatTemplate,
        opts: &'a RegenerateOptions,
    ) -> Self {
        let think = (tok.tokenizer.token_to_id("<think>"), tok.tokenizer.token_to_id("</think>"));
        Self { tok, tok_dir, template, opts, think }
    }

    /// Walk `conv` to its next assistant turn and build the job (key `key`), or end it: no turn
    /// left, a prompt that already fills `max_length` (`prompt_too_long`), or a template error
    /// (the whole conversation is dropped, `template_error`).
    pub(super) fn advance(&self, key: JobKey, conv: &mut InFlight) -> Result<Step> {
        let opts = self.opts;
        let limit = opts.max_length.unwrap_or(usize::MAX);
        for m in conv.rest.by_ref() {
            if m.role != Role::Assistant {
                conv.answered.push(m);
                continue;
            }
            let rendered =
                self.template.render_conversation(&conv.answered, conv.tools.as_ref(), true, &opts.template_kwargs);
            let prompt = match rendered {
                Ok(prompt) => prompt,
                // The template's fault, whatever the conversation: stop at the first.
                Err(e @ aerie_data::Error::TemplateBudget { .. }) => return Err(e.into()),
                Err(_) => return Ok(Step::Finished(Outcome::Drop("template_error".into()))),
            };
            let enc = self.tok.tokenizer.encode(prompt.as_str(), false).map_err(|e| {
                Error::Invalid(format!("{}: cannot tokenise conversation `{}`: {e}", self.tok_dir.display(), conv.id))
            })?;
            let ids = enc.get_ids();
            if ids.is_empty() || ids.len() >= limit {
                return Ok(Step::Finished(self.finish(conv, Some("prompt_too_long"))));
            }
            conv.budget = opts.max_new_tokens.min(limit - ids.len());
            return Ok(Step::Job(TurnJob {
                key,
                conv_id: conv.id.clone(),
                source_index: conv.source_index,
                turn: conv.turn,
                prompt_ids: ids.to_vec(),
                messages: conv.answered.clone(),
                tools: conv.tools.clone(),
                max_new_tokens: conv.budget,
                sampling: opts.sampling,
            }));
        }
        Ok(Step::Finished(self.finish(conv, None)))
    }

    /// Take an engine's answer for `conv`'s outstanding turn (counting it in `report` and
    /// `clock`), then go on to its next turn. An empty answer ends the conversation before the
    /// turn (`empty_response`).
    pub(super) fn answered(
        &self,
        conv: &mut InFlight,
        done: TurnDone,
        report: &mut RegenerateReport,
        clock: &mut DecodeClock,
    ) -> Result<Step> {
        report.prompt_tokens += done.prompt_tokens;
        report.tokens_generated += done.tokens;
        report.prefill_seconds += done.prefill_seconds;
        clock.seconds += done.decode_seconds;
        clock.tokens += done.decode_tokens;
        let generated =
            done.ids.clone().map(|token_ids| GeneratedIds { token_ids, cut: done.finish == Finish::Budget });
        let (reasoning, content) = match (&done.ids, done.text) {
            (Some(ids), _) => {
                self.check_ids(conv, ids)?;
                self.answer_of_ids(ids)?
            }
            // A server without a reasoning parser leaves `<think>…</think>` inline.
            (None, text) => {
                let text = text.unwrap_or_default();
                match (done.reasoning, split_inline_think(&text)) {
                    (Some(r), _) => (Some(r), text),
                    (None, Some((r, c))) => (Some(r), c),
                    (None, None) => (None, text),
                }
            }
        };
        let reasoning = reasoning.filter(|r| !r.trim().is_empty());
        if content.trim().is_empty() && reasoning.is_none() {
            return Ok(Step::Finished(self.finish(conv, Some("empty_response"))));
        }
        match done.finish {
            Finish::Eos => report.stopped_by_eos += 1,
            Finish::Budget if conv.budget < self.opts.max_new_tokens => report.stopped_by_max_length += 1,
            Finish::Budget => report.stopped_by_max_new_tokens += 1,
        }
        let mut msg = Message::new(Role::Assistant, content);
        msg.reasoning_content = reasoning;
        msg.generated = generated;
        conv.answered.push(msg);
        conv.kept_turns += 1;
        conv.turn += 1;
        self.advance(done.key, conv)
    }

    /// Refuse an answer holding an id outside the vocabulary: the tokenizer would drop it from
    /// the text without a word (a wrong `--tokenizer`, or a broken engine), and the dataset
    /// would hold answers the model never gave.
    fn check_ids(&self, conv: &InFlight, ids: &[u32]) -> Result<()> {
        let vocab = self.tok.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab) {
            None => Ok(()),
            Some(id) => Err(Error::Server(format!(
                "conversation `{}` (record {}), assistant turn {}: the engine returned token id {id}, outside the \
                 vocabulary of {vocab} ids of {}; is the server running the model of this tokenizer?",
                conv.id,
                conv.source_index,
                conv.turn,
                self.tok_dir.display()
            ))),
        }
    }

    /// (reasoning, content) of generated ids, decoded with special tokens skipped: split at a
    /// `</think>` token when the vocabulary has one (thinking models), else at an inline
    /// `<think>…</think>` of the text.
    fn answer_of_ids(&self, ids: &[u32]) -> Result<(Option<String>, String)> {
        let decode = |ids: &[u32]| {
            self.tok
                .tokenizer
                .decode(ids, true)
                .map_err(|e| Error::Invalid(format!("{}: cannot decode generated ids: {e}", self.tok_dir.display())))
        };
        if let (open, Some(close)) = self.think
            && let Some(pos) = ids.iter().position(|&t| t == close)
        {
            let head = &ids[..pos];
            let head = if open.is_some() && head.first() == open.as_ref() { &head[1..] } else { head };
            return Ok((Some(decode(head)?), decode(&ids[pos + 1..])?.trim_start().to_owned()));
        }
        let text = decode(ids)?;
        Ok(match split_inline_think(&text) {
            Some((r, c)) => (Some(r), c),
            None => (None, text),
        })
    }

    /// End `conv` (early, for `reason`, or after its last turn): its record, or a drop when no
    /// assistant turn was answered.
    fn finish(&self, conv: &mut InFlight, reason: Option<&'static str>) -> Outcome {
        if conv.kept_turns == 0 {
            return Outcome::Drop(reason.unwrap_or("no_assistant_turn").to_owned());
        }
        while conv.answered.last().is_some_and(|m| m.role != Role::Assistant) {
            conv.answered.pop();
        }
        Outcome::Write {
            line: record_line(&conv.id, conv.source_index, &conv.answered, conv.tools.as_ref()),
            kept_turns: conv.kept_turns,
            cut: reason,
        }
    }
}

/// Cut `messages` before the first tool turn (the tool answered the ORIGINAL assistant's call,
/// which is gone), back to the last assistant turn; counted as `cut.tool_turn`.
pub(super) fn cut_at_tool_turn(mut messages: Vec<Message>, report: &mut RegenerateReport) -> Vec<Message> {
    if let Some(t) = messages.iter().position(|m| m.role == Role::Tool) {
        messages.truncate(t);
        while messages.last().is_some_and(|m| m.role != Role::Assistant) {
            messages.pop();
        }
        *report.cut.entry("tool_turn".into()).or_default() += 1;
    }
    messages
}

/// Keep `messages` up to its `max_turns`-th assistant turn (`None`: all of them); counted as
/// `cut.max_turns` when something is cut.
pub(super) fn cut_at_max_turns(
    mut messages: Vec<Message>,
    max_turns: Option<usize>,
    report: &mut RegenerateReport,
) -> Vec<Message> {
    let Some(max) = max_turns else { return messages };
    let end = messages.iter().enumerate().filter(|(_, m)| m.role == Role::Assistant).nth(max).map(|(i, _)| i);
    if let Some(end) = end {
        messages.truncate(end);
        while messages.last().is_some_and(|m| m.role != Role::Assistant) {
            messages.pop();
        }
        *report.cut.entry("max_turns".into()).or_default() += 1;
    }
    messages
}

/// The output line of a regenerated conversation (newline included), with ShareGPT role names;
/// an answer's reasoning is kept as the turn's `reasoning_content`, and the ids the engine
/// generated as its `token_ids` with `finish_reason` `stop` or `length` (all of which `aerie
/// data prepare` reads back: it trains on the ids themselves, so a captured answer is exactly
/// what the engine generated).
pub(super) fn record_line(conv_id: &str, source_index: u64, messages: &[Message], tools: Option<&Value>) -> String {
    let turn = |m: &Message| {
        let mut t = json!({"from": sharegpt_role(m.role), "value": m.content});
        if let Some(r) = &m.reasoning_content {
            t["reasoning_content"] = json!(r);
        }
        if let Some(g) = &m.generated {
            t["token_ids"] = json!(g.token_ids);
            t["finish_reason"] = json!(if g.cut { "length" } else { "stop" });
        }
        t
    };
    let mut record: Value = json!({
        "id": conv_id,
        "source_index": source_index,
        "conversations": messages.iter().map(turn).collect::<Vec<_>>(),
    });
    if let Some(tools) = tools {
        record["tools"] = tools.clone();
    }
    let mut line = serde_json::to_string(&record).expect("JSON");
    line.push('\n');
    line
}

/// Count a drop or a cut under `reason`.
pub(super) fn count(map: &mut BTreeMap<String, u64>, reason: &str) {
    *map.entry(reason.to_owned()).or_default() += 1;
}
