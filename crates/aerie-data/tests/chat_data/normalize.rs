//! Role normalisation and the drop/trim rules of `conversation::normalize`.

use aerie_data::conversation::{
    DropReason, NormalizeOptions, NormalizeReport, RawConversation, RawTurn, Role, SameRolePolicy, TrimReason,
    normalize,
};

fn raw(turns: &[(&str, &str)]) -> RawConversation {
    RawConversation {
        id: None,
        index: 7,
        turns: turns
            .iter()
            .map(|(r, c)| RawTurn { role: (*r).into(), content: (*c).into(), ..RawTurn::default() })
            .collect(),
        tools: None,
    }
}

/// The normalised turns and the trims, or the drop reason.
type Outcome = Result<(Vec<(Role, String)>, Vec<TrimReason>), DropReason>;

fn roles_of(turns: &[(&str, &str)]) -> Outcome {
    normalize(raw(turns), &NormalizeOptions::default())
        .map(|n| (n.conversation.messages.into_iter().map(|m| (m.role, m.content)).collect(), n.trims))
}

#[test]
fn role_spellings_map_to_four_roles() {
    for (spelling, role) in [
        ("human", Some(Role::User)),
        ("USER", Some(Role::User)),
        ("gpt", Some(Role::Assistant)),
        ("chatgpt", Some(Role::Assistant)),
        ("bing", Some(Role::Assistant)),
        ("bard", Some(Role::Assistant)),
        ("model", Some(Role::Assistant)),
        (" Assistant ", Some(Role::Assistant)),
        ("system", Some(Role::System)),
        ("tool", Some(Role::Tool)),
        ("function", Some(Role::Tool)),
        ("narrator", None),
        ("", None),
    ] {
        assert_eq!(Role::from_source(spelling), role, "{spelling:?}");
    }
    let (msgs, trims) =
        roles_of(&[("system", "s"), ("human", "a"), ("bard", "b"), ("user", "c"), ("chatgpt", "d")]).unwrap();
    let roles: Vec<_> = msgs.iter().map(|m| m.0).collect();
    assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::User, Role::Assistant]);
    assert!(trims.is_empty());
}

#[test]
fn ids_default_to_the_record_position() {
    let n = normalize(raw(&[("human", "a"), ("gpt", "b")]), &NormalizeOptions::default()).unwrap();
    assert_eq!(n.conversation.id, "record-7");
}

#[test]
fn trims_and_cuts() {
    // Leading assistant turns are trimmed.
    let (msgs, trims) = roles_of(&[("gpt", "hello?"), ("human", "a"), ("gpt", "b")]).unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(trims, [TrimReason::LeadingNonUser]);
    // Trailing user turns are trimmed.
    let (msgs, trims) = roles_of(&[("human", "a"), ("gpt", "b"), ("human", "c")]).unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(trims, [TrimReason::TrailingNonAssistant]);
    // Consecutive same-role turns merge with a blank line.
    let (msgs, trims) = roles_of(&[("human", "a"), ("human", "a2"), ("gpt", "b"), ("gpt", "b2")]).unwrap();
    assert_eq!(msgs, [(Role::User, "a\n\na2".to_owned()), (Role::Assistant, "b\n\nb2".to_owned())]);
    assert_eq!(trims, [TrimReason::MergedSameRole]);
    // ... or cut the conversation under the cut policy.
    let cut = NormalizeOptions { same_role: SameRolePolicy::Cut, ..NormalizeOptions::default() };
    let n = normalize(raw(&[("human", "a"), ("gpt", "b"), ("gpt", "b2"), ("human", "c"), ("gpt", "d")]), &cut).unwrap();
    assert_eq!(n.conversation.messages.len(), 2);
    assert_eq!(n.trims, [TrimReason::SameRole]);
    // An unknown role cuts; the user turn left dangling goes with the cut.
    let (msgs, trims) =
        roles_of(&[("human", "a"), ("gpt", "b"), ("human", "c"), ("narrator", "x"), ("gpt", "d")]).unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(trims, [TrimReason::UnknownRole]);
    // Empty turns: a system turn is removed, others cut.
    let (msgs, trims) =
        roles_of(&[("system", "  "), ("human", "a"), ("gpt", "b"), ("human", ""), ("gpt", "c")]).unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(trims, [TrimReason::EmptySystem, TrimReason::EmptyContent]);
    // A system turn after the start cuts; leading ones join.
    let (msgs, trims) = roles_of(&[
        ("system", "s1"),
        ("system", "s2"),
        ("human", "a"),
        ("gpt", "b"),
        ("system", "late"),
        ("human", "c"),
        ("gpt", "d"),
    ])
    .unwrap();
    assert_eq!(msgs[0], (Role::System, "s1\n\ns2".to_owned()));
    assert_eq!(msgs.len(), 3);
    assert_eq!(trims, [TrimReason::MergedSystem, TrimReason::MisplacedSystem]);
    // Tool turns need an assistant turn before them.
    let (msgs, _) =
        roles_of(&[("human", "a"), ("gpt", "call"), ("tool", "result"), ("tool", "result2"), ("gpt", "b")]).unwrap();
    assert_eq!(msgs.len(), 5);
    let (msgs, trims) = roles_of(&[("human", "a"), ("gpt", "b"), ("human", "c"), ("tool", "r"), ("gpt", "d")]).unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(trims, [TrimReason::MisplacedTool]);
}

#[test]
fn drop_reasons() {
    let cases: [(&[(&str, &str)], DropReason); 6] = [
        (&[], DropReason::NoAssistantTurn),
        (&[("human", "a"), ("human", "b")], DropReason::NoAssistantTurn),
        (&[("gpt", "only answers")], DropReason::NoAssistantTurn),
        (&[("human", "a"), ("alien", "b"), ("gpt", "c")], DropReason::UnknownRole),
        (&[("human", "a"), ("gpt", " \n ")], DropReason::EmptyContent),
        (&[("human", "a"), ("tool", "r"), ("gpt", "c")], DropReason::MisplacedTool),
    ];
    let mut report = NormalizeReport::default();
    for (turns, want) in cases {
        let r = raw(turns);
        report.count_roles(&r);
        match normalize(r, &NormalizeOptions::default()) {
            Err(reason) => {
                assert_eq!(reason, want, "{turns:?}");
                report.drop(reason);
            }
            Ok(n) => panic!("{turns:?} kept as {n:?}"),
        }
    }
    assert_eq!(report.conversations, 6);
    assert_eq!(report.kept, 0);
    assert_eq!(report.dropped[&DropReason::NoAssistantTurn], 3);
    assert_eq!(report.source_roles["human"], 5);
    // Counts serialise with snake_case reason names.
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["dropped"]["no_assistant_turn"], 3);
    assert_eq!(json["dropped"]["unknown_role"], 1);
}

#[test]
fn inline_think_is_split_media_is_dropped_and_tool_call_turns_are_not_empty() {
    let out = roles_of(&[("user", "q"), ("assistant", "  <think>step 1\nstep 2</think>\n\nanswer")]);
    assert_eq!(out.unwrap().0[1], (Role::Assistant, "answer".to_string()));
    let n = normalize(raw(&[("user", "q"), ("assistant", "<think>r</think>a")]), &NormalizeOptions::default()).unwrap();
    assert_eq!(n.conversation.messages[1].reasoning_content.as_deref(), Some("r"));

    let mut media = raw(&[("user", "q"), ("assistant", "a")]);
    media.turns[0].has_media = true;
    assert_eq!(normalize(media, &NormalizeOptions::default()).unwrap_err(), DropReason::MediaContent);

    // An assistant turn with only tool calls is kept (its content is empty by nature).
    let mut calls = raw(&[("user", "q"), ("assistant", ""), ("tool", "result"), ("assistant", "done")]);
    calls.turns[1].tool_calls = vec![aerie_data::conversation::ToolCall {
        id: "functions.f:0".into(),
        name: "f".into(),
        arguments: serde_json::json!("{}"),
    }];
    let n = normalize(calls, &NormalizeOptions::default()).unwrap();
    assert_eq!(n.conversation.messages.len(), 4);
    assert_eq!(n.conversation.messages[1].tool_calls.len(), 1);
}
