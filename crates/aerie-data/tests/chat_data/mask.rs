//! Loss masks: decoded masked spans must be exactly each assistant turn's content plus its
//! end-of-turn token, for every built-in format and a model's own Jinja template; truncation
//! keeps the head; prefix-unstable templates are cut or dropped.

use aerie_data::conversation::{Conversation, DropReason, Role, TrimReason};
use aerie_data::template::{
    BuiltinTemplate, ChatEncoder, ChatTemplate, EncodeOptions, EncodedSample, HeadPaths, Rejected,
};
use aerie_data::tokenizer::TokenizerFiles;

use super::common::{SMOLLM2_TEMPLATE, conv, decoded_runs, tempdir, tokenizer_dir};

fn tokenizer() -> (tempfile::TempDir, TokenizerFiles) {
    let dir = tempdir();
    let tok_dir = tokenizer_dir(dir.path(), None, None);
    let tok = TokenizerFiles::load(&tok_dir).unwrap();
    (dir, tok)
}

fn encode(
    t: &ChatTemplate,
    tok: &TokenizerFiles,
    c: &Conversation,
    opts: EncodeOptions,
) -> Result<EncodedSample, Rejected> {
    ChatEncoder::new(t, &tok.tokenizer, opts).unwrap().encode(c).unwrap()
}

fn chat() -> Conversation {
    conv(
        "c1",
        &[
            (Role::System, "You are terse."),
            (Role::User, "What is the capital of France?"),
            (Role::Assistant, "The capital of France is Paris."),
            (Role::User, "And\nof Japan?"),
            (Role::Assistant, "Tokyo — 東京.\n\nIt is the biggest city."),
        ],
    )
}

#[test]
fn masked_spans_are_assistant_content_plus_end_of_turn() {
    let (_d, tok) = tokenizer();
    let cases = [
        (ChatTemplate::builtin(BuiltinTemplate::ChatMl), "<|im_end|>"),
        (ChatTemplate::builtin(BuiltinTemplate::Llama3), "<|eot_id|>"),
        (ChatTemplate::builtin(BuiltinTemplate::KimiK2), "<|im_end|>"),
        (ChatTemplate::from_source("smollm2", SMOLLM2_TEMPLATE).unwrap(), "<|im_end|>"),
    ];
    let c = chat();
    for (t, eot) in &cases {
        let s = encode(t, &tok, &c, EncodeOptions::default()).unwrap();
        // The ids are the whole render, tokenised without added specials (the template has them).
        let full = t.render(&c.messages, false).unwrap();
        assert_eq!(tok.tokenizer.decode(&s.input_ids, false).unwrap(), full, "{}", t.name());
        assert!(s.input_ids.len() > 8, "tokenizer.json's truncation must be off");
        let want: Vec<String> = [2, 4].iter().map(|&i| format!("{}{eot}", c.messages[i].content)).collect();
        assert_eq!(decoded_runs(&tok, &s, true), want, "{}", t.name());
        assert_eq!(s.assistant_turns, 2);
        assert!(s.trims.is_empty());
    }
}

#[test]
fn system_prompt_injection() {
    let (_d, tok) = tokenizer();
    let t = ChatTemplate::builtin(BuiltinTemplate::ChatMl);
    let c = conv("c", &[(Role::User, "u"), (Role::Assistant, "a")]);
    let opts = EncodeOptions { system_prompt: Some("SYS".into()), ..EncodeOptions::default() };
    let s = encode(&t, &tok, &c, opts.clone()).unwrap();
    let text = tok.tokenizer.decode(&s.input_ids, false).unwrap();
    assert!(text.starts_with("<|im_start|>system\nSYS<|im_end|>\n"), "{text}");
    // An existing system prompt is kept unless replacing is asked for.
    let c2 = chat();
    let s = encode(&t, &tok, &c2, opts.clone()).unwrap();
    assert!(tok.tokenizer.decode(&s.input_ids, false).unwrap().contains("You are terse."));
    let replace = EncodeOptions { replace_system_prompt: true, ..opts };
    let s = encode(&t, &tok, &c2, replace).unwrap();
    let text = tok.tokenizer.decode(&s.input_ids, false).unwrap();
    assert!(text.contains("SYS") && !text.contains("terse"), "{text}");
}

#[test]
fn truncation_keeps_the_head_and_drops_samples_without_masked_tokens() {
    let (_d, tok) = tokenizer();
    let t = ChatTemplate::builtin(BuiltinTemplate::ChatMl);
    let c = chat();
    let full = encode(&t, &tok, &c, EncodeOptions::default()).unwrap();
    // Cut inside the second assistant turn: its head stays masked.
    let m = &full.loss_mask;
    let starts: Vec<usize> = (0..m.len()).filter(|&i| m[i] == 1 && (i == 0 || m[i - 1] == 0)).collect();
    assert_eq!(starts.len(), 2);
    let max = starts[1] + 3;
    let s = encode(&t, &tok, &c, EncodeOptions { max_length: Some(max), ..EncodeOptions::default() }).unwrap();
    assert_eq!(s.input_ids, full.input_ids[..max]);
    assert_eq!(s.loss_mask, full.loss_mask[..max]);
    assert_eq!(s.trims, [TrimReason::TruncatedToMaxLength]);
    // Cut before any assistant token: dropped.
    let first_masked = full.loss_mask.iter().position(|&m| m == 1).unwrap();
    let r =
        encode(&t, &tok, &c, EncodeOptions { max_length: Some(first_masked), ..EncodeOptions::default() }).unwrap_err();
    assert_eq!(r.reason, DropReason::NoMaskedTokens);
    // Exactly at full length: nothing trimmed.
    let s = encode(&t, &tok, &c, EncodeOptions { max_length: Some(full.input_ids.len()), ..EncodeOptions::default() })
        .unwrap();
    assert!(s.trims.is_empty());
}

#[test]
fn prefix_unstable_templates_are_cut_or_dropped() {
    let (_d, tok) = tokenizer();
    // Marks message 2 only when it is the last one: the prompt of assistant turn 3 is not a
    // prefix of the full render.
    let t = ChatTemplate::from_source(
        "unstable",
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|im_end|>{% if loop.index0 == 2 and loop.last %}!{% endif %}{% endfor %}\
         {% if add_generation_prompt %}assistant:{% endif %}",
    )
    .unwrap();
    let c = conv("c", &[(Role::User, "u1"), (Role::Assistant, "a1"), (Role::User, "u2"), (Role::Assistant, "a2")]);
    let s = encode(&t, &tok, &c, EncodeOptions::default()).unwrap();
    assert_eq!(s.trims, [TrimReason::TemplateNotPrefixStable]);
    assert_eq!(tok.tokenizer.decode(&s.input_ids, false).unwrap(), "user:u1<|im_end|>assistant:a1<|im_end|>");
    assert_eq!(decoded_runs(&tok, &s, true), ["a1<|im_end|>"]);
    // Rewriting the first turn depending on the length: dropped.
    let t = ChatTemplate::from_source(
        "unstable2",
        "{% if messages | length > 2 %}[long]{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let r = encode(&t, &tok, &c, EncodeOptions::default()).unwrap_err();
    assert_eq!(r.reason, DropReason::TemplateNotPrefixStable);
    // A template that refuses the conversation.
    let t = ChatTemplate::from_source("refuse", "{{ raise_exception('no thanks') }}").unwrap();
    let r = encode(&t, &tok, &c, EncodeOptions::default()).unwrap_err();
    assert_eq!((r.reason, r.message.as_str()), (DropReason::TemplateError, "template raised: no thanks"));
}

#[test]
fn spans_without_a_special_token_end_at_the_last_visible_token() {
    let (_d, tok) = tokenizer();
    let t = ChatTemplate::from_source(
        "plain",
        "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n\n{% endfor %}{% if add_generation_prompt %}### assistant: {% endif %}",
    )
    .unwrap();
    let c = conv("c", &[(Role::User, "hi"), (Role::Assistant, "the answer is 42")]);
    let s = encode(&t, &tok, &c, EncodeOptions::default()).unwrap();
    // The prompt ends in a space that BPE merges into the first answer token (`Ġthe`): a token
    // straddling the span start counts toward the assistant side.
    assert_eq!(decoded_runs(&tok, &s, true), [" the answer is 42"]);
}

#[test]
fn head_only_tokenisation_matches_tokenising_everything() {
    let (_d, tok) = tokenizer();
    let mut turns = Vec::new();
    for i in 0..30 {
        turns.push((Role::User, format!("question {i}: is this the {i}th thing?  \n\n")));
        turns.push((Role::Assistant, format!("answer {i} — ünïcødé 日本 {}\n", "the is ".repeat(i % 7))));
    }
    let turns: Vec<(Role, &str)> = turns.iter().map(|(r, c)| (*r, c.as_str())).collect();
    let c = conv("long", &turns);
    for t in [
        ChatTemplate::builtin(BuiltinTemplate::ChatMl),
        ChatTemplate::builtin(BuiltinTemplate::Llama3),
        ChatTemplate::builtin(BuiltinTemplate::KimiK2),
    ] {
        let full = encode(&t, &tok, &c, EncodeOptions::default()).unwrap();
        for max in [1usize, 7, 40, 333, 1000, 2047, full.input_ids.len() - 1, full.input_ids.len() + 5] {
            let opts = EncodeOptions { max_length: Some(max), ..EncodeOptions::default() };
            match encode(&t, &tok, &c, opts) {
                Ok(s) => {
                    let n = max.min(full.input_ids.len());
                    assert_eq!(s.input_ids, full.input_ids[..n], "{} max {max}", t.name());
                    assert_eq!(s.loss_mask, full.loss_mask[..n], "{} max {max}", t.name());
                }
                Err(r) => {
                    assert_eq!(r.reason, DropReason::NoMaskedTokens);
                    assert!(full.loss_mask[..max].iter().all(|&m| m == 0));
                }
            }
        }
    }
}

/// A message far longer than `max_length` with no special token near the cut: the head is cut
/// inside the text and checked by cutting again at twice the length. Ids and mask must equal
/// tokenising everything, for ordinary prose, one unbroken pre-token, digits, mixed scripts, an
/// answer that ends in a long run of whitespace (where the head cannot decide the mask and the
/// whole text is tokenised), and one with a special token at its start (a mask that ends at the
/// head's last special token would stop there).
#[test]
fn a_head_cut_inside_one_long_message_matches_tokenising_everything() {
    let (_d, tok) = tokenizer();
    let prose: String = (0..20_000).map(|i| ["the ", "answer ", "is ", "42, ", "and\n", "ünïcødé "][i % 6]).collect();
    let bodies = [
        prose.clone(),
        "a".repeat(60_000),
        "1234567890".repeat(6_000),
        "日本語のテキスト and English, mixed — ".repeat(1_500),
        format!("{}{}", &prose[..200], " \n".repeat(30_000)),
        format!("<|begin_of_text|> {prose}"),
    ];
    let mut inside_text = Vec::new();
    for body in &bodies {
        let mut paths = HeadPaths::default();
        for (user, answer) in [("hi", body.as_str()), (body.as_str(), "short answer")] {
            let c = conv("long", &[(Role::User, user), (Role::Assistant, answer)]);
            // The plain template has no end-of-turn token: a span's mask ends at its last visible
            // token, which the whitespace-tailed answer puts far past any head.
            let plain = ChatTemplate::from_source(
                "plain",
                "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n\n{% endfor %}{% if add_generation_prompt %}### assistant: {% endif %}",
            )
            .unwrap();
            for t in
                [ChatTemplate::builtin(BuiltinTemplate::ChatMl), ChatTemplate::builtin(BuiltinTemplate::Llama3), plain]
            {
                let full = encode(&t, &tok, &c, EncodeOptions::default()).unwrap();
                for max in [1usize, 7, 64, 300, 1000] {
                    let opts = EncodeOptions { max_length: Some(max), ..EncodeOptions::default() };
                    let what = format!("{} max {max} body {:?}…", t.name(), &body[..12]);
                    let encoder = ChatEncoder::new(&t, &tok.tokenizer, opts).unwrap();
                    match encoder.encode(&c).unwrap() {
                        Ok(s) => {
                            let n = max.min(full.input_ids.len());
                            assert_eq!(s.input_ids, full.input_ids[..n], "{what}");
                            assert_eq!(s.loss_mask, full.loss_mask[..n], "{what}");
                        }
                        Err(r) => {
                            assert_eq!(r.reason, DropReason::NoMaskedTokens, "{what}");
                            assert!(full.loss_mask[..max].iter().all(|&m| m == 0), "{what}");
                        }
                    }
                    let p = encoder.head_paths();
                    paths.whole += p.whole;
                    paths.at_special_token += p.at_special_token;
                    paths.inside_text += p.inside_text;
                }
            }
        }
        inside_text.push((format!("{:?}…", &body[..12]), paths));
    }
    // The equalities above prove something about the head path only where it was taken: every
    // body but the whitespace-tailed one (whose mask the head cannot decide) is cut inside its
    // text at some length.
    for (i, (body, paths)) in inside_text.iter().enumerate() {
        eprintln!("body {body}: {paths:?}");
        if i != 4 {
            assert!(paths.inside_text > 0, "body {body}: the head was never cut inside the text ({paths:?})");
        }
    }
}

/// A render past the template's budget stops the encoding (`Err`), never a dropped conversation:
/// one conversation per sample, and in turn-chain mode (a reasoning template) even when only a
/// later chain runs past it, which was skipped beside the first chain's sample.
#[test]
fn a_render_past_its_budget_is_the_error_even_in_one_chain_of_several() {
    let (_d, tok) = tokenizer();
    let hang = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let c = conv("c", &[(Role::User, "u1"), (Role::Assistant, "a1"), (Role::User, "u2"), (Role::Assistant, "a2")]);
    let plain = ChatTemplate::from_source("plain-hang", hang).unwrap();
    let enc = ChatEncoder::new(&plain, &tok.tokenizer, EncodeOptions::default()).unwrap();
    let err = enc.encode_all(&c).unwrap_err().to_string();
    assert!(err.contains("plain-hang") && err.contains("conversation `c`") && err.contains("budget"), "{err}");
    // Reasoning rendered (chain mode); past the budget only from the fourth message on.
    let source = format!(
        "{{% for m in messages %}}{{% if m.reasoning_content %}}<think>{{{{ m.reasoning_content }}}}</think>{{% endif %}}\
         {{{{ m.role }}}}:{{{{ m.content }}}}<|im_end|>{{% endfor %}}{{% if messages | length > 3 %}}{hang}{{% endif %}}\
         {{% if add_generation_prompt %}}assistant:{{% endif %}}"
    );
    let chained = ChatTemplate::from_source("chain-hang", source).unwrap();
    let enc = ChatEncoder::new(&chained, &tok.tokenizer, EncodeOptions::default()).unwrap();
    assert!(enc.chain_mode());
    let err = enc.encode_all(&c).unwrap_err().to_string();
    assert!(err.contains("chain-hang") && err.contains("budget"), "{err}");
}
