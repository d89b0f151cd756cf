//! Conversations as training data: the normalised [`Conversation`] every reader produces, and
//! the rules that turn a raw record (any role spelling, broken alternation, empty turns) into one
//! or drop it, with a count per reason in [`NormalizeReport`].
//!
//! The rules, applied in this order (eagle3.md §3 trains on assistant tokens only, so a
//! conversation is worth keeping exactly when it ends with a well-formed assistant turn):
//!
//! 1. **Roles** are normalised case-insensitively: `human`/`user` → user;
//!    `gpt`/`chatgpt`/`bing`/`bard`/`assistant`/`model` → assistant; `system`; `tool`/`function`/
//!    `ipython` → tool. At the first turn with any other role the conversation is **cut** (that
//!    turn and everything after it are removed): what follows answers something we cannot render.
//! 2. **Empty content** (only whitespace): an empty system turn is removed; any other empty turn
//!    cuts the conversation before it.
//! 3. **System turns** are kept only before the first user turn (several are joined with a blank
//!    line); a system turn later on cuts the conversation.
//! 4. **Leading turns** that are not user turns (after the system prompt) are trimmed: the first
//!    answer must answer something.
//! 5. **Consecutive same-role turns** (user+user, assistant+assistant) are merged with
//!    [`NormalizeOptions::merge_separator`] under [`SameRolePolicy::Merge`] (the default), or cut
//!    the conversation under [`SameRolePolicy::Cut`]. Tool turns must follow an assistant or tool
//!    turn, or they cut the conversation; consecutive tool turns stay separate.
//! 6. **Trailing** non-assistant turns are trimmed.
//! 7. A conversation left **without an assistant turn** is dropped; the reason counted is the
//!    cut that emptied it, or [`DropReason::NoAssistantTurn`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Who speaks a turn, after normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt.
    System,
    /// The human side.
    User,
    /// The model: the only role trained on.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// The name chat templates expect (`message['role']`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Map a source role spelling (ShareGPT `from`, OpenAI `role`) to a role; `None` when the
    /// spelling is unknown.
    pub fn from_source(role: &str) -> Option<Role> {
        match role.trim().to_ascii_lowercase().as_str() {
            "human" | "user" => Some(Role::User),
            "gpt" | "chatgpt" | "bing" | "bard" | "assistant" | "model" => Some(Role::Assistant),
            "system" => Some(Role::System),
            "tool" | "function" | "ipython" => Some(Role::Tool),
            _ => None,
        }
    }
}

/// One turn of a normalised conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said, unmodified (templates may trim it).
    pub content: String,
    /// The assistant's thinking before `content` (`reasoning_content` of OpenAI-style data, or
    /// an inline `<think>…</think>` at the start of the content, split off by [`normalize`]).
    /// Reasoning templates (Kimi-K2-Thinking, K2.5, Qwen3) render it as `<think>…</think>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The assistant's tool calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's call id (`tool_call_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The speaker's name (`name`; Kimi's templates print it instead of the role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The token ids a serving engine generated for this assistant turn, when the data holds
    /// them (`aerie regenerate` through an engine that returns ids): the prepared sample then
    /// trains on exactly these ids, not on a retokenisation of their text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated: Option<GeneratedIds>,
}

/// What an engine generated for an assistant turn, id for id. A random or repetitive answer
/// need not tokenise back to the ids that produced it (32 generated tokens became 34–36 on the
/// Kimi miniature), so regenerated data keeps the ids beside the text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedIds {
    /// The answer's ids, without the stop token (`token_ids` of a regenerated turn).
    pub token_ids: Vec<u32>,
    /// The answer was cut at the token budget (`finish_reason` `length`): the end-of-turn markup
    /// the template puts after it was never generated, so it is not trained on either.
    pub cut: bool,
}

/// One tool call of an assistant turn, as OpenAI messages carry it
/// (`{"id", "type": "function", "function": {"name", "arguments"}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id (Kimi's parsers expect `functions.{name}:{index}`); used verbatim.
    #[serde(default)]
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON string (rendered raw by most templates) or an object.
    pub arguments: serde_json::Value,
}

impl Message {
    /// A message.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            generated: None,
        }
    }

    /// Whether the turn says anything: content, reasoning or tool calls.
    pub fn is_empty(&self) -> bool {
        self.content.trim().is_empty()
            && self.reasoning_content.as_deref().is_none_or(|r| r.trim().is_empty())
            && self.tool_calls.is_empty()
    }
}

/// Split an inline `<think>…</think>` at the start of an assistant content into reasoning and
/// content, as the serving side's reasoning parsers do (reference kimi-tokenizer.md §7.4:
/// rendered unsplit, K2.5 would print `<think></think><think>…`). Whitespace after `</think>`
/// is dropped, as templates strip it.
pub fn split_inline_think(content: &str) -> Option<(String, String)> {
    let rest = content.trim_start().strip_prefix("<think>")?;
    let end = rest.find("</think>")?;
    Some((rest[..end].to_owned(), rest[end + "</think>".len()..].trim_start().to_owned()))
}

/// A conversation fit for training: optional leading system prompt, then user-first turns,
/// ending with an assistant turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    /// The source's id (ShareGPT `id`), or `record-<n>` when the record has none.
    pub id: String,
    /// The turns.
    pub messages: Vec<Message>,
    /// The tool declarations (`tools` of the record: OpenAI function schemas), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<serde_json::Value>,
}

impl Conversation {
    /// Put `prompt` in front as the system prompt when the conversation has none; with
    /// `replace`, also overwrite an existing one.
    pub fn inject_system_prompt(&mut self, prompt: &str, replace: bool) {
        match self.messages.first_mut() {
            Some(first) if first.role == Role::System => {
                if replace {
                    first.content = prompt.to_owned();
                }
            }
            _ => self.messages.insert(0, Message::new(Role::System, prompt)),
        }
    }

    /// Number of assistant turns.
    pub fn assistant_turns(&self) -> usize {
        self.messages.iter().filter(|m| m.role == Role::Assistant).count()
    }
}

/// One turn as a reader found it: role spelling and content unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawTurn {
    /// The role as spelt in the source (`human`, `gpt`, `user`, ...).
    pub role: String,
    /// The text (content parts concatenated, `null` as empty).
    pub content: String,
    /// `reasoning_content` (or `reasoning`).
    pub reasoning_content: Option<String>,
    /// `tool_calls`.
    pub tool_calls: Vec<ToolCall>,
    /// `tool_call_id`.
    pub tool_call_id: Option<String>,
    /// `name`.
    pub name: Option<String>,
    /// The content had image, video or audio parts.
    pub has_media: bool,
    /// `token_ids` and `finish_reason` of a regenerated assistant turn.
    pub generated: Option<GeneratedIds>,
}

/// A record as a reader found it, before [`normalize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawConversation {
    /// The source's id, when the record has one.
    pub id: Option<String>,
    /// Position of the record in the input (0-based, counting malformed records too).
    pub index: u64,
    /// The turns.
    pub turns: Vec<RawTurn>,
    /// The record's `tools` list.
    pub tools: Option<serde_json::Value>,
}

/// What to do with consecutive turns of the same role (rule 5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SameRolePolicy {
    /// Join them into one turn.
    #[default]
    Merge,
    /// Cut the conversation before the second one.
    Cut,
}

/// Options of [`normalize`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NormalizeOptions {
    /// Rule 5.
    pub same_role: SameRolePolicy,
    /// Put between merged turns.
    pub merge_separator: String,
}

impl Default for NormalizeOptions {
    fn default() -> Self {
        Self { same_role: SameRolePolicy::Merge, merge_separator: "\n\n".into() }
    }
}

/// Why a conversation was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DropReason {
    /// The record is not a conversation (unparseable, no `conversations`/`messages` list).
    Malformed,
    /// Cut at an unknown role before any assistant turn.
    UnknownRole,
    /// Cut at an empty turn before any assistant turn.
    EmptyContent,
    /// Cut at a misplaced system turn before any assistant turn.
    MisplacedSystem,
    /// Cut at a misplaced tool turn before any assistant turn.
    MisplacedTool,
    /// Cut at consecutive same-role turns ([`SameRolePolicy::Cut`]) before any assistant turn.
    SameRole,
    /// No assistant turn at all.
    NoAssistantTurn,
    /// The chat template refused the conversation (its `raise_exception`, a render error).
    TemplateError,
    /// The chat template ran past the budget of one render (a loop without end, text without
    /// bound): never counted, since `ChatEncoder::encode_all` turns it into the error that stops
    /// the run (the template's fault).
    TemplateBudget,
    /// Rendering a prefix of the conversation is not a prefix of rendering all of it (templates
    /// that rewrite history), before any assistant turn could be located.
    TemplateNotPrefixStable,
    /// No assistant token left after truncation to the maximum length.
    NoMaskedTokens,
    /// A turn has image, video or audio parts: their placeholder stands for vision or audio
    /// embeddings that a text-only capture cannot produce.
    MediaContent,
    /// The template declares tools as Kimi-K2.5's TypeScript `tools_ts_str` and aerie's port
    /// of the tokenizer's encoder (`template::tools_ts`) meets something in this tools list it
    /// does not reproduce byte for byte (Python's `repr` of non-ASCII strings inside a list, a
    /// non-string `type`, an integer beyond 64 bits): rendered, it could differ from what the
    /// checkpoint's own tokenizer renders.
    ToolsTypescriptUnsupported,
}

impl DropReason {
    /// The snake_case name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::UnknownRole => "unknown_role",
            DropReason::EmptyContent => "empty_content",
            DropReason::MisplacedSystem => "misplaced_system",
            DropReason::MisplacedTool => "misplaced_tool",
            DropReason::SameRole => "same_role",
            DropReason::NoAssistantTurn => "no_assistant_turn",
            DropReason::TemplateError => "template_error",
            DropReason::TemplateBudget => "template_budget",
            DropReason::TemplateNotPrefixStable => "template_not_prefix_stable",
            DropReason::NoMaskedTokens => "no_masked_tokens",
            DropReason::MediaContent => "media_content",
            DropReason::ToolsTypescriptUnsupported => "tools_typescript_unsupported",
        }
    }
}

/// A change made to a conversation that was kept; counted once per conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TrimReason {
    /// Cut at a turn with an unknown role.
    UnknownRole,
    /// Cut at an empty user/assistant/tool turn.
    EmptyContent,
    /// An empty system turn removed.
    EmptySystem,
    /// Cut at a system turn after the first user turn.
    MisplacedSystem,
    /// Cut at a tool turn that follows no assistant turn.
    MisplacedTool,
    /// Cut at consecutive same-role turns ([`SameRolePolicy::Cut`]).
    SameRole,
    /// Consecutive same-role turns merged ([`SameRolePolicy::Merge`]).
    MergedSameRole,
    /// Several leading system turns joined into one.
    MergedSystem,
    /// Leading assistant/tool turns removed.
    LeadingNonUser,
    /// Trailing user/tool turns removed.
    TrailingNonAssistant,
    /// Cut before the first assistant turn whose template render is not prefix-stable.
    TemplateNotPrefixStable,
    /// Tokens beyond the maximum length removed.
    TruncatedToMaxLength,
}

impl TrimReason {
    /// The snake_case name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            TrimReason::UnknownRole => "unknown_role",
            TrimReason::EmptyContent => "empty_content",
            TrimReason::EmptySystem => "empty_system",
            TrimReason::MisplacedSystem => "misplaced_system",
            TrimReason::MisplacedTool => "misplaced_tool",
            TrimReason::SameRole => "same_role",
            TrimReason::MergedSameRole => "merged_same_role",
            TrimReason::MergedSystem => "merged_system",
            TrimReason::LeadingNonUser => "leading_non_user",
            TrimReason::TrailingNonAssistant => "trailing_non_assistant",
            TrimReason::TemplateNotPrefixStable => "template_not_prefix_stable",
            TrimReason::TruncatedToMaxLength => "truncated_to_max_length",
        }
    }
}

/// Counts of what happened to each conversation, from [`normalize`] to the last stage that may
/// drop one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NormalizeReport {
    /// Conversations counted (kept + dropped).
    pub conversations: u64,
    /// Conversations kept.
    pub kept: u64,
    /// Conversations dropped, per reason.
    pub dropped: BTreeMap<DropReason, u64>,
    /// Kept conversations changed, per reason.
    pub trimmed: BTreeMap<TrimReason, u64>,
    /// Turns seen per source role spelling (lower-cased), before normalisation.
    pub source_roles: BTreeMap<String, u64>,
}

impl NormalizeReport {
    /// Count the turns of a record as read, per source role spelling.
    pub fn count_roles(&mut self, raw: &RawConversation) {
        for turn in &raw.turns {
            let role = turn.role.trim().to_ascii_lowercase();
            *self.source_roles.entry(role).or_default() += 1;
        }
    }

    /// Count one conversation dropped for `reason`.
    pub fn drop(&mut self, reason: DropReason) {
        self.conversations += 1;
        *self.dropped.entry(reason).or_default() += 1;
    }

    /// Count one conversation kept, changed for each of `trims`.
    pub fn keep(&mut self, trims: &[TrimReason]) {
        self.conversations += 1;
        self.kept += 1;
        for t in trims {
            *self.trimmed.entry(*t).or_default() += 1;
        }
    }

    /// Total dropped.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// Why the walk over the turns stopped early.
#[derive(Clone, Copy)]
enum Cut {
    UnknownRole,
    EmptyContent,
    MisplacedSystem,
    MisplacedTool,
    SameRole,
}

impl Cut {
    fn trim(self) -> TrimReason {
        match self {
            Cut::UnknownRole => TrimReason::UnknownRole,
            Cut::EmptyContent => TrimReason::EmptyContent,
            Cut::MisplacedSystem => TrimReason::MisplacedSystem,
            Cut::MisplacedTool => TrimReason::MisplacedTool,
            Cut::SameRole => TrimReason::SameRole,
        }
    }

    fn drop(self) -> DropReason {
        match self {
            Cut::UnknownRole => DropReason::UnknownRole,
            Cut::EmptyContent => DropReason::EmptyContent,
            Cut::MisplacedSystem => DropReason::MisplacedSystem,
            Cut::MisplacedTool => DropReason::MisplacedTool,
            Cut::SameRole => DropReason::SameRole,
        }
    }
}

/// A conversation that passed [`normalize`], with the changes made to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The conversation.
    pub conversation: Conversation,
    /// What was changed, each reason once.
    pub trims: Vec<TrimReason>,
}

/// Apply the module's rules to `raw`: the conversation and what was changed, or why it is
/// dropped. Counting is left to the caller ([`NormalizeReport::keep`], [`NormalizeReport::drop`]),
/// since later stages (template, truncation) may still drop a normalised conversation.
pub fn normalize(raw: RawConversation, opts: &NormalizeOptions) -> Result<Normalized, DropReason> {
    let id = raw.id.unwrap_or_else(|| format!("record-{}", raw.index));
    let mut trims: Vec<TrimReason> = Vec::new();
    let note = |trims: &mut Vec<TrimReason>, r: TrimReason| {
        if !trims.contains(&r) {
            trims.push(r);
        }
    };
    if raw.turns.iter().any(|t| t.has_media) {
        return Err(DropReason::MediaContent);
    }
    let mut messages: Vec<Message> = Vec::new();
    let mut cut = None;
    for turn in raw.turns {
        let Some(role) = Role::from_source(&turn.role) else {
            cut = Some(Cut::UnknownRole);
            break;
        };
        let mut msg = Message {
            role,
            content: turn.content,
            reasoning_content: turn.reasoning_content,
            tool_calls: turn.tool_calls,
            tool_call_id: turn.tool_call_id,
            name: turn.name,
            generated: turn.generated.filter(|_| role == Role::Assistant),
        };
        if role == Role::Assistant
            && msg.reasoning_content.is_none()
            && let Some((reasoning, content)) = split_inline_think(&msg.content)
        {
            msg.reasoning_content = Some(reasoning);
            msg.content = content;
        }
        if msg.is_empty() {
            if role == Role::System {
                note(&mut trims, TrimReason::EmptySystem);
                continue;
            }
            cut = Some(Cut::EmptyContent);
            break;
        }
        let last = messages.last().map(|m| m.role);
        // Leading non-user turns are never pushed, so the first non-system turn is a user turn.
        let started = messages.iter().any(|m| m.role != Role::System);
        match role {
            Role::System if started => {
                cut = Some(Cut::MisplacedSystem);
                break;
            }
            Role::Assistant | Role::Tool if !started => {
                note(&mut trims, TrimReason::LeadingNonUser);
                continue;
            }
            Role::Tool if !matches!(last, Some(Role::Assistant | Role::Tool)) => {
                cut = Some(Cut::MisplacedTool);
                break;
            }
            Role::System | Role::User | Role::Assistant if last == Some(role) => {
                let prev = messages.last_mut().expect("a last message exists");
                // Turns with reasoning or tool calls are not merged: the result would be a
                // turn the model never produced.
                let plain =
                    |m: &Message| m.reasoning_content.is_none() && m.tool_calls.is_empty() && m.generated.is_none();
                if role == Role::System || (opts.same_role == SameRolePolicy::Merge && plain(prev) && plain(&msg)) {
                    prev.content.push_str(&opts.merge_separator);
                    prev.content.push_str(&msg.content);
                    let why = if role == Role::System { TrimReason::MergedSystem } else { TrimReason::MergedSameRole };
                    note(&mut trims, why);
                    continue;
                }
                cut = Some(Cut::SameRole);
                break;
            }
            _ => {}
        }
        messages.push(msg);
    }
    let mut trailing = false;
    while messages.last().is_some_and(|m| m.role != Role::Assistant) {
        messages.pop();
        trailing = true;
    }
    if !messages.iter().any(|m| m.role == Role::Assistant) {
        return Err(cut.map_or(DropReason::NoAssistantTurn, Cut::drop));
    }
    match cut {
        Some(c) => note(&mut trims, c.trim()),
        // Turns removed only because of a cut belong to the cut, not to a separate trim.
        None if trailing => note(&mut trims, TrimReason::TrailingNonAssistant),
        None => {}
    }
    Ok(Normalized { conversation: Conversation { id, messages, tools: raw.tools }, trims })
}
