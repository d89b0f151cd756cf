//! The JSON shape of one conversation record, shared by the ShareGPT-array and JSONL readers:
//! a `conversations` (ShareGPT) or `messages` (OpenAI) list of `{from, value}` or
//! `{role, content}` turns, and an optional `id` (string or number); or MT-Bench's prompt-only
//! `{"question_id", "turns": ["...", ...]}`, read as user turns with no answers (which
//! `aerie data prepare` drops as `no_assistant_turn` and `aerie regenerate` answers). Unknown keys
//! are ignored.
//! Content may be a string, `null` (empty) or a list of OpenAI content parts, whose `text`
//! parts are concatenated.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::conversation::{GeneratedIds, RawConversation, RawTurn, ToolCall};

#[derive(Deserialize)]
struct RecordDe {
    #[serde(default)]
    id: Option<Id>,
    #[serde(default)]
    conversations: Option<Vec<TurnDe>>,
    #[serde(default)]
    messages: Option<Vec<TurnDe>>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    /// MT-Bench: the user turns of a prompt-only record.
    #[serde(default)]
    turns: Option<Vec<String>>,
    /// MT-Bench's id.
    #[serde(default)]
    question_id: Option<Id>,
}

#[derive(Deserialize)]
struct TurnDe {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    value: Option<Content>,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default, alias = "reasoning")]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDe>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    /// A regenerated turn's engine ids (`aerie regenerate`).
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    finish_reason: Option<String>,
}

/// OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`; a flat
/// `{"id", "name", "arguments"}` is accepted too.
#[derive(Deserialize)]
struct ToolCallDe {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDe>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct FunctionDe {
    name: String,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
}

impl ToolCallDe {
    fn into_call(self) -> ToolCall {
        let (name, arguments) = match self.function {
            Some(f) => (f.name, f.arguments),
            None => (self.name.unwrap_or_default(), self.arguments),
        };
        ToolCall { id: self.id.unwrap_or_default(), name, arguments: arguments.unwrap_or(serde_json::Value::Null) }
    }
}

/// A `tool_calls` list given as JSON (a parquet column's value), read as the JSON readers read
/// a turn's `tool_calls`.
pub(crate) fn tool_calls_from_json(value: serde_json::Value) -> Result<Vec<ToolCall>, serde_json::Error> {
    let calls: Option<Vec<ToolCallDe>> = serde_json::from_value(value)?;
    Ok(calls.unwrap_or_default().into_iter().map(ToolCallDe::into_call).collect())
}

/// Why a record could not be parsed.
#[derive(Debug)]
pub(crate) enum RecordError {
    /// Not JSON, or not of the record's shape (serde's message has the line/column inside the
    /// record).
    Json(serde_json::Error),
    /// Neither list is present.
    NoTurns,
}

impl RecordError {
    /// Whether the JSON simply ends too early (a cut file).
    pub(crate) fn is_eof(&self) -> bool {
        matches!(self, RecordError::Json(e) if e.is_eof())
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Json(e) => write!(f, "{e}"),
            RecordError::NoTurns => f.write_str("no `conversations`, `messages` or `turns` list"),
        }
    }
}

/// Parse one record from JSON bytes.
pub(crate) fn parse_record(bytes: &[u8], index: u64) -> Result<RawConversation, RecordError> {
    let rec: RecordDe = serde_json::from_slice(bytes).map_err(RecordError::Json)?;
    let turns = match (rec.conversations, rec.messages, rec.turns) {
        (Some(t), _, _) | (None, Some(t), _) => t,
        (None, None, Some(prompts)) => prompts
            .into_iter()
            .map(|p| TurnDe {
                from: None,
                role: Some("user".into()),
                value: None,
                content: Some(Content(p, false)),
                reasoning_content: None,
                tool_calls: None,
                tool_call_id: None,
                name: None,
                token_ids: None,
                finish_reason: None,
            })
            .collect(),
        (None, None, None) => return Err(RecordError::NoTurns),
    };
    Ok(RawConversation {
        id: rec.id.or(rec.question_id).map(|i| i.0),
        index,
        turns: turns
            .into_iter()
            .map(|t| {
                let content = t.value.or(t.content).unwrap_or_default();
                RawTurn {
                    role: t.from.or(t.role).unwrap_or_default(),
                    content: content.0,
                    has_media: content.1,
                    reasoning_content: t.reasoning_content,
                    tool_calls: t.tool_calls.unwrap_or_default().into_iter().map(ToolCallDe::into_call).collect(),
                    tool_call_id: t.tool_call_id,
                    name: t.name,
                    generated: t
                        .token_ids
                        .map(|token_ids| GeneratedIds { token_ids, cut: t.finish_reason.as_deref() == Some("length") }),
                }
            })
            .collect(),
        tools: rec.tools.filter(|t| !t.is_null()),
    })
}

/// An id: a JSON string or number, kept as text.
struct Id(String);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Id;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or number id")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Id, E> {
                Ok(Id(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Id, E> {
                Ok(Id(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id, E> {
                Ok(Id(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id, E> {
                Ok(Id(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Id, E> {
                Ok(Id(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Turn content: a string, `null`, or a list of content parts (`{"type": "text", "text": ..}`
/// or plain strings), concatenated.
#[derive(Default)]
struct Content(String, bool);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, null, or a list of content parts")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content(v.to_owned(), false))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Content, E> {
                Ok(Content(v, false))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content(String::new(), false))
            }
            fn visit_none<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content(String::new(), false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut text = String::new();
                let mut media = false;
                while let Some(part) = seq.next_element::<Part>()? {
                    text.push_str(&part.0);
                    media |= part.1;
                }
                Ok(Content(text, media))
            }
        }
        d.deserialize_any(V)
    }
}

/// One content part: its text (nothing for other parts), and whether it is media (`type`
/// image, image_url, video, video_url, audio, input_audio).
struct Part(String, bool);

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Part;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a content part")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Part, E> {
                Ok(Part(v.to_owned(), false))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part, A::Error> {
                let mut text = None;
                let mut media = false;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "text" {
                        text = map.next_value::<Option<String>>()?;
                    } else if key == "type" {
                        let t = map.next_value::<Option<String>>()?.unwrap_or_default();
                        media |= matches!(
                            t.as_str(),
                            "image" | "image_url" | "video" | "video_url" | "audio" | "input_audio"
                        );
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Part(text.unwrap_or_default(), media))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_dialects_and_content_shapes() {
        let r = parse_record(
            br#"{"id": 7, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, "b"]}, {"role": "assistant", "content": null}]}"#,
            3,
        )
        .unwrap();
        assert_eq!(r.id.as_deref(), Some("7"));
        assert_eq!(r.turns[0].content, "ab");
        assert_eq!(r.turns[1].content, "");
        let r = parse_record(br#"{"conversations": [{"from": "gpt", "value": "x", "extra": 1}]}"#, 0).unwrap();
        assert_eq!((r.id, r.turns[0].role.as_str()), (None, "gpt"));
        assert!(parse_record(br#"{"id": "x"}"#, 0).unwrap_err().to_string().contains("conversations"));
        assert!(parse_record(br#"{"conversations": [{"#, 0).unwrap_err().is_eof());
        assert!(parse_record(br#"{"conversations": 5}"#, 0).is_err());
    }

    #[test]
    fn mt_bench_prompts_are_user_turns() {
        let r = parse_record(br#"{"question_id": 81, "category": "writing", "turns": ["a", "b"]}"#, 3).unwrap();
        assert_eq!(r.id.as_deref(), Some("81"));
        assert_eq!(
            r.turns.iter().map(|t| (t.role.as_str(), t.content.as_str())).collect::<Vec<_>>(),
            [("user", "a"), ("user", "b")]
        );
        assert!(matches!(parse_record(br#"{"x": 1}"#, 0), Err(RecordError::NoTurns)));
    }

    #[test]
    fn openai_messages_with_reasoning_tool_calls_tools_and_media() {
        let r = parse_record(
            br#"{"tools": [{"type": "function"}], "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "q"}]},
                {"role": "assistant", "content": null, "reasoning_content": "r",
                 "tool_calls": [{"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "functions.f:0", "name": "f", "content": "ok"}]}"#,
            0,
        )
        .unwrap();
        assert_eq!(r.tools, Some(serde_json::json!([{"type": "function"}])));
        assert!(r.turns[0].has_media && r.turns[0].content == "q");
        assert_eq!(r.turns[1].reasoning_content.as_deref(), Some("r"));
        assert_eq!(r.turns[1].tool_calls[0].id, "functions.f:0");
        assert_eq!(r.turns[1].tool_calls[0].name, "f");
        assert_eq!(r.turns[1].tool_calls[0].arguments, serde_json::json!("{}"));
        assert_eq!(
            (r.turns[2].tool_call_id.as_deref(), r.turns[2].name.as_deref()),
            (Some("functions.f:0"), Some("f"))
        );
    }
}
