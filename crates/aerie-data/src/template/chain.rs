//! Loss masks for reasoning templates: one sample per assistant turn chain
//! (`../shared/reference/kimi-tokenizer.md` §7).
//!
//! Templates such as Kimi-K2.5, K2-Thinking and Qwen3 render `<think>reasoning</think>` only
//! for the current chain (the assistant turns after the last user message) and strip it from
//! history. The full render of a multi-turn conversation therefore holds no reasoning at all
//! for earlier turns, and training on it would teach the drafter empty thoughts the model never
//! emits. What the target really generated, and in what context, is: the prompt
//! `render(messages[..L], add_generation_prompt=true)` (history stripped, the chain's earlier
//! tool-call turns with their reasoning), followed by turn L's reasoning, the closing think tag,
//! its content and end of turn. So each chain becomes its own sample:
//!
//! - `base = render(messages[..L], gen=true)`; the continuation of L is what
//!   `render(messages[..=L])` puts after `base` when `base` is its prefix (Qwen3), else what a
//!   render of L alone puts after a render of no message with the generation prompt (Kimi,
//!   whose history rule rewrites the chain once L closes it);
//! - when the template dropped L's reasoning from that continuation (Kimi renders the closing
//!   turn as history: `<think></think>content`), the reasoning is put back right after the
//!   opening `<think>` (the end of `base` for K2.5, the start of the continuation for
//!   K2-Thinking), where the model wrote it;
//! - spans: each earlier assistant turn i of the chain is `render(..i, gen)`..`render(..=i)`,
//!   both prefixes of the sample, and L is `base`..end; every span must hold its turn's
//!   reasoning, or the chain is not used (counted as not prefix-stable).
//!
//! The mode is chosen per template by a probe ([`ChatEncoder::chain_mode`]): a template that
//! renders a current-chain tool-call turn's reasoning is a reasoning template. K2.5 with
//! `thinking=false`, K2-Instruct and ChatML render none and keep one sample per conversation.

use super::Exact;
use super::mask::{ChatEncoder, EncodedSample, Rejected};
use crate::conversation::{Conversation, DropReason, Message, Role, ToolCall, TrimReason};
use crate::{Error, Result};

const PROBE_REASONING: &str = "aerie-probe-reasoning";

impl ChatEncoder<'_> {
    /// Whether the template renders reasoning of the current chain (see the module docs).
    pub(super) fn probe_chain_mode(&self) -> bool {
        let call = ToolCall { id: "functions.f:0".into(), name: "f".into(), arguments: serde_json::json!("{}") };
        let messages = [
            Message::new(Role::User, "u"),
            Message {
                reasoning_content: Some(PROBE_REASONING.into()),
                tool_calls: vec![call],
                ..Message::new(Role::Assistant, "c")
            },
            Message { tool_call_id: Some("functions.f:0".into()), ..Message::new(Role::Tool, "r") },
        ];
        self.render(&messages, true).is_ok_and(|s| s.contains(PROBE_REASONING))
    }

    /// One sample per assistant turn chain in turn-chain mode, else [`Self::encode`]'s one
    /// sample. `Ok(Err(_))`: no sample at all (the first chain's reason).
    /// A render past the template's budget (`DropReason::TemplateBudget`) is the template's fault
    /// whatever the conversation: it is the error (`Err`) that stops the run, never a dropped
    /// conversation, nor a chain skipped beside others that rendered.
    pub fn encode_all(&self, conv: &Conversation) -> Result<std::result::Result<Vec<EncodedSample>, Rejected>> {
        if !self.chain_mode() {
            return match self.encode(conv)? {
                Ok(s) => Ok(Ok(vec![s])),
                Err(r) => Ok(Err(self.unless_over_budget(conv, r)?)),
            };
        }
        let messages = match self.prepared_messages(conv) {
            Ok(m) => m,
            Err(r) => return Ok(Err(self.unless_over_budget(conv, r)?)),
        };
        // Chain ends: assistant turns followed by a user turn or the end.
        let ends: Vec<usize> = (0..messages.len())
            .filter(|&i| {
                messages[i].role == Role::Assistant && messages.get(i + 1).is_none_or(|m| m.role == Role::User)
            })
            .collect();
        let mut samples = Vec::new();
        let mut first_rejection = None;
        let mut skipped = false;
        for (k, &last) in ends.iter().enumerate() {
            match self.encode_chain(conv, &messages, last, k as u32)? {
                Ok(s) => samples.push(s),
                Err(r) => {
                    skipped = true;
                    first_rejection.get_or_insert(self.unless_over_budget(conv, r)?);
                }
            }
        }
        if samples.is_empty() {
            return Ok(Err(first_rejection.unwrap_or(Rejected {
                reason: DropReason::NoAssistantTurn,
                message: "no assistant turn chain".into(),
            })));
        }
        if skipped {
            for s in &mut samples {
                s.trims.push(TrimReason::TemplateNotPrefixStable);
            }
        }
        Ok(Ok(samples))
    }

    /// `r`, unless it is a render past the template's budget: then the error naming the
    /// template and the conversation.
    fn unless_over_budget(&self, conv: &Conversation, r: Rejected) -> Result<Rejected> {
        if r.reason != DropReason::TemplateBudget {
            return Ok(r);
        }
        Err(Error::TemplateBudget {
            template: self.template_name().to_owned(),
            message: format!("conversation `{}`: {}", conv.id, r.message),
        })
    }

    fn encode_chain(
        &self,
        conv: &Conversation,
        messages: &[Message],
        last: usize,
        chain: u32,
    ) -> Result<std::result::Result<EncodedSample, Rejected>> {
        let tools = conv.tools.as_ref();
        let unstable = |why: String| Rejected { reason: DropReason::TemplateNotPrefixStable, message: why };
        let base = match self.render_tools(&messages[..last], tools, true) {
            Ok(b) => b,
            Err(e) => return Ok(Err(e)),
        };
        let closed = match self.render_tools(&messages[..=last], tools, false) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let mut cont = match closed.strip_prefix(base.as_str()) {
            Some(c) => c.to_owned(),
            None => {
                // The closing turn alone after an empty prompt (Kimi's history rule).
                let (alone, empty) = match (
                    self.render_tools(std::slice::from_ref(&messages[last]), None, false),
                    self.render_tools(&[], None, true),
                ) {
                    (Ok(a), Ok(e)) => (a, e),
                    (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
                };
                match alone.strip_prefix(empty.as_str()) {
                    Some(c) => c.to_owned(),
                    None => {
                        return Ok(Err(unstable(format!(
                            "chain {chain}: the closing assistant turn's render does not follow the \
                             generation prompt"
                        ))));
                    }
                }
            }
        };
        let reasoning = messages[last].reasoning_content.as_deref().filter(|r| !r.trim().is_empty());
        if let Some(rc) = reasoning
            && !cont.contains(rc)
        {
            // Where the model wrote it: right after the opening tag, which is either the end of
            // the generation prompt (K2.5) or the start of the turn's render (K2-Thinking).
            if base.ends_with("<think>") {
                cont = format!("{rc}{cont}");
            } else if let Some(rest) = cont.strip_prefix("<think>") {
                cont = format!("<think>{rc}{rest}");
            } else {
                return Ok(Err(unstable(format!(
                    "chain {chain}: the template drops the closing turn's reasoning and renders no \
                     <think> before it"
                ))));
            }
        }
        let text = format!("{base}{cont}");
        let first = messages[..last].iter().rposition(|m| m.role == Role::User).map_or(0, |u| u + 1);
        let mut spans = Vec::new();
        for i in (first..last).filter(|&i| messages[i].role == Role::Assistant) {
            let (p, q) = match (
                self.render_tools(&messages[..i], tools, true),
                self.render_tools(&messages[..=i], tools, false),
            ) {
                (Ok(p), Ok(q)) => (p, q),
                (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
            };
            if !text.starts_with(&p) || !text.starts_with(&q) || q.len() < p.len() {
                return Ok(Err(unstable(format!(
                    "chain {chain}: assistant turn {i} is not a prefix of the chain's render"
                ))));
            }
            spans.push((p.len(), q.len(), i));
        }
        spans.push((base.len(), text.len(), last));
        for &(s, e, i) in &spans {
            if let Some(rc) = messages[i].reasoning_content.as_deref().filter(|r| !r.trim().is_empty())
                && !text[s..e].contains(rc)
            {
                return Ok(Err(unstable(format!("chain {chain}: assistant turn {i}'s reasoning is not rendered"))));
            }
        }
        let tok_err = |e: tokenizers::Error| Error::Tokenizer {
            path: "tokenizer".into(),
            message: format!("cannot encode conversation `{}` (chain {chain}): {e}", conv.id),
        };
        let byte_spans: Vec<(usize, usize)> = spans.iter().map(|&(s, e, _)| (s, e)).collect();
        let (engine_ids, (mut input_ids, mut mask)) =
            match self.engine_sample(&text, &byte_spans, messages, last, tools).map_err(tok_err)? {
                Exact::Used(ids, mask) => (Some(true), (ids, mask)),
                other => {
                    let head = self.tokenize_head(&text).map_err(tok_err)?;
                    let found = self.ids_and_mask(&text, head, &byte_spans).map_err(tok_err)?;
                    (matches!(other, Exact::NotUsed).then_some(false), found)
                }
            };
        let mut trims = Vec::new();
        let limit = self.options().max_length.unwrap_or(usize::MAX);
        if input_ids.len() > limit {
            input_ids.truncate(limit);
            mask.truncate(limit);
            trims.push(TrimReason::TruncatedToMaxLength);
        }
        let assistant_turns = spans.len();
        let sample =
            EncodedSample { input_ids, loss_mask: mask, trims, assistant_turns, chain: Some(chain), engine_ids };
        if sample.masked_tokens() == 0 {
            return Ok(Err(Rejected {
                reason: DropReason::NoMaskedTokens,
                message: format!(
                    "chain {chain}: no assistant token within the first {} tokens",
                    sample.input_ids.len()
                ),
            }));
        }
        Ok(Ok(sample))
    }
}
