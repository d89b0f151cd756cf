//! The generation loop of one conversation: turn by turn, the chat template's render of
//! everything before an assistant turn (the target's own earlier answers included) is the
//! prompt, the target decodes the answer (greedy or seeded sampling) until an eos id, the turn
//! budget or the context limit, and the conversation ends early where a turn cannot be answered.

use std::path::Path;

use aerie_data::conversation::{Message, Role};
use aerie_data::template::ChatTemplate;
use aerie_data::tokenizer::TokenizerFiles;
use aerie_model::TargetModel;
use burn::tensor::backend::Backend;
use serde_json::{Value, json};

use super::{RegenerateOptions, RegenerateReport};
use crate::{Error, Result};

/// The eos ids decoding stops at: the target's `eos_token_id`, `generation_config.json`'s, and
/// the tokenizer's `eos_token`, deduplicated, sorted.
pub(super) fn eos_ids<B: Backend>(
    target: &TargetModel<B>,
    target_dir: &Path,
    tok: &TokenizerFiles,
) -> Result<Vec<u32>> {
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

/// Seconds and tokens of decoding proper (after each turn's first token), over a whole run.
#[derive(Debug, Default)]
pub(super) struct DecodeClock {
    /// Seconds from each turn's first token to its end.
    pub seconds: f64,
    /// Tokens generated after each turn's first.
    pub tokens: u64,
}

/// One conversation after regeneration.
pub(super) struct Regenerated {
    /// The conversation up to its last kept assistant turn, answers replaced.
    pub messages: Vec<Message>,
    /// Assistant turns answered by the target (0: the conversation is dropped).
    pub kept_turns: u64,
    /// Why it ended before its last turn, if it did.
    pub stop_reason: Option<&'static str>,
}

/// The prompt of one assistant turn.
pub(super) enum Prompt {
    /// Its token ids and the new-token budget (`max_new_tokens`, less near `max_length`).
    Ids { ids: Vec<u32>, budget: usize },
    /// The conversation ends before this turn (`prompt_too_long`).
    End(&'static str),
    /// The template cannot render the prefix: the whole conversation is dropped.
    Unrenderable,
}

/// What became of one assistant turn.
pub(super) enum Turn {
    /// The target's answer.
    Answer(String),
    /// The conversation ends before this turn (`prompt_too_long`, `empty_response`).
    End(&'static str),
}

/// Everything a turn is generated with.
pub(super) struct TurnGenerator<'a, B: Backend> {
    /// The target.
    pub target: &'a TargetModel<B>,
    /// Its tokenizer.
    pub tok: &'a TokenizerFiles,
    /// Where the tokenizer was loaded from (named in errors).
    pub tok_dir: &'a Path,
    /// The chat template.
    pub template: &'a ChatTemplate,
    /// The ids decoding stops at.
    pub eos: &'a [u32],
    /// The run's options.
    pub opts: &'a RegenerateOptions,
}

impl<B: Backend> TurnGenerator<'_, B> {
    /// The prompt of the assistant turn that follows `answered`: its ids and token budget, or
    /// why the turn cannot be asked.
    pub(super) fn prompt(&self, answered: &[Message], conv_id: &str) -> Result<Prompt> {
        let limit = self.opts.max_length.unwrap_or(usize::MAX);
        let Ok(text) = self.template.render(answered, true) else { return Ok(Prompt::Unrenderable) };
        let enc = self.tok.tokenizer.encode(text.as_str(), false).map_err(|e| {
            Error::Invalid(format!("{}: cannot tokenise conversation `{}`: {e}", self.tok_dir.display(), conv_id))
        })?;
        let ids = enc.get_ids();
        if ids.is_empty() || ids.len() >= limit {
            return Ok(Prompt::End("prompt_too_long"));
        }
        Ok(Prompt::Ids { budget: self.opts.max_new_tokens.min(limit - ids.len()), ids: ids.to_vec() })
    }

    /// What the generated ids (the stopping eos included) of a turn with `budget` make of it,
    /// counting its stop reason in `report`.
    pub(super) fn answer(&self, generated: &[u32], budget: usize, report: &mut RegenerateReport) -> Result<Turn> {
        let (answer_ids, stop) = match generated.last() {
            Some(t) if self.eos.contains(t) => (&generated[..generated.len() - 1], Stop::Eos),
            _ if budget < self.opts.max_new_tokens => (generated, Stop::MaxLength),
            _ => (generated, Stop::MaxNewTokens),
        };
        let text = self
            .tok
            .tokenizer
            .decode(answer_ids, true)
            .map_err(|e| Error::Invalid(format!("{}: cannot decode generated ids: {e}", self.tok_dir.display())))?;
        if text.trim().is_empty() {
            return Ok(Turn::End("empty_response"));
        }
        match stop {
            Stop::Eos => report.stopped_by_eos += 1,
            Stop::MaxNewTokens => report.stopped_by_max_new_tokens += 1,
            Stop::MaxLength => report.stopped_by_max_length += 1,
        }
        Ok(Turn::Answer(text))
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

/// The output line of a regenerated conversation (newline included), with ShareGPT role names.
pub(super) fn record_line(conv_id: &str, source_index: u64, messages: &[Message]) -> String {
    let record: Value = json!({
        "id": conv_id,
        "source_index": source_index,
        "conversations": messages
            .iter()
            .map(|m| json!({"from": sharegpt_role(m.role), "value": m.content}))
            .collect::<Vec<_>>(),
    });
    let mut line = serde_json::to_string(&record).expect("JSON");
    line.push('\n');
    line
}
