//! Chat-template rendering: the built-in formats against their documented strings, and Jinja
//! templates against what transformers' `apply_chat_template` (jinja2, transformers 5.24)
//! renders for the same input (expected strings generated with transformers'
//! `render_jinja_template`).

use aerie_data::Error;
use aerie_data::conversation::{Message, Role};
use aerie_data::template::{BuiltinTemplate, ChatTemplate, TemplateChoice};
use aerie_data::tokenizer::TokenizerFiles;

use super::common::{SMOLLM2_TEMPLATE, tempdir, tokenizer_dir};

fn msgs(turns: &[(Role, &str)]) -> Vec<Message> {
    turns.iter().map(|(r, c)| Message::new(*r, *c)).collect()
}

fn sample() -> Vec<Message> {
    msgs(&[
        (Role::System, "  Be brief.  "),
        (Role::User, "Hi there, {name}!"),
        (Role::Assistant, "Hello \"you\" — é ü 日本"),
        (Role::User, "a,b ,c"),
        (Role::Assistant, "Done.\n"),
    ])
}

#[test]
fn chatml_builtin() {
    let t = ChatTemplate::builtin(BuiltinTemplate::ChatMl);
    let m = msgs(&[(Role::System, "S"), (Role::User, "U"), (Role::Assistant, "A")]);
    assert_eq!(
        t.render(&m, false).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    );
    assert_eq!(
        t.render(&m[..2], true).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama3_builtin() {
    let t = ChatTemplate::builtin(BuiltinTemplate::Llama3);
    let m = msgs(&[(Role::System, "S"), (Role::User, " U \n"), (Role::Assistant, "A")]);
    assert_eq!(
        t.render(&m, false).unwrap(),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>"
    );
    assert_eq!(
        t.render(&m[1..2], true).unwrap(),
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn kimi_builtin_has_no_newlines_between_turns() {
    let t = ChatTemplate::builtin(BuiltinTemplate::KimiK2);
    let m = msgs(&[
        (Role::System, "S"),
        (Role::User, "U"),
        (Role::Assistant, "A\n"),
        (Role::Tool, "T"),
        (Role::Assistant, "B"),
    ]);
    assert_eq!(
        t.render(&m, false).unwrap(),
        "<|im_system|>system<|im_middle|>S<|im_end|><|im_user|>user<|im_middle|>U<|im_end|>\
         <|im_assistant|>assistant<|im_middle|>A\n<|im_end|><|im_system|>tool<|im_middle|>T<|im_end|>\
         <|im_assistant|>assistant<|im_middle|>B<|im_end|>"
    );
    assert_eq!(
        t.render(&m[1..2], true).unwrap(),
        "<|im_user|>user<|im_middle|>U<|im_end|><|im_assistant|>assistant<|im_middle|>"
    );
}

#[test]
fn smollm2_jinja_template_matches_transformers() {
    let t = ChatTemplate::from_source("smollm2", SMOLLM2_TEMPLATE).unwrap();
    let m = sample();
    assert_eq!(
        t.render(&m[1..], false).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi there, {name}!<|im_end|>\n<|im_start|>assistant\nHello \"you\" — é ü 日本<|im_end|>\n<|im_start|>user\na,b ,c<|im_end|>\n<|im_start|>assistant\nDone.\n<|im_end|>\n"
    );
    assert_eq!(
        t.render(&m[..2], true).unwrap(),
        "<|im_start|>system\n  Be brief.  <|im_end|>\n<|im_start|>user\nHi there, {name}!<|im_end|>\n<|im_start|>assistant\n"
    );
}

/// Exercises what HF templates lean on: trim_blocks/lstrip_blocks, namespace, loop controls,
/// Python string methods, Python printing, transformers' tojson and its keyword arguments.
const KITCHEN_SINK: &str = r#"{%- set ns = namespace(sys='', n=0) -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {%- set ns.sys = m.content.strip() -%}
        {%- continue -%}
    {%- endif -%}
    {%- set ns.n = ns.n + 1 -%}
    {%- if loop.index0 > 8 -%}{%- break -%}{%- endif %}
    {% if m.role == 'user' %}
<{{ m['role'] | upper }}:{{ loop.index }}>{{ m.content.strip() }}{% if m.content.startswith('Hi') %} [greeting]{% endif %}

    {% else %}
<{{ m.role | capitalize }}>{{ m.content | trim }}|{{ m.content.split(',') }}|{{ m.content.replace('o', '0') }}</{{ m.role }}>
    {% endif %}
{%- endfor %}
SYS={{ ns.sys | tojson }} N={{ none }} T={{ true }} F={{ 1.0 }} {{ 2.5 * 2 }} {{ 7 // 2 }} {{ 7 / 2 }}
J={{ {'a': [1, 2.5, 'é"\n'], 'b': none, 'c': true} | tojson }}
K={{ {'z': 1, 'a': {'y': [], 'x': {}}} | tojson(indent=2, sort_keys=true) }}
L={{ ['x'] | tojson(separators=(',', ':')) }} M={{ 'abc' | tojson(ensure_ascii=true) }}{{ 'é' | tojson(ensure_ascii=true) }}
S={{ 'a,b'.split(',') }} U={{ messages | length }} {{ tools is none }} {{ documents is none }} {{ bos_token }}{{ eos_token }} {{ ns.n }}
{{ "%s-%d" | format('x', 3) }} {{ 'Title me'.title() }} {{ 'x' ~ 1 ~ none }} {{ [1,2,3][1:] }} {{ messages[-1].content.endswith('\n') }}
{%- if add_generation_prompt %}
<ASSISTANT>
{%- endif %}
"#;

#[test]
fn jinja_python_compatibility_matches_transformers() {
    let mut t = ChatTemplate::from_source("kitchen-sink", KITCHEN_SINK).unwrap();
    t.set_special_token("bos_token", "<s>");
    t.set_special_token("eos_token", "</s>");
    let m = sample();
    assert_eq!(
        t.render(&m, false).unwrap(),
        "<USER:2>Hi there, {name}! [greeting]\n<Assistant>Hello \"you\" — é ü 日本|['Hello \"you\" — é ü 日本']|Hell0 \"y0u\" — é ü 日本</assistant>\n<USER:4>a,b ,c\n<Assistant>Done.|['Done.\\n']|D0ne.\n</assistant>\nSYS=\"Be brief.\" N=None T=True F=1.0 5.0 3 3.5\nJ={\"a\": [1, 2.5, \"é\\\"\\n\"], \"b\": null, \"c\": true}\nK={\n  \"a\": {\n    \"x\": {},\n    \"y\": []\n  },\n  \"z\": 1\n}\nL=[\"x\"] M=\"abc\"\"\\u00e9\"\nS=['a', 'b'] U=5 True True <s></s> 4\nx-3 Title Me x1None [2, 3] True"
    );
    assert_eq!(
        t.render(&m[..4], true).unwrap(),
        "<USER:2>Hi there, {name}! [greeting]\n<Assistant>Hello \"you\" — é ü 日本|['Hello \"you\" — é ü 日本']|Hell0 \"y0u\" — é ü 日本</assistant>\n<USER:4>a,b ,c\nSYS=\"Be brief.\" N=None T=True F=1.0 5.0 3 3.5\nJ={\"a\": [1, 2.5, \"é\\\"\\n\"], \"b\": null, \"c\": true}\nK={\n  \"a\": {\n    \"x\": {},\n    \"y\": []\n  },\n  \"z\": 1\n}\nL=[\"x\"] M=\"abc\"\"\\u00e9\"\nS=['a', 'b'] U=4 True True <s></s> 3\nx-3 Title Me x1None [2, 3] False<ASSISTANT>"
    );
}

#[test]
fn raise_exception_strftime_and_generation_tags() {
    let t = ChatTemplate::from_source(
        "strict",
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}\
         {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
         {% endif %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}|{{ strftime_now('%Y') | length }}",
    )
    .unwrap();
    let ok = msgs(&[(Role::User, "a"), (Role::Assistant, "b")]);
    assert_eq!(t.render(&ok, false).unwrap(), "ab|4");
    let bad = msgs(&[(Role::User, "a"), (Role::User, "b")]);
    match t.render(&bad, false) {
        Err(Error::Template { template, message }) => {
            assert_eq!(template, "strict");
            assert_eq!(message, "template raised: Conversation roles must alternate user/assistant/user/assistant/...");
        }
        other => panic!("expected a template error, got {other:?}"),
    }
    let err = ChatTemplate::from_source("broken", "{% for %}").unwrap_err().to_string();
    assert!(err.contains("broken") && err.contains("does not compile"), "{err}");
}

#[test]
fn templates_resolve_from_a_tokenizer_directory() {
    let dir = tempdir();
    let tok_dir = tokenizer_dir(dir.path(), Some("{{ bos_token }}|{{ eos_token }}|{{ pad_token }}"), None);
    let tok = TokenizerFiles::load(&tok_dir).unwrap();
    let t = ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "<|im_start|>|<|im_end|>|<|endoftext|>");
    // A list of named templates; chat_template.jinja wins over tokenizer_config.json.
    let cfg = serde_json::json!({
        "eos_token": "E",
        "chat_template": [{"name": "default", "template": "D{{ eos_token }}"}, {"name": "tool_use", "template": "T"}]
    });
    std::fs::write(tok_dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let tok = TokenizerFiles::load(&tok_dir).unwrap();
    assert_eq!(ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap().render(&[], false).unwrap(), "DE");
    let named = ChatTemplate::resolve(&"tool_use".parse().unwrap(), &tok).unwrap();
    assert_eq!(named.render(&[], false).unwrap(), "T");
    assert!(ChatTemplate::resolve(&"nope".parse().unwrap(), &tok).is_err());
    std::fs::write(tok_dir.join("chat_template.jinja"), "J").unwrap();
    let tok = TokenizerFiles::load(&tok_dir).unwrap();
    assert_eq!(ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap().render(&[], false).unwrap(), "J");
    // Built-ins ignore the tokenizer's strings; no template at all is an error naming the fix.
    let b = ChatTemplate::resolve(&"llama3".parse().unwrap(), &tok).unwrap();
    assert!(b.render(&msgs(&[(Role::User, "u")]), false).unwrap().starts_with("<|begin_of_text|>"));
    std::fs::remove_file(tok_dir.join("chat_template.jinja")).unwrap();
    std::fs::write(tok_dir.join("tokenizer_config.json"), "{}").unwrap();
    let tok = TokenizerFiles::load(&tok_dir).unwrap();
    let err = ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap_err().to_string();
    assert!(err.contains("no chat template") && err.contains("chatml"), "{err}");
}
