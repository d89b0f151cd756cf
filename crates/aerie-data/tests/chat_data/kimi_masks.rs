//! Turn-chain loss masks on Kimi-K2.5's real template and a Kimi-format tokenizer (o200k's first
//! 163,584 ranks, K2's special names plus K2.5's `<think>`/`</think>` at 163606/163607):
//! hand-checked spans on a reasoning conversation with a tool call.

use aerie_data::conversation::{Conversation, DropReason, GeneratedIds, Message, Role};
use aerie_data::template::{ChatEncoder, ChatTemplate, EncodeOptions, TemplateChoice};
use aerie_data::tokenizer::TokenizerFiles;
use serde_json::{Value, json};

use crate::common::*;
use crate::kimi_templates::conversations;

/// A K2.5-like tokenizer directory: the fixture ranks, K2's config with K2.5's think tokens,
/// and `template` as chat_template.jinja.
fn k25_dir(py: &std::path::Path, fixtures: &std::path::Path, dir: &std::path::Path, template: &str) {
    kimi_tokenizer_dir(py, fixtures, dir);
    let path = dir.join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    cfg["added_tokens_decoder"]["163606"] = json!({"content": "<think>", "special": true});
    cfg["added_tokens_decoder"]["163607"] = json!({"content": "</think>", "special": true});
    std::fs::write(&path, cfg.to_string()).unwrap();
    std::fs::copy(fixtures.join(template), dir.join("chat_template.jinja")).unwrap();
}

/// `k25_dir` with `template` in a scratch directory, loaded; `None` after a skip message (naming
/// `what`) when the Python or the Kimi fixtures are missing.
fn k25_tokenizer(what: &str, template: &str) -> Option<(tempfile::TempDir, TokenizerFiles)> {
    let (Some(py), Some(fixtures)) = (python(what), kimi_fixtures(what)) else { return None };
    let dir = tempfile::tempdir().unwrap();
    k25_dir(&py, &fixtures, dir.path(), template);
    let tok = TokenizerFiles::load(dir.path()).unwrap();
    Some((dir, tok))
}

#[test]
fn k25_reasoning_chains_are_trained_and_history_is_not() {
    let what = "the Kimi-K2.5 turn-chain mask check";
    let Some((_dir, tok)) = k25_tokenizer(what, "kimi-k2.5.chat_template.jinja") else { return };
    assert_eq!(tok.tokenizer.token_to_id("</think>"), Some(163_607));
    let template = ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap();
    let enc = ChatEncoder::new(&template, &tok.tokenizer, EncodeOptions::default()).unwrap();
    assert!(enc.chain_mode(), "K2.5 with thinking on is a reasoning template");

    let (messages, tools) = conversations().remove(0);
    let conv = Conversation { id: "c".into(), messages, tools: None };
    let samples = enc.encode_all(&conv).unwrap().unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!((samples[0].chain, samples[1].chain), (Some(0), Some(1)));
    // Chain 0: the first answer, its reasoning put back after the prompt's <think>.
    assert_eq!(decoded_runs(&tok, &samples[0], true), ["A greeting.</think>Hello! How can I help?<|im_end|>"]);
    assert!(tok.tokenizer.decode(&samples[0].input_ids, false).unwrap().ends_with(
        "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>A greeting.</think>\
             Hello! How can I help?<|im_end|>"
    ));
    // Chain 1: the tool-call turn and the final answer with their reasoning; the first answer
    // is history, rendered stripped (`<think></think>`) and not trained.
    assert_eq!(
        decoded_runs(&tok, &samples[1], true),
        [
            "I should call the tool.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0\
             <|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
            "The tool says 21.</think>It is 21 °C in Paris.<|im_end|>",
        ]
    );
    let unmasked = decoded_runs(&tok, &samples[1], false);
    assert!(unmasked[0].contains("<think></think>Hello! How can I help?<|im_end|>"), "{unmasked:?}");
    assert!(
        unmasked[1].starts_with("<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0"),
        "{unmasked:?}"
    );
    assert!(unmasked[1].ends_with("<|im_assistant|>assistant<|im_middle|><think>"), "{unmasked:?}");

    // With tools, K2.5 declares them first, as the TypeScript its tokenizer computes (worked by
    // hand from tool_declaration_ts.py: required before optional, descriptions as comments); the
    // declaration is prompt, never trained, and the chains train as without tools.
    let with_tools = Conversation { tools, ..conv.clone() };
    let samples = enc.encode_all(&with_tools).unwrap().unwrap();
    assert_eq!(samples.len(), 2);
    let declared = "<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\nnamespace functions {\n\
                    // Weather now\ntype get_weather = (_: {\n  // Name, e.g. 巴黎\n  city: string,\n  \
                    unit?: \"c\" | \"f\"\n}) => any;\n}\n<|im_end|>";
    for s in &samples {
        assert!(tok.tokenizer.decode(&s.input_ids, false).unwrap().starts_with(declared));
        assert!(
            !decoded_runs(&tok, s, true).iter().any(|r| r.contains("get_weather = ")),
            "the declaration is not trained"
        );
    }
    assert_eq!(decoded_runs(&tok, &samples[1], true).len(), 2);
    // A tools list aerie's port does not reproduce exactly: dropped with its own reason.
    let odd = json!([{"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "x": {"enum": [["é"]]}}}}}]);
    let rejected = enc.encode_all(&Conversation { tools: Some(odd), ..conv.clone() }).unwrap().unwrap_err();
    assert_eq!(rejected.reason, DropReason::ToolsTypescriptUnsupported);

    // thinking=false renders no reasoning anywhere: one sample per conversation, answers only.
    let opts = EncodeOptions { template_kwargs: [("thinking".into(), json!(false))].into(), ..Default::default() };
    let off = ChatEncoder::new(&template, &tok.tokenizer, opts).unwrap();
    assert!(!off.chain_mode());
    let samples = off.encode_all(&conv).unwrap().unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].chain, None);
    let trained = decoded_runs(&tok, &samples[0], true);
    assert_eq!(trained[0], "Hello! How can I help?<|im_end|>", "{trained:?}");
}

#[test]
fn k2_thinking_puts_the_reasoning_inside_the_turns_own_think_tag() {
    let what = "the Kimi-K2-Thinking turn-chain mask check";
    let Some((_dir, tok)) = k25_tokenizer(what, "kimi-k2-thinking.chat_template.jinja") else { return };
    let template = ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap();
    let enc = ChatEncoder::new(&template, &tok.tokenizer, EncodeOptions::default()).unwrap();
    assert!(enc.chain_mode());
    let (messages, _) = conversations().remove(1);
    let samples = enc.encode_all(&Conversation { id: "p".into(), messages, tools: None }).unwrap().unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(decoded_runs(&tok, &samples[0], true), ["<think>Add them.</think>4<|im_end|>"]);
    assert_eq!(decoded_runs(&tok, &samples[1], true), ["<think>Add again.\n\nSure.</think>6<|im_end|>"]);
    let text = tok.tokenizer.decode(&samples[1].input_ids, false).unwrap();
    assert!(text.contains("<think></think>4<|im_end|>"), "history stripped: {text}");
    assert!(text.starts_with("<|im_system|>system<|im_middle|>You are Kimi"), "default system prompt: {text}");
}

#[test]
fn k25_prepare_renders_tool_samples_and_counts_how_their_tools_were_declared() {
    use aerie_data::prepare::{PrepareOptions, prepare};
    let what = "the Kimi-K2.5 prepare check with tools";
    let (Some(py), Some(fixtures)) = (python(what), kimi_fixtures(what)) else { return };
    let dir = tempfile::tempdir().unwrap();
    let tok_dir = dir.path().join("tok");
    std::fs::create_dir_all(&tok_dir).unwrap();
    k25_dir(&py, &fixtures, &tok_dir, "kimi-k2.5.chat_template.jinja");
    let convs = conversations();
    let record = |id: &str, k: usize, tools: Option<Value>| {
        let messages: Vec<Value> = convs[k].0.iter().map(crate::kimi_templates::openai).collect();
        let mut r = json!({"id": id, "messages": messages});
        if let Some(t) = tools {
            r["tools"] = t;
        }
        r.to_string()
    };
    let unsupported = json!([{"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "x": {"enum": [["é"]]}}}}}]);
    let lines = [
        record("ts", 0, convs[0].1.clone()),       // 2 chains, TypeScript
        record("fallback", 3, convs[3].1.clone()), // 1 chain, the encoder raises: JSON
        record("plain", 1, None),                  // 2 chains, no tools
        record("odd", 0, Some(unsupported)),       // dropped with its reason
    ];
    let data = dir.path().join("chats.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let report = prepare(&PrepareOptions::new(&data, &tok_dir, dir.path().join("out")), &mut |_| {}).unwrap();
    assert_eq!(report.samples, 5);
    assert_eq!(report.samples_with_tools, [("json_fallback".into(), 1), ("typescript".into(), 2)].into());
    assert_eq!(report.conversations.dropped.get(&DropReason::ToolsTypescriptUnsupported), Some(&1));
}

/// Regenerated data keeps the engine's ids (`token_ids` of a regenerated turn): the sample is
/// the prompt as regenerate sent it, then exactly those ids (trained), then the template's
/// end-of-turn (trained only when the engine stopped by itself). Ids spelling "Hello" letter by
/// letter stay five ids, where tokenising the text would merge them.
#[test]
fn k25_regenerated_answers_train_on_the_engines_ids() {
    let what = "the Kimi-K2.5 engine-ids check";
    let Some((_dir, tok)) = k25_tokenizer(what, "kimi-k2.5.chat_template.jinja") else { return };
    let template = ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap();
    let enc = ChatEncoder::new(&template, &tok.tokenizer, EncodeOptions::default()).unwrap();
    let piece = |s: &str| tok.tokenizer.encode(s, false).unwrap().get_ids().to_vec();
    let mut ids = piece("Think.");
    ids.push(163_607);
    for c in ["H", "e", "l", "l", "o"] {
        ids.extend(piece(c));
    }
    assert!(piece("Hello").len() < 5, "the text would tokenise otherwise");
    let conv = |token_ids: Vec<u32>, cut: bool| {
        let answer = Message {
            reasoning_content: Some("Think.".into()),
            generated: Some(GeneratedIds { token_ids, cut }),
            ..Message::new(Role::Assistant, "Hello")
        };
        Conversation { id: "c".into(), messages: vec![Message::new(Role::User, "Hi"), answer], tools: None }
    };
    let c = conv(ids.clone(), false);
    let prompt = template.render_conversation(&c.messages[..1], None, true, &Default::default()).unwrap();
    assert!(prompt.ends_with("<think>"));
    let head = piece(&prompt);
    let s = enc.encode_all(&c).unwrap().unwrap().remove(0);
    assert_eq!(s.engine_ids, Some(true));
    assert_eq!(s.input_ids, [head.clone(), ids.clone(), vec![163_586]].concat());
    assert_eq!(s.loss_mask, [vec![0; head.len()], vec![1; ids.len() + 1]].concat());
    // Cut at the budget: the template's <|im_end|> follows, but was never generated.
    let s = enc.encode_all(&conv(ids.clone(), true)).unwrap().unwrap().remove(0);
    assert_eq!(s.input_ids, [head.clone(), ids.clone(), vec![163_586]].concat());
    assert_eq!(s.loss_mask, [vec![0; head.len()], vec![1; ids.len()], vec![0]].concat());
    // Ids of another vocabulary, or not decoding to the content: the text is tokenised.
    let mut plain = c.clone();
    plain.messages[1].generated = None;
    let retokenised = enc.encode_all(&plain).unwrap().unwrap().remove(0);
    assert_eq!(retokenised.engine_ids, None);
    assert!(retokenised.input_ids.len() < head.len() + ids.len() + 1, "the text merges the letters");
    for bad in [vec![999_999], piece("Goodbye")] {
        let s = enc.encode_all(&conv(bad, false)).unwrap().unwrap().remove(0);
        assert_eq!((s.engine_ids, &s.input_ids), (Some(false), &retokenised.input_ids));
    }
}
