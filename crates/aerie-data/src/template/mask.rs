//! Token ids and the loss mask of a conversation: 1 on every assistant turn's content and its
//! end-of-turn token, 0 elsewhere (eagle3.md §3 trains on those positions only).
//!
//! # How assistant spans are found
//!
//! No byte offsets of any template are assumed. For each assistant message `i` the template
//! renders twice more: the prefix `messages[..i]` with `add_generation_prompt=true` (text `P_i`,
//! ending where the model starts to answer) and `messages[..=i]` without it (text `Q_i`, ending
//! after the turn's closing markup). Both must be prefixes of the full render `R`; then the
//! assistant span is `R[len(P_i)..len(Q_i)]`. Templates that rewrite earlier turns depending
//! on what follows (prefix-unstable ones) are detected here: the conversation is cut before the
//! first assistant turn for which the check fails ([`TrimReason::TemplateNotPrefixStable`]), or
//! dropped if that is the first one.
//!
//! `R` is tokenised once (no special tokens added: the template carries them, as in
//! `apply_chat_template(tokenize=True)`), with byte offsets. A token belongs to a span when its
//! byte range overlaps it; a merge across a span edge (rare: templates put a newline or a
//! special token there) thus counts toward the assistant side. Inside the span, tokens after
//! the span's last special token (the end-of-turn token: `<|im_end|>`, `<|eot_id|>`) are not
//! trained on, so the newline ChatML puts after `<|im_end|>` stays out of the mask. A span with
//! no special token is trained on up to its last non-whitespace token.
//!
//! # Truncation
//!
//! Samples longer than `max_length` tokens keep their first `max_length` tokens (the head: the
//! system prompt and first turns), counted as [`TrimReason::TruncatedToMaxLength`]; a sample
//! left with no masked token is dropped ([`DropReason::NoMaskedTokens`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use super::ChatTemplate;
use super::Exact;
use crate::conversation::{Conversation, DropReason, Role, TrimReason};
use crate::tokenizer::{Encoded, TextTokenizer};
use crate::{Error, Result};

/// Options of [`ChatEncoder`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Keep at most this many tokens (the head).
    pub max_length: Option<usize>,
    /// Put this system prompt in front of conversations that have none.
    pub system_prompt: Option<String>,
    /// With `system_prompt`: also replace existing system prompts.
    pub replace_system_prompt: bool,
    /// Extra template variables (transformers' `**kwargs`), as JSON.
    pub template_kwargs: BTreeMap<String, serde_json::Value>,
}

/// A tokenised conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedSample {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// 1 on assistant content and end-of-turn tokens.
    pub loss_mask: Vec<u8>,
    /// What was changed ([`TrimReason::TruncatedToMaxLength`], prefix-stability cuts).
    pub trims: Vec<TrimReason>,
    /// Assistant turns whose span was located (before truncation).
    pub assistant_turns: usize,
    /// In turn-chain mode ([`ChatEncoder::chain_mode`]): which chain of the conversation this
    /// sample trains (0-based); `None` for one sample per conversation.
    pub chain: Option<u32>,
    /// Whether the closing answer's tokens are the engine's own ids ([`super::exact`]):
    /// `None` when the data has none for it, `Some(false)` when they could not be used.
    pub engine_ids: Option<bool>,
}

impl EncodedSample {
    /// Number of masked tokens.
    pub fn masked_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m != 0).count()
    }
}

/// Why a conversation yields no sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The counted reason.
    pub reason: DropReason,
    /// Details (the template's message).
    pub message: String,
}

/// Renders conversations with a template and tokenises them with their loss mask.
pub struct ChatEncoder<'a> {
    template: &'a ChatTemplate,
    tokenizer: &'a TextTokenizer,
    special_ids: HashSet<u32>,
    /// Special tokens that split text cleanly (no whitespace stripping), for head-only
    /// tokenisation: (content, id).
    cut_tokens: Vec<(String, u32)>,
    /// The text of every special token, to tell whether one lies past a head.
    special_texts: Vec<String>,
    /// The text of every added token: a head is never cut inside one.
    added_texts: Vec<String>,
    opts: EncodeOptions,
    /// The tokenizer's vocabulary size (largest id + 1), for checking an engine's ids.
    vocab_size: usize,
    chain_mode: bool,
    /// Samples by the way their tokens were found, indexed by [`HeadCut`] ([`Self::head_paths`]).
    head_paths: [AtomicU64; 3],
}

/// How many samples an encoder tokenised by each path of [`ChatEncoder::tokenize_head`]: the
/// head cut is an optimisation whose results must equal tokenising everything, and the tests
/// that check so read these counts to know the head path was the one they exercised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadPaths {
    /// The whole render tokenised: no `max_length`, a render within the first budget, no
    /// settled head, or a head that could not decide the mask.
    pub whole: u64,
    /// A head ending just after a special token.
    pub at_special_token: u64,
    /// A head cut inside the text, settled by cutting again at twice the length.
    pub inside_text: u64,
}

/// Where a [`Head`] ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadCut {
    Whole = 0,
    AtSpecialToken = 1,
    InsideText = 2,
}

impl std::fmt::Debug for ChatEncoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatEncoder")
            .field("template", &self.template.name())
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// The tokens of a render, or of a head of it ([`ChatEncoder::tokenize_head`]).
pub(super) struct Head {
    enc: Encoded,
    /// Where the text was cut when the head ends inside it (not at a special token): the
    /// render goes on past its last token.
    open_from: Option<usize>,
    cut: HeadCut,
}

/// Outcome of locating assistant spans in one render.
enum Spans {
    Found(Vec<(usize, usize)>),
    /// Assistant message `index` is the first whose prefix renders are not prefixes of the
    /// full render.
    Unstable {
        index: usize,
    },
}

impl<'a> ChatEncoder<'a> {
    /// An encoder; `tokenizer` should have truncation and padding off (as
    /// [`crate::tokenizer::TokenizerFiles`] loads it).
    pub fn new(template: &'a ChatTemplate, tokenizer: &'a TextTokenizer, opts: EncodeOptions) -> Result<Self> {
        if opts.max_length == Some(0) {
            return Err(Error::InvalidOption("max_length must be at least 1".into()));
        }
        super::check_template_kwargs(&opts.template_kwargs)?;
        let added = tokenizer.added_tokens();
        let special_ids = added.iter().filter(|t| t.special).map(|t| t.id).collect();
        let special_texts =
            added.iter().filter(|t| t.special && !t.content.is_empty()).map(|t| t.content.clone()).collect();
        let added_texts = added.iter().filter(|t| !t.content.is_empty()).map(|t| t.content.clone()).collect();
        let cut_tokens: Vec<(String, u32)> =
            added.into_iter().filter(|t| t.splits_cleanly).map(|t| (t.content, t.id)).collect();
        let mut enc = Self {
            template,
            tokenizer,
            special_ids,
            cut_tokens,
            special_texts,
            added_texts,
            opts,
            vocab_size: tokenizer.vocab_size(),
            chain_mode: false,
            head_paths: Default::default(),
        };
        enc.chain_mode = enc.probe_chain_mode();
        Ok(enc)
    }

    /// Whether conversations become one sample per assistant turn chain (a reasoning
    /// template: [`super::chain`]) rather than one per conversation.
    pub fn chain_mode(&self) -> bool {
        self.chain_mode
    }

    /// How many samples this encoder tokenised by each path (whole render, head at a special
    /// token, head cut inside the text); one relaxed atomic add per sample.
    pub fn head_paths(&self) -> HeadPaths {
        let n = |c: HeadCut| self.head_paths[c as usize].load(Ordering::Relaxed);
        HeadPaths {
            whole: n(HeadCut::Whole),
            at_special_token: n(HeadCut::AtSpecialToken),
            inside_text: n(HeadCut::InsideText),
        }
    }

    pub(super) fn options(&self) -> &EncodeOptions {
        &self.opts
    }

    pub(super) fn tokenizer(&self) -> &TextTokenizer {
        self.tokenizer
    }

    pub(super) fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub(super) fn template_name(&self) -> &str {
        self.template.name()
    }

    pub(super) fn render(
        &self,
        messages: &[crate::conversation::Message],
        generation_prompt: bool,
    ) -> std::result::Result<String, Rejected> {
        self.render_tools(messages, None, generation_prompt)
    }

    pub(super) fn render_tools(
        &self,
        messages: &[crate::conversation::Message],
        tools: Option<&serde_json::Value>,
        generation_prompt: bool,
    ) -> std::result::Result<String, Rejected> {
        let kwargs = &self.opts.template_kwargs;
        self.template.render_conversation(messages, tools, generation_prompt, kwargs).map_err(|e| Rejected {
            reason: match e {
                Error::TemplateBudget { .. } => DropReason::TemplateBudget,
                _ => DropReason::TemplateError,
            },
            message: match e {
                Error::Template { message, .. } | Error::TemplateBudget { message, .. } => message,
                other => other.to_string(),
            },
        })
    }

    /// Render and tokenise `conv`. `Ok(Err(_))` is a conversation that yields no sample (counted
    /// by its reason); `Err(_)` is a tokenizer failure.
    ///
    /// This is the one-sample-per-conversation method; [`Self::encode_all`] picks the method
    /// the template needs.
    pub fn encode(&self, conv: &Conversation) -> Result<std::result::Result<EncodedSample, Rejected>> {
        let messages = match self.prepared_messages(conv) {
            Ok(m) => m,
            Err(r) => return Ok(Err(r)),
        };
        let tools = conv.tools.as_ref();
        let mut messages = messages;
        let mut trims = Vec::new();
        loop {
            let full = match self.render_tools(&messages, tools, false) {
                Ok(s) => s,
                Err(r) => return Ok(Err(r)),
            };
            let tok_err = |e: tokenizers::Error| Error::Tokenizer {
                path: "tokenizer.json".into(),
                message: format!("cannot encode conversation `{}`: {e}", conv.id),
            };
            let head = self.tokenize_head(&full).map_err(tok_err)?;
            let limit = self.opts.max_length.unwrap_or(usize::MAX);
            let cut_byte = if head.enc.len() > limit { head.enc.get_offsets()[limit].0 } else { full.len() };
            let spans = match self.assistant_spans(&messages, tools, &full, cut_byte) {
                Ok(s) => s,
                Err(r) => return Ok(Err(r)),
            };
            let spans = match spans {
                Spans::Found(s) => s,
                Spans::Unstable { index } => {
                    let prev = messages[..index].iter().rposition(|m| m.role == Role::Assistant);
                    match prev {
                        Some(p) => {
                            messages.truncate(p + 1);
                            if !trims.contains(&TrimReason::TemplateNotPrefixStable) {
                                trims.push(TrimReason::TemplateNotPrefixStable);
                            }
                            continue;
                        }
                        None => {
                            return Ok(Err(Rejected {
                                reason: DropReason::TemplateNotPrefixStable,
                                message: format!(
                                    "rendering the conversation up to assistant turn {index} is \
                                     not a prefix of rendering all of it"
                                ),
                            }));
                        }
                    }
                }
            };
            // The closing answer as the engine generated it, when its span is there.
            let answers = messages.iter().filter(|m| m.role == Role::Assistant).count();
            let exact = match spans.len() == answers && answers > 0 {
                true => self.engine_sample(&full, &spans, &messages, messages.len() - 1, tools).map_err(tok_err)?,
                false => Exact::NoIds,
            };
            let (engine_ids, (mut input_ids, mut mask)) = match exact {
                Exact::Used(ids, mask) => (Some(true), (ids, mask)),
                other => (
                    matches!(other, Exact::NotUsed).then_some(false),
                    self.ids_and_mask(&full, head, &spans).map_err(tok_err)?,
                ),
            };
            if input_ids.len() > limit {
                input_ids.truncate(limit);
                mask.truncate(limit);
                trims.push(TrimReason::TruncatedToMaxLength);
            }
            let assistant_turns = spans.len();
            let sample = EncodedSample { input_ids, loss_mask: mask, trims, assistant_turns, chain: None, engine_ids };
            if sample.masked_tokens() == 0 {
                return Ok(Err(Rejected {
                    reason: DropReason::NoMaskedTokens,
                    message: format!("no assistant token within the first {} tokens", sample.input_ids.len()),
                }));
            }
            return Ok(Ok(sample));
        }
    }

    /// The messages to render: the system prompt injected, and conversations the template
    /// cannot render as the checkpoint's tokenizer would refused.
    pub(super) fn prepared_messages(
        &self,
        conv: &Conversation,
    ) -> std::result::Result<Vec<crate::conversation::Message>, Rejected> {
        if let Err(e) = self.template.tools_ts_str(conv.tools.as_ref(), &self.opts.template_kwargs) {
            return Err(Rejected {
                reason: DropReason::ToolsTypescriptUnsupported,
                message: format!(
                    "the template declares tools as TypeScript (`tools_ts_str`) and aerie's port of the \
                     model's encoder does not reproduce this tools list exactly: {e}"
                ),
            });
        }
        let mut messages = conv.messages.clone();
        if let Some(prompt) = &self.opts.system_prompt {
            let mut c = Conversation { id: String::new(), messages, tools: None };
            c.inject_system_prompt(prompt, self.opts.replace_system_prompt);
            messages = c.messages;
        }
        Ok(messages)
    }

    /// Tokenise `full`, or with a maximum length only a head of it that holds the first
    /// `max_length + 1` tokens as tokenising all of it would, so that memory and time follow
    /// `max_length`, not the record's size (a 9 MB record took 1 GB and 7 s whole).
    ///
    /// The head ends where one of two checks holds. Preferably just after a special token
    /// (`<|im_end|>`, ...): the tokenizer splits added tokens out before pre-tokenising and
    /// normalising, so the tokens before such a split do not depend on what follows; that the
    /// split really happened there is checked (the head's last token must be that special token
    /// at that offset), and anything unexpected falls back to tokenising everything. Where no
    /// special token is near (one long message), the text itself is cut, and the cut is accepted
    /// when cutting at twice the length gives the same first `max_length + 1` tokens: a
    /// pre-tokenizer's pieces and their merges depend on a few characters around the cut, so a
    /// head that survives moving the cut by its own length is taken as settled (a check, not a
    /// proof; [`Head::open_from`] tells the masking that the text goes on). The head starts at 4
    /// bytes per wanted token and doubles until it holds enough tokens.
    pub(super) fn tokenize_head(&self, full: &str) -> tokenizers::Result<Head> {
        let whole = |enc| Head { enc, open_from: None, cut: HeadCut::Whole };
        let Some(limit) = self.opts.max_length else {
            return self.tokenizer.encode(full, false).map(whole);
        };
        let mut budget = limit.saturating_add(1).saturating_mul(4);
        let longest_added = self.added_texts.iter().map(String::len).max().unwrap_or(0);
        let mut plain: Option<Encoded> = None;
        while budget < full.len() {
            let from = full.ceil_char_boundary(budget);
            // A special token ending the head: one that covers `from` or follows it within the
            // head's own length.
            let lo = full.floor_char_boundary(from.saturating_sub(longest_added));
            let hi = full.ceil_char_boundary(from.saturating_mul(2));
            let window = &full[lo..hi];
            let next = self
                .cut_tokens
                .iter()
                .filter_map(|(content, id)| {
                    let at = window
                        .match_indices(content.as_str())
                        .map(|(at, _)| lo + at)
                        .find(|&at| at + content.len() > from)?;
                    Some((at, content.len(), *id))
                })
                .min_by_key(|&(at, _, id)| (at, id));
            let straddled = |cut: usize| {
                self.added_texts
                    .iter()
                    .any(|t| window.match_indices(t.as_str()).any(|(at, _)| lo + at < cut && cut < lo + at + t.len()))
            };
            if let Some((at, len, id)) = next {
                let end = at + len;
                let enc = self.tokenizer.encode(&full[..end], false)?;
                let split_there = enc.get_ids().last() == Some(&id) && enc.get_offsets().last() == Some(&(at, end));
                if !split_there {
                    break;
                }
                if enc.len() > limit {
                    return Ok(Head { enc, open_from: None, cut: HeadCut::AtSpecialToken });
                }
            } else if !straddled(from) {
                let enc = self.tokenizer.encode(&full[..from], false)?;
                let wanted = limit + 1;
                if enc.len() > wanted {
                    if let Some(prev) = &plain
                        && prev.get_ids()[..wanted] == enc.get_ids()[..wanted]
                        && prev.get_offsets()[..wanted] == enc.get_offsets()[..wanted]
                    {
                        return Ok(Head { enc, open_from: Some(from), cut: HeadCut::InsideText });
                    }
                    plain = Some(enc);
                }
            }
            budget = budget.saturating_mul(2);
        }
        self.tokenizer.encode(full, false).map(whole)
    }

    /// Token ids of `full` and their loss mask over the assistant byte `spans`, from `head`;
    /// the whole text is tokenised instead when the head cannot decide the mask (see
    /// [`Self::mask_spans`]). The ids may run past `max_length`: callers cut.
    pub(super) fn ids_and_mask(
        &self,
        full: &str,
        head: Head,
        spans: &[(usize, usize)],
    ) -> tokenizers::Result<(Vec<u32>, Vec<u8>)> {
        let ids = head.enc.get_ids();
        let mut mask = vec![0u8; ids.len()];
        if self.mask_spans(spans, ids, head.enc.get_offsets(), full, head.open_from, &mut mask) {
            self.head_paths[head.cut as usize].fetch_add(1, Ordering::Relaxed);
            return Ok((ids.to_vec(), mask));
        }
        self.head_paths[HeadCut::Whole as usize].fetch_add(1, Ordering::Relaxed);
        let enc = self.tokenizer.encode(full, false)?;
        let mut mask = vec![0u8; enc.len()];
        self.mask_spans(spans, enc.get_ids(), enc.get_offsets(), full, None, &mut mask);
        Ok((enc.get_ids().to_vec(), mask))
    }

    /// Byte spans of the assistant turns in `full`, up to the first one starting at or after
    /// `cut_byte` (invisible after truncation).
    fn assistant_spans(
        &self,
        messages: &[crate::conversation::Message],
        tools: Option<&serde_json::Value>,
        full: &str,
        cut_byte: usize,
    ) -> std::result::Result<Spans, Rejected> {
        let mut spans = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if m.role != Role::Assistant {
                continue;
            }
            let prompt = self.render_tools(&messages[..i], tools, true)?;
            if !full.starts_with(&prompt) {
                return Ok(Spans::Unstable { index: i });
            }
            if prompt.len() >= cut_byte {
                break;
            }
            let upto = self.render_tools(&messages[..=i], tools, false)?;
            if !full.starts_with(&upto) || upto.len() < prompt.len() {
                return Ok(Spans::Unstable { index: i });
            }
            spans.push((prompt.len(), upto.len()));
        }
        Ok(Spans::Found(spans))
    }

    /// Set `mask` on the tokens of each span, up to its last special token (or its last
    /// non-whitespace token when it has none).
    ///
    /// With `open_from`, the tokens are a head of `full` cut there, and a span going on past the
    /// cut ends where the text past it says: past every token given when a special token follows
    /// (or, with no special token in the head's part of it, any visible text); at the head's last
    /// special token when none follows. A span whose rest is only whitespace and which has no
    /// special token cannot be decided from the head: `false`, and `mask` is not complete.
    pub(super) fn mask_spans(
        &self,
        spans: &[(usize, usize)],
        ids: &[u32],
        offsets: &[(usize, usize)],
        full: &str,
        open_from: Option<usize>,
        mask: &mut [u8],
    ) -> bool {
        let overlaps = |(s, e): (usize, usize), (a, b): (usize, usize)| {
            if s == e { a <= s && s < b } else { s < b && e > a }
        };
        let mut t = 0;
        for &span in spans {
            while t < ids.len() && offsets[t].1 <= span.0 && !overlaps(offsets[t], span) {
                t += 1;
            }
            let first = t;
            let mut last_special = None;
            let mut last_text = None;
            let mut j = first;
            while j < ids.len() && overlaps(offsets[j], span) {
                if self.special_ids.contains(&ids[j]) {
                    last_special = Some(j);
                }
                let (s, e) = offsets[j];
                if full.get(s..e).is_none_or(|text| !text.trim().is_empty()) {
                    last_text = Some(j);
                }
                j += 1;
            }
            let past = j.checked_sub(1).filter(|&e| e >= first);
            let end = match open_from.filter(|&h| span.1 > h) {
                None => last_special.or(last_text),
                Some(h) => {
                    let rest = &full[h..span.1];
                    if self.special_texts.iter().any(|s| rest.contains(s.as_str())) {
                        past
                    } else if last_special.is_some() {
                        last_special
                    } else if !rest.trim().is_empty() {
                        past
                    } else {
                        return false;
                    }
                }
            };
            if let Some(end) = end {
                mask[first..=end].fill(1);
            }
            t = j;
        }
        true
    }
}
