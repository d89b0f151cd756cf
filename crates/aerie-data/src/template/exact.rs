//! Samples whose closing answer holds the engine's own token ids (data from `aerie regenerate`
//! through an engine that returns ids: [`crate::conversation::GeneratedIds`]).
//!
//! Why: the text of a generated answer need not tokenise back to the ids that produced it (the
//! Kimi miniature's repetitive answers: 32 generated tokens became 34–36), and what the drafter
//! must learn, and what acceptance in the engine is measured on, is the ids the target
//! generated. So the sample is what the engine saw and produced: the text before the answer's
//! span tokenised as the regenerate prompt was (one render, one tokenisation, no special tokens
//! added), then the engine's ids, then the markup the template puts after an answer (its
//! end-of-turn token). The earlier spans of the sample keep their text-derived mask.
//!
//! The markup after the answer is found by rendering the closing turn with a sentinel as its
//! content and no reasoning: whatever the template writes after the sentinel. It is trained on
//! (up to its last special token, as [`super::mask`] does) when the engine stopped by itself,
//! and not when the answer was cut at the token budget: the engine never generated it then.
//!
//! The ids are used only when they belong to the tokenizer (every id below its vocabulary) and
//! decode to a text holding the turn's stored content; otherwise the text is tokenised as for any
//! other answer and the sample is counted in the report (`engine_ids_not_used`).

use super::Exact;
use super::mask::ChatEncoder;
use crate::conversation::Message;

/// The closing turn's stand-in content: a private-use character pair no template produces.
const SENTINEL: &str = "\u{E000}aerie-answer\u{E001}";

impl ChatEncoder<'_> {
    /// The sample of `text` (whose assistant byte `spans` end with the closing turn
    /// `messages[last]`'s) with the closing answer as the engine generated it, when
    /// `messages[last]` has engine ids and they can be used.
    pub(super) fn engine_sample(
        &self,
        text: &str,
        spans: &[(usize, usize)],
        messages: &[Message],
        last: usize,
        tools: Option<&serde_json::Value>,
    ) -> tokenizers::Result<Exact> {
        let msg = &messages[last];
        let (Some(generated), Some(&(start, _))) = (msg.generated.as_ref(), spans.last()) else {
            return Ok(Exact::NoIds);
        };
        let not_used = || Ok(Exact::NotUsed);
        let ids = &generated.token_ids;
        if !msg.tool_calls.is_empty() || ids.iter().any(|&t| t as usize >= self.vocab_size()) {
            return not_used();
        }
        let decoded = self.tokenizer().decode(ids, true)?;
        if !decoded.contains(msg.content.trim()) {
            return not_used();
        }
        let Some(tail) = self.markup_after_answer(&messages[..=last], tools) else {
            return not_used();
        };
        let head = self.tokenizer().encode(&text[..start], false)?;
        let mut mask = vec![0u8; head.len()];
        let earlier = &spans[..spans.len() - 1];
        self.mask_spans(earlier, head.get_ids(), head.get_offsets(), text, None, &mut mask);
        let mut out = head.get_ids().to_vec();
        out.extend_from_slice(ids);
        mask.resize(out.len(), 1);
        let tail_enc = self.tokenizer().encode(tail.as_str(), false)?;
        let mut tail_mask = vec![0u8; tail_enc.len()];
        if !generated.cut {
            let span = [(0, tail.len())];
            self.mask_spans(&span, tail_enc.get_ids(), tail_enc.get_offsets(), &tail, None, &mut tail_mask);
        }
        out.extend_from_slice(tail_enc.get_ids());
        mask.extend_from_slice(&tail_mask);
        Ok(Exact::Used(out, mask))
    }

    /// What the template writes after the content of the closing turn of `messages` (its
    /// end-of-turn markup), or `None` when the sentinel content does not come through.
    fn markup_after_answer(&self, messages: &[Message], tools: Option<&serde_json::Value>) -> Option<String> {
        let mut probe = messages.to_vec();
        let closing = probe.last_mut()?;
        closing.content = SENTINEL.to_owned();
        closing.reasoning_content = None;
        closing.generated = None;
        let render = self.render_tools(&probe, tools, false).ok()?;
        let at = render.rfind(SENTINEL)?;
        Some(render[at + SENTINEL.len()..].to_owned())
    }
}
