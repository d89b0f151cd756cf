//! The generation loop of one conversation: turn by turn, the chat template's render of
//! everything before an assistant turn (the target's own earlier answers included) is the
//! prompt, the target decodes the answer (greedy or seeded sampling) until an eos id, the turn
//! budget or the context limit, and the conversation ends early where a turn cannot be answered.

use std::path::Path;
use std::time::Instant;

use aerie_data::conversation::{Message, Role};
use aerie_data::template::ChatTemplate;
use aerie_data::tokenizer::TokenizerFiles;
use aerie_model::TargetModel;
use burn::tensor::{DType, Tensor, backend::Backend};
use serde_json::{Value, json};

use super::sampling::{Rng, sample};
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

/// What became of one assistant turn.
enum Turn {
    /// The target's answer.
    Answer(String),
    /// The conversation ends before this turn (`prompt_too_long`, `empty_response`).
    End(&'static str),
    /// The template cannot render the prefix: the whole conversation is dropped.
    Unrenderable,
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
    /// Replace every assistant turn of `messages` (record `source_index` of the input) by the
    /// target's answer, counting tokens and stop reasons in `report`; `on_token(report)` after
    /// every generated token.
    pub(super) fn conversation(
        &self,
        conv_id: &str,
        source_index: u64,
        messages: Vec<Message>,
        report: &mut RegenerateReport,
        clock: &mut DecodeClock,
        on_token: &mut dyn FnMut(&RegenerateReport),
    ) -> Result<Regenerated> {
        let mut answered: Vec<Message> = Vec::with_capacity(messages.len());
        let mut stop_reason: Option<&'static str> = None;
        let mut turn = 0u64;
        let mut kept_turns = 0u64;
        for m in messages {
            if m.role != Role::Assistant {
                answered.push(m);
                continue;
            }
            match self.turn(&answered, conv_id, source_index, turn, report, clock, on_token)? {
                Turn::Answer(text) => {
                    answered.push(Message::new(Role::Assistant, text));
                    kept_turns += 1;
                }
                Turn::End(reason) => {
                    stop_reason = Some(reason);
                    break;
                }
                Turn::Unrenderable => {
                    stop_reason = Some("template_error");
                    kept_turns = 0;
                    break;
                }
            }
            turn += 1;
        }
        while answered.last().is_some_and(|m| m.role != Role::Assistant) {
            answered.pop();
        }
        Ok(Regenerated { messages: answered, kept_turns, stop_reason })
    }

    /// Answer the assistant turn that follows `answered` (turn `turn` of the conversation).
    #[allow(clippy::too_many_arguments)]
    fn turn(
        &self,
        answered: &[Message],
        conv_id: &str,
        source_index: u64,
        turn: u64,
        report: &mut RegenerateReport,
        clock: &mut DecodeClock,
        on_token: &mut dyn FnMut(&RegenerateReport),
    ) -> Result<Turn> {
        let opts = self.opts;
        let limit = opts.max_length.unwrap_or(usize::MAX);
        let greedy = opts.temperature == 0.0;
        let Ok(prompt) = self.template.render(answered, true) else { return Ok(Turn::Unrenderable) };
        let enc = self.tok.tokenizer.encode(prompt.as_str(), false).map_err(|e| {
            Error::Invalid(format!("{}: cannot tokenise conversation `{}`: {e}", self.tok_dir.display(), conv_id))
        })?;
        let ids = enc.get_ids();
        if ids.is_empty() || ids.len() >= limit {
            return Ok(Turn::End("prompt_too_long"));
        }
        let budget = opts.max_new_tokens.min(limit - ids.len());
        report.prompt_tokens += ids.len() as u64;
        let mut rng = Rng::for_turn(opts.seed, source_index, turn);
        let turn_start = Instant::now();
        let mut first_token_at: Option<Instant> = None;
        let generated = {
            let mut pick = |logits: Tensor<B, 1>| -> u32 {
                let token = if greedy {
                    logits.argmax(0).into_data().iter::<i64>().next().expect("one id") as u32
                } else {
                    let row: Vec<f32> = logits.cast(DType::F32).into_data().into_vec::<f32>().expect("f32 logits");
                    sample(&row, opts.temperature, opts.top_p, &mut rng)
                };
                if first_token_at.is_none() {
                    first_token_at = Some(Instant::now());
                    report.prefill_seconds += turn_start.elapsed().as_secs_f64();
                }
                report.tokens_generated += 1;
                on_token(report);
                token
            };
            self.target.generate_with(ids, budget, self.eos, &mut pick)?
        };
        if let Some(t) = first_token_at {
            clock.seconds += t.elapsed().as_secs_f64();
            clock.tokens += generated.len() as u64 - 1;
        }
        let (answer_ids, stop) = match generated.last() {
            Some(t) if self.eos.contains(t) => (&generated[..generated.len() - 1], Stop::Eos),
            _ if budget < opts.max_new_tokens => (&generated[..], Stop::MaxLength),
            _ => (&generated[..], Stop::MaxNewTokens),
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
