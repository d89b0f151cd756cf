//! Chat templates: a model's own Jinja template (from `tokenizer_config.json`,
//! `chat_template.jinja` or `chat_template.json`) or a built-in one, rendered with minijinja the
//! way transformers' `apply_chat_template` renders it, and [`ChatEncoder`], which turns a
//! conversation into token ids plus the loss mask over assistant turns.
//!
//! Rendering matches transformers' Jinja environment: `trim_blocks` and `lstrip_blocks` on, loop
//! controls (`break`/`continue`), the globals `raise_exception` and `strftime_now`, transformers'
//! own `tojson` (`json.dumps`, not Jinja's HTML-safe one), Python string/dict methods
//! (minijinja-contrib pycompat), Python printing of `None`/`True`/floats, and the context
//! `messages`, `add_generation_prompt`, `tools=None`, `documents=None` plus the tokenizer's
//! special-token strings (`bos_token`, `eos_token`, ...). transformers' `{% generation %}`
//! markers are accepted and ignored. A template that reads `tools_ts_str` (Kimi-K2.5's) also gets
//! the TypeScript tool declarations K2.5's tokenizer computes ([`tools_ts`]).

mod builtins;
mod chain;
pub mod clock;
mod exact;
mod mask;
mod python;
pub mod tools_ts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::Value;
use minijinja::syntax::SyntaxConfig;

use crate::conversation::Message;
use crate::tokenizer::TokenizerFiles;
use crate::{Error, Result};

pub use builtins::{BUILTINS, BuiltinTemplate};
pub use mask::{ChatEncoder, EncodeOptions, EncodedSample, HeadPaths, Rejected};

/// What became of a sample's closing answer ([`exact`], read by [`mask`]).
enum Exact {
    /// The closing turn has no engine ids.
    NoIds,
    /// It has some, but they cannot be used (the text is tokenised instead).
    NotUsed,
    /// The sample's ids and loss mask, with the engine's ids as the answer.
    Used(Vec<u32>, Vec<u8>),
}

const TEMPLATE_NAME: &str = "chat";

/// minijinja's fuel for one render: about one unit per instruction executed and per 64 bytes of
/// text or list a render creates (its output included), so it bounds a render's time and memory
/// alike, 2^25 units being about 33M instructions or 2 GiB. A chat template is untrusted code
/// from a model repository: a loop that does not end would hang `data prepare`, and a string
/// doubled in a loop would take the machine's memory, so a render past it is an error naming the
/// template. Real templates use far less: Kimi-K2's renders two turns in 58 units
/// (`a_render_that_does_not_end_is_stopped_by_its_budget` prints it), and the text of a 256 MiB
/// record (`limits::MAX_RECORD_BYTES`), rendered once, costs 4M.
pub const RENDER_FUEL: u64 = 1 << 25;

/// Which template to use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TemplateChoice {
    /// The tokenizer's own template (its default one when it has several); an error when it
    /// has none.
    #[default]
    Auto,
    /// A built-in template.
    Builtin(BuiltinTemplate),
    /// A named template of the tokenizer's list (`tool_use`, ...).
    Named(String),
    /// A Jinja file.
    File(PathBuf),
}

impl std::str::FromStr for TemplateChoice {
    type Err = Error;

    /// `auto`, a built-in name (`chatml`, `llama3`, `kimi-k2`), a path to a `.jinja` file (or any
    /// existing file), or the name of one of the tokenizer's templates.
    fn from_str(s: &str) -> Result<Self> {
        if s.is_empty() {
            return Err(Error::InvalidOption("empty template name".into()));
        }
        Ok(if s == "auto" {
            TemplateChoice::Auto
        } else if let Some(b) = BuiltinTemplate::from_name(s) {
            TemplateChoice::Builtin(b)
        } else if s.ends_with(".jinja") || Path::new(s).is_file() {
            TemplateChoice::File(PathBuf::from(s))
        } else {
            TemplateChoice::Named(s.to_owned())
        })
    }
}

/// A compiled chat template and the special-token strings it is rendered with.
pub struct ChatTemplate {
    name: String,
    source: String,
    env: minijinja::Environment<'static>,
    special_tokens: BTreeMap<String, Value>,
    sort_tools: bool,
    reads_tools_ts_str: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

/// Remove transformers' `{% generation %}` / `{% endgeneration %}` markers (an extension that
/// only records assistant spans; it renders nothing).
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = tag[2..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(&tag[..end + 2]);
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    /// Compile `source` under `name` (used in error messages).
    pub fn from_source(name: impl Into<String>, source: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let source = source.into();
        let mut env = minijinja::Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .expect("default delimiters are valid"),
        );
        env.set_formatter(python::format_value);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", python::tojson);
        env.add_function("raise_exception", python::raise_exception);
        env.add_function("strftime_now", python::strftime_now);
        env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(&source))
            .map_err(|e| Error::Template { template: name.clone(), message: format!("does not compile: {e:#}") })?;
        let reads_tools_ts_str = source.contains("tools_ts_str");
        Ok(Self { name, source, env, special_tokens: BTreeMap::new(), sort_tools: false, reads_tools_ts_str })
    }

    /// A built-in template with its own special-token strings.
    pub fn builtin(which: BuiltinTemplate) -> Self {
        let mut t = Self::from_source(which.name(), which.source()).expect("built-in templates compile");
        for (k, v) in which.special_tokens() {
            t.special_tokens.insert((*k).into(), Value::from(*v));
        }
        t
    }

    /// The template `choice` names, for the tokenizer in `tokenizer`. A model's own template is
    /// rendered with the tokenizer's special-token strings.
    pub fn resolve(choice: &TemplateChoice, tokenizer: &TokenizerFiles) -> Result<Self> {
        let mut t = match choice {
            TemplateChoice::Builtin(b) => return Ok(Self::builtin(*b)),
            TemplateChoice::File(path) => {
                let source = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
                Self::from_source(path.display().to_string(), source)?
            }
            TemplateChoice::Auto => {
                let (name, source) = tokenizer.chat_template(None)?.ok_or_else(|| Error::Template {
                    template: "auto".into(),
                    message: format!(
                        "{} has no chat template (no `chat_template` in tokenizer_config.json, no \
                         chat_template.jinja); choose one with --template ({} or a .jinja file)",
                        tokenizer.dir.display(),
                        BUILTINS.map(|b| b.name()).join(", ")
                    ),
                })?;
                Self::from_source(name, source)?
            }
            TemplateChoice::Named(n) => {
                let (name, source) = tokenizer.chat_template(Some(n))?.ok_or_else(|| Error::Template {
                    template: n.clone(),
                    message: format!(
                        "not a built-in template ({}) and {} has no template of that name",
                        BUILTINS.map(|b| b.name()).join(", "),
                        tokenizer.dir.display()
                    ),
                })?;
                Self::from_source(name, source)?
            }
        };
        for (k, v) in tokenizer.special_tokens() {
            t.special_tokens.insert(k, v);
        }
        t.sort_tools = matches!(tokenizer.tokenizer, crate::tokenizer::TextTokenizer::Tiktoken(_));
        Ok(t)
    }

    /// Set (or override) a special-token variable such as `bos_token`.
    pub fn set_special_token(&mut self, name: &str, value: &str) {
        self.special_tokens.insert(name.into(), Value::from(value));
    }

    /// The template's name: a built-in name, `tokenizer_config.json` (with the entry name when
    /// the config lists several), or the file path.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render `messages` as transformers' `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)` would.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &BTreeMap::new())
    }

    /// [`Self::render`] with extra template variables (transformers' `**kwargs`, e.g. `tools`
    /// or `enable_thinking`), given as JSON.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &BTreeMap<String, serde_json::Value>,
    ) -> Result<String> {
        self.render_conversation(messages, None, add_generation_prompt, extra)
    }

    /// Render `messages` with the conversation's `tools` list (declared before the turns by
    /// templates that support tools; `extra` may also set `tools`, which then wins). Each
    /// message carries what the templates read: `role`, `content`, and when present
    /// `reasoning_content`, `tool_calls` (`[{id, type: "function", function: {name,
    /// arguments}}]`), `tool_call_id` and `name`; absent ones are absent keys, as in OpenAI
    /// messages, so `message.get('reasoning_content', '')` sees its default.
    pub fn render_conversation(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &BTreeMap<String, serde_json::Value>,
    ) -> Result<String> {
        let msgs: Vec<Value> = messages.iter().map(message_value).collect();
        let mut ctx: Vec<(&str, Value)> = self.special_tokens.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        ctx.push(("messages", Value::from(msgs)));
        let tools_ts_str = self.tools_ts_str(tools, extra).map_err(|e| Error::Template {
            template: self.name.clone(),
            message: format!("cannot declare the tools as Kimi-K2.5's tokenizer does: {e}"),
        })?;
        let tools = tools.map(|t| if self.sort_tools { deep_sorted(t) } else { t.clone() });
        ctx.push(("tools", tools.as_ref().map_or(Value::from(()), python::json_to_value)));
        if let Some(ts) = tools_ts_str {
            ctx.push(("tools_ts_str", Value::from(ts)));
        }
        ctx.push(("documents", Value::from(())));
        ctx.push(("add_generation_prompt", Value::from(add_generation_prompt)));
        for (k, v) in extra {
            ctx.push((k.as_str(), python::json_to_value(v)));
        }
        let tmpl = self.env.get_template(TEMPLATE_NAME).expect("the template was added at construction");
        tmpl.render(Value::from_pairs(ctx)).map_err(|e| render_error(&self.name, &e))
    }

    /// Whether the template declares tools through a variable only the model's Python
    /// tokenizer computes (Kimi-K2.5's TypeScript `tools_ts_str`).
    pub fn needs_tools_ts_str(&self) -> bool {
        self.reads_tools_ts_str
    }

    /// The `tools_ts_str` a render of `tools` gets: for a template that reads it (Kimi-K2.5's)
    /// and unless `extra` sets it, what K2.5's `apply_chat_template` computes
    /// ([`tools_ts::kimi_tools_ts_str`]); `None` otherwise. An error where aerie's port cannot
    /// reproduce the reference exactly: such a conversation is not rendered (the encoder drops it
    /// as [`crate::conversation::DropReason::ToolsTypescriptUnsupported`]).
    pub fn tools_ts_str(
        &self,
        tools: Option<&serde_json::Value>,
        extra: &BTreeMap<String, serde_json::Value>,
    ) -> std::result::Result<Option<String>, tools_ts::Unsupported> {
        match tools {
            Some(t) if self.needs_tools_ts_str() && !extra.contains_key("tools_ts_str") => {
                tools_ts::kimi_tools_ts_str(t)
            }
            _ => Ok(None),
        }
    }

    /// How a render declares `tools` (for reports): `None` when there are none (absent or
    /// empty); [`TOOLS_TYPESCRIPT`] when the template gets a `tools_ts_str` (Kimi-K2.5's
    /// TypeScript, computed or given), [`TOOLS_JSON_FALLBACK`] when such a template gets none
    /// (K2.5's encoder raised, or no function tools: the JSON fallback), [`TOOLS_TEMPLATE`] when
    /// the template declares them itself.
    pub fn tool_declaration(
        &self,
        tools: Option<&serde_json::Value>,
        extra: &BTreeMap<String, serde_json::Value>,
    ) -> Option<&'static str> {
        let tools = tools.filter(|t| tools_ts::truthy(t))?;
        if !self.needs_tools_ts_str() {
            return Some(TOOLS_TEMPLATE);
        }
        if extra.get("tools_ts_str").is_some_and(tools_ts::truthy) {
            return Some(TOOLS_TYPESCRIPT);
        }
        match self.tools_ts_str(Some(tools), extra) {
            Ok(Some(ts)) if !ts.is_empty() => Some(TOOLS_TYPESCRIPT),
            _ => Some(TOOLS_JSON_FALLBACK),
        }
    }

    /// Sort `tools` keys recursively before rendering, as the Kimi family's
    /// `apply_chat_template` does (`deep_sort_dict`); on for Kimi tokenizers.
    pub fn set_sort_tools(&mut self, on: bool) {
        self.sort_tools = on;
    }
}

/// [`ChatTemplate::tool_declaration`]: tools declared as Kimi-K2.5's TypeScript.
pub const TOOLS_TYPESCRIPT: &str = "typescript";
/// [`ChatTemplate::tool_declaration`]: a TypeScript template's JSON fallback.
pub const TOOLS_JSON_FALLBACK: &str = "json_fallback";
/// [`ChatTemplate::tool_declaration`]: tools declared by the template itself.
pub const TOOLS_TEMPLATE: &str = "template";

/// A message as the templates see it (see [`ChatTemplate::render_conversation`]).
fn message_value(m: &Message) -> Value {
    let mut pairs: Vec<(&str, Value)> =
        vec![("role", Value::from(m.role.as_str())), ("content", Value::from(m.content.as_str()))];
    if let Some(r) = &m.reasoning_content {
        pairs.push(("reasoning_content", Value::from(r.as_str())));
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|c| {
                let function = Value::from_pairs([
                    ("name", Value::from(c.name.as_str())),
                    ("arguments", python::json_to_value(&c.arguments)),
                ]);
                Value::from_pairs([
                    ("id", Value::from(c.id.as_str())),
                    ("type", Value::from("function")),
                    ("function", function),
                ])
            })
            .collect();
        pairs.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &m.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(n) = &m.name {
        pairs.push(("name", Value::from(n.as_str())));
    }
    Value::from_pairs(pairs)
}

/// `deep_sort_dict` of Kimi's tokenizer: every object's keys sorted, recursively.
fn deep_sorted(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            serde_json::Value::Object(keys.into_iter().map(|k| (k.clone(), deep_sorted(&m[k]))).collect())
        }
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(deep_sorted).collect()),
        other => other.clone(),
    }
}

/// A render's error: past the budget ([`RENDER_FUEL`]), the template's fault whatever the
/// conversation; else the useful part, a template's own `raise_exception` text alone, anything
/// else with the engine's location.
fn render_error(template: &str, e: &minijinja::Error) -> Error {
    let template = template.to_owned();
    if e.kind() == minijinja::ErrorKind::OutOfFuel {
        let message = format!(
            "the render ran past aerie's budget for one render ({RENDER_FUEL} units of minijinja fuel: about as many \
             instructions, or 2 GiB of text): the template loops without end or builds text without bound \
             (a chat template renders a conversation in thousands of units); fix the template, or give another \
             with --template ({e})"
        );
        return Error::TemplateBudget { template, message };
    }
    let message = match e.detail() {
        Some(d) if d.starts_with(python::RAISED) => d.to_owned(),
        _ => format!("{e:#}"),
    };
    Error::Template { template, message }
}

/// Variables every render sets itself: the conversation and whether a generation prompt
/// follows. A template variable of that name (`--template-kwarg messages=...`) would silently
/// replace what is rendered, so it is refused.
pub const RESERVED_VARIABLES: [&str; 2] = ["messages", "add_generation_prompt"];

/// Refuse template variables that [`ChatTemplate::render_conversation`] sets itself.
pub fn check_template_kwargs(kwargs: &BTreeMap<String, serde_json::Value>) -> Result<()> {
    match kwargs.keys().find(|k| RESERVED_VARIABLES.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(Error::InvalidOption(format!(
            "--template-kwarg {k}: `{k}` is set by aerie for every render (reserved: {}); it cannot be given",
            RESERVED_VARIABLES.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_are_stripped() {
        let s = strip_generation_tags("a{% generation %}b{%- endgeneration -%}c{% if x %}d{% endif %}");
        assert_eq!(s, "abc{% if x %}d{% endif %}");
    }

    /// A template that never ends, or that doubles a string in a loop, is stopped by the render
    /// budget within seconds and a bounded allocation, with an error naming the template; a real
    /// render uses a small share of it.
    #[test]
    fn a_render_that_does_not_end_is_stopped_by_its_budget() {
        let hang = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
        let double = "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";
        let repeat = "{{ 'x' * 100000000000 }}";
        for (name, source) in [("hang", hang), ("double", double), ("repeat", repeat)] {
            let t = ChatTemplate::from_source(name, source).unwrap();
            let started = std::time::Instant::now();
            let err = t.render(&[Message::new(crate::conversation::Role::User, "hi")], true).unwrap_err().to_string();
            assert!(err.contains(&format!("chat template `{name}`")) && err.contains("budget for one render"), "{err}");
            assert!(started.elapsed().as_secs() < 60, "{name}: {:?}", started.elapsed());
        }
        let t = ChatTemplate::builtin(BuiltinTemplate::KimiK2);
        let msgs = [
            Message::new(crate::conversation::Role::User, "hi"),
            Message::new(crate::conversation::Role::Assistant, "hello"),
        ];
        let ctx = Value::from_pairs([
            ("messages", Value::from(msgs.iter().map(message_value).collect::<Vec<_>>())),
            ("add_generation_prompt", Value::from(true)),
        ]);
        let tmpl = t.env.get_template(TEMPLATE_NAME).unwrap();
        let used = tmpl.render_captured(ctx).unwrap().state().fuel_levels().unwrap().0;
        eprintln!("Kimi-K2's template, two turns: {used} units of fuel");
        assert!(used > 0 && used < RENDER_FUEL / 1000, "{used}");
    }

    #[test]
    fn choice_parsing() {
        assert_eq!("auto".parse::<TemplateChoice>().unwrap(), TemplateChoice::Auto);
        assert_eq!("Kimi-K2".parse::<TemplateChoice>().unwrap(), TemplateChoice::Builtin(BuiltinTemplate::KimiK2));
        assert_eq!("x.jinja".parse::<TemplateChoice>().unwrap(), TemplateChoice::File("x.jinja".into()));
        assert_eq!("tool_use".parse::<TemplateChoice>().unwrap(), TemplateChoice::Named("tool_use".into()));
    }
}
