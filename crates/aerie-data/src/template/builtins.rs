//! Built-in chat templates, as Jinja source rendered by the same engine as a model's own
//! template. A declarative table: name, aliases, source, the special-token strings the template
//! is rendered with.

/// A chat format built into aerie, for tokenizers that ship no template (or to override one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinTemplate {
    /// `<|im_start|>{role}\n{content}<|im_end|>\n` per turn (Qwen, SmolLM2 without its default
    /// system prompt).
    ChatMl,
    /// Meta Llama 3: `<|begin_of_text|>` then
    /// `<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>` per turn.
    Llama3,
    /// Kimi-K2/K2.5 (kimi-k25.md): `<|im_user|>user<|im_middle|>{content}<|im_end|>` per turn,
    /// no newlines between turns; tool turns under `<|im_system|>tool<|im_middle|>`.
    KimiK2,
}

/// Every built-in template, for listings and lookups.
pub const BUILTINS: [BuiltinTemplate; 3] = [BuiltinTemplate::ChatMl, BuiltinTemplate::Llama3, BuiltinTemplate::KimiK2];

const CHATML: &str = "{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|im_start|>assistant\\n' }}
{%- endif -%}";

// Meta's Llama-3-Instruct template (the 3.0 release), verbatim.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

const KIMI_K2: &str = "{%- for message in messages -%}
{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>
{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>
{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>
{%- else -%}<|im_system|>{{ message['role'] }}<|im_middle|>
{%- endif -%}
{{ message['content'] }}<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}";

impl BuiltinTemplate {
    /// The canonical name (`chatml`, `llama3`, `kimi-k2`).
    pub fn name(self) -> &'static str {
        match self {
            BuiltinTemplate::ChatMl => "chatml",
            BuiltinTemplate::Llama3 => "llama3",
            BuiltinTemplate::KimiK2 => "kimi-k2",
        }
    }

    /// Look a name or alias up (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "chatml" => Some(BuiltinTemplate::ChatMl),
            "llama3" | "llama-3" | "llama3.1" | "llama-3.1" => Some(BuiltinTemplate::Llama3),
            "kimi" | "kimi-k2" | "kimi-k2.5" | "kimi-k25" => Some(BuiltinTemplate::KimiK2),
            _ => None,
        }
    }

    /// The Jinja source.
    pub fn source(self) -> &'static str {
        match self {
            BuiltinTemplate::ChatMl => CHATML,
            BuiltinTemplate::Llama3 => LLAMA3,
            BuiltinTemplate::KimiK2 => KIMI_K2,
        }
    }

    /// Special-token strings the template is rendered with (`bos_token`, `eos_token`), fixed by
    /// the format rather than taken from a tokenizer.
    pub fn special_tokens(self) -> &'static [(&'static str, &'static str)] {
        match self {
            BuiltinTemplate::ChatMl => &[("eos_token", "<|im_end|>")],
            BuiltinTemplate::Llama3 => &[("bos_token", "<|begin_of_text|>"), ("eos_token", "<|eot_id|>")],
            BuiltinTemplate::KimiK2 => &[("bos_token", "[BOS]"), ("eos_token", "[EOS]")],
        }
    }
}
