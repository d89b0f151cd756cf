//! Moonshot's own chat templates (`../shared/fixtures/kimi/`: K2-Instruct 2025-08 and 2025-09,
//! K2-Thinking, K2.5) rendered by aerie must equal jinja2 as transformers configures it
//! (`scripts/render_chat_template.py`), byte for byte: every prefix of conversations with
//! reasoning, tool calls, tool results, names and a tools list, with and without the
//! generation prompt, K2.5 with `thinking` unset, true and false, and K2.5's tools declared as
//! its tokenizer declares them (`tools_ts_str` from the reference `tool_declaration_ts.py`, or
//! the JSON fallback where that raises).

use std::collections::BTreeMap;

use aerie_data::conversation::{Message, Role, ToolCall};
use aerie_data::template::ChatTemplate;
use serde_json::{Value, json};

use crate::common::*;

fn msg(role: Role, content: &str) -> Message {
    Message::new(role, content)
}

fn thinking(content: &str, reasoning: &str) -> Message {
    Message { reasoning_content: Some(reasoning.into()), ..msg(Role::Assistant, content) }
}

/// The conversations, and their `tools`.
pub fn conversations() -> Vec<(Vec<Message>, Option<Value>)> {
    let call = |id: &str, name: &str, args: Value| ToolCall { id: id.into(), name: name.into(), arguments: args };
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "required": ["city"], "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string",
        "description": "Name, e.g. 巴黎"}}}, "description": "Weather now"}}]);
    let agentic = vec![
        msg(Role::System, "You are terse."),
        msg(Role::User, "Hi"),
        thinking("Hello! How can I help?", "A greeting."),
        msg(Role::User, "Weather in Paris?"),
        Message {
            tool_calls: vec![call("functions.get_weather:0", "get_weather", json!("{\"city\": \"Paris\"}"))],
            ..thinking("", "I should call the tool.")
        },
        Message { tool_call_id: Some("functions.get_weather:0".into()), ..msg(Role::Tool, "{\"temp\": 21}") },
        thinking("It is 21 °C in Paris.", "The tool says 21."),
    ];
    let plain = vec![
        msg(Role::User, "2+2?"),
        thinking("4", "Add them."),
        msg(Role::User, "And 3+3?"),
        thinking("6", "Add again.\n\nSure."),
    ];
    let named = vec![
        msg(Role::User, "Look up x"),
        Message {
            tool_calls: vec![
                call("functions.lookup:0", "lookup", json!({"q": "x", "a": [1, 2.5, null, true]})),
                call("functions.lookup:1", "lookup", json!({"q": "y"})),
            ],
            ..msg(Role::Assistant, "Looking.")
        },
        Message {
            name: Some("lookup".into()),
            tool_call_id: Some("functions.lookup:0".into()),
            ..msg(Role::Tool, "X!")
        },
        Message { tool_call_id: Some("functions.lookup:1".into()), ..msg(Role::Tool, "Y!") },
        msg(Role::Assistant, "Both found."),
    ];
    // Declared as TypeScript by K2.5: $defs, $ref, anyOf, arrays, defaults.
    let rich = json!([tools[0], {"type": "function", "function": {"name": "lookup", "description": "Find things.\n\nFast.",
        "parameters": {"type": "object", "required": ["q"], "$defs": {"Filter": {"type": "object",
            "description": "A filter", "properties": {"field": {"type": "string"}, "op": {"enum": ["eq", "lt"]}}}},
            "properties": {"q": {"type": "string", "maxLength": 100}, "a": {"type": "array", "items":
            {"anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "null"}]}}, "filters": {"type": "array",
            "items": {"$ref": "#/$defs/Filter", "description": "One filter"}}, "limit": {"type": "integer",
            "default": 10, "minimum": 1}}}}}]);
    // The encoder raises on a property without a type: K2.5 declares the tools as JSON.
    let raising = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"x": {"description": "untyped"}}}}}]);
    let fallback = vec![
        msg(Role::User, "Call f"),
        Message { tool_calls: vec![call("functions.f:0", "f", json!({"x": 1}))], ..thinking("", "Calling f.") },
        Message { tool_call_id: Some("functions.f:0".into()), ..msg(Role::Tool, "ok") },
        thinking("Done.", "It worked."),
    ];
    vec![(agentic, Some(tools)), (plain, None), (named, Some(rich)), (fallback, Some(raising))]
}

/// A message as an OpenAI dict (the keys aerie passes, see `render_conversation`).
pub fn openai(m: &Message) -> Value {
    let mut o = json!({"role": m.role.as_str(), "content": m.content});
    if let Some(r) = &m.reasoning_content {
        o["reasoning_content"] = json!(r);
    }
    if !m.tool_calls.is_empty() {
        o["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    if let Some(id) = &m.tool_call_id {
        o["tool_call_id"] = json!(id);
    }
    if let Some(n) = &m.name {
        o["name"] = json!(n);
    }
    o
}

pub const TEMPLATES: [&str; 4] = [
    "kimi-k2-instruct.chat_template.2025-08.jinja",
    "kimi-k2-instruct.chat_template.2025-09.jinja",
    "kimi-k2-thinking.chat_template.jinja",
    "kimi-k2.5.chat_template.jinja",
];

/// Render `cases` with jinja2 through AERIE_PYTHON.
pub fn jinja2_render(py: &std::path::Path, cases: &[Value]) -> Vec<Value> {
    json_script(py, "render_chat_template.py", cases, None)
}

#[test]
fn kimi_templates_render_exactly_as_jinja2_with_transformers_settings() {
    let what = "the Kimi template rendering check";
    let (Some(py), Some(fixtures)) = (python(what), kimi_fixtures(what)) else { return };
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(fixtures.join("kimi-k2-instruct.tokenizer_config.json")).unwrap())
            .unwrap();
    let specials: BTreeMap<String, Value> = ["bos_token", "eos_token", "pad_token", "unk_token"]
        .iter()
        .filter_map(|k| cfg.get(*k).map(|v| (k.to_string(), v.get("content").cloned().unwrap_or(v.clone()))))
        .collect();
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    for file in TEMPLATES {
        let path = fixtures.join(file);
        let mut t = ChatTemplate::from_source(file, std::fs::read_to_string(&path).unwrap()).unwrap();
        for (k, v) in &specials {
            t.set_special_token(k, v.as_str().unwrap());
        }
        t.set_sort_tools(true);
        let kwargs: Vec<BTreeMap<String, Value>> = if file.contains("k2.5") {
            vec![BTreeMap::new(), [("thinking".into(), json!(true))].into(), [("thinking".into(), json!(false))].into()]
        } else {
            vec![BTreeMap::new()]
        };
        for kw in &kwargs {
            for (messages, tools) in conversations() {
                for k in 1..=messages.len() {
                    for gen_prompt in [false, true] {
                        let got = t.render_conversation(&messages[..k], tools.as_ref(), gen_prompt, kw).unwrap();
                        ours.push((file, kw.clone(), k, gen_prompt, got));
                        cases.push(json!({
                            "template": path, "messages": messages[..k].iter().map(openai).collect::<Vec<_>>(),
                            "tools": tools, "add_generation_prompt": gen_prompt, "kwargs": kw,
                            "special_tokens": specials, "sort_tools": true,
                            "kimi_tools_ts": file.contains("k2.5"),
                        }));
                    }
                }
            }
        }
    }
    let want = jinja2_render(&py, &cases);
    assert_eq!(want.len(), ours.len());
    let mut checked_reasoning = false;
    for ((file, kw, k, gen_prompt, got), want) in ours.iter().zip(&want) {
        let want = want.as_str().unwrap_or_else(|| panic!("{file} {kw:?} k={k}: jinja2 failed: {want}"));
        assert_eq!(got, want, "{file} {kw:?} messages[..{k}] add_generation_prompt={gen_prompt}");
        checked_reasoning |= got.contains("<think>I should call the tool.</think>");
    }
    assert!(checked_reasoning, "some render must keep a chain's reasoning");
    let declared = |needle: &str| ours.iter().any(|(f, _, _, _, got)| f.contains("k2.5") && got.contains(needle));
    assert!(declared("interface Filter {") && declared("type get_weather = (_: {"), "K2.5 declares TypeScript");
    assert!(declared("tool_declare<|im_middle|>[{\"function\":"), "and falls back to JSON where the encoder raises");
    eprintln!("{} renders equal to jinja2's", ours.len());
}
