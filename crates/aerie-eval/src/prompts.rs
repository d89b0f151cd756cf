//! Prompt files for decoding benchmarks, one JSON object per line:
//! - MT-Bench (`question.jsonl` of FastChat): `{"question_id": 81, "category": "writing",
//!   "turns": ["...", "..."]}`: each turn a user message; later turns follow the model's own
//!   earlier answers;
//! - `{"prompt": "..."}` (or `{"text": "..."}`): one user message;
//! - `{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}`: a fixed
//!   context ending with a user message, answered once.
//!
//! An `id` (or `question_id`) names the prompt in reports; the line number otherwise.
//!
//! This is the one prompt reader: `eval decode`, `eval serve` (every turn, each follow-up seeing
//! the model's own earlier answer), `bench generate` and `measure` (each conversation's first
//! turn only: its requests are independent, [`Prompt::first_request`]) all read through it, and
//! all take the first N with [`select`].

use std::path::Path;

use aerie_data::conversation::{Message, Role};
use serde_json::Value;

use crate::{Error, Result};

/// One prompt of a prompt file.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// `id` / `question_id`, or the 1-based line number.
    pub id: String,
    /// MT-Bench category when given.
    pub category: Option<String>,
    /// Messages before the first answer (system prompt and first user turn, or a fixed context).
    pub context: Vec<Message>,
    /// User turns after the first answer, each answered in turn (MT-Bench's second turn).
    pub follow_ups: Vec<String>,
}

impl Prompt {
    /// Number of answers this prompt asks for.
    pub fn turns(&self) -> usize {
        1 + self.follow_ups.len()
    }

    /// The first turn as one request (what `measure` sends): raw text when the context is one
    /// user message (so `/generate` can take it), else the messages.
    pub fn first_request(&self) -> aerie_engine::meta::Request {
        use aerie_engine::meta::{Message as Wire, Request};
        match self.context.as_slice() {
            [m] if m.role == Role::User => Request::Text(m.content.clone()),
            msgs => Request::Messages(
                msgs.iter().map(|m| Wire { role: m.role.as_str().to_string(), content: m.content.clone() }).collect(),
            ),
        }
    }
}

/// The first `max` prompts (all without `max`), the same set for every pass of a command (an
/// engine's and aerie's own prediction). `--max-prompts 0` is refused: it would select nothing.
pub fn select(mut prompts: Vec<Prompt>, max: Option<usize>) -> Result<Vec<Prompt>> {
    match max {
        Some(0) => Err(Error::Incompatible(
            "--max-prompts 0 selects no prompt: give at least 1, or leave it out for all".into(),
        )),
        Some(n) => {
            prompts.truncate(n);
            Ok(prompts)
        }
        None => Ok(prompts),
    }
}

fn bad(path: &Path, line: usize, message: impl std::fmt::Display) -> Error {
    Error::Input { path: path.to_owned(), message: format!("line {line}: {message}") }
}

/// Read a prompt file; every malformed line is an error naming the file and line.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    // At most one byte past the limit: `/dev/zero` or a FIFO as the prompt file is an error, not
    // a buffer growing until the machine kills the process.
    let io = |e| Error::Io { path: path.to_owned(), source: e };
    let cap = aerie_data::limits::MAX_RECORD_BYTES;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(std::fs::File::open(path).map_err(io)?, cap + 1), &mut text)
        .map_err(io)?;
    if text.len() as u64 > cap {
        return Err(Error::Input {
            path: path.to_owned(),
            message: format!("a prompt file is at most {cap} bytes; this one is longer (is it a JSON Lines file?)"),
        });
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| bad(path, n, format!("not valid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| bad(path, n, "expected a JSON object"))?;
        let id = match obj.get("id").or_else(|| obj.get("question_id")) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(x)) => x.to_string(),
            _ => n.to_string(),
        };
        let category = obj.get("category").and_then(Value::as_str).map(str::to_owned);
        let (context, follow_ups) = if let Some(turns) = obj.get("turns") {
            let turns: Vec<String> = turns
                .as_array()
                .ok_or_else(|| bad(path, n, "`turns` must be a list of strings"))?
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(path, n, "`turns` must be a list of strings"))?;
            let Some((first, rest)) = turns.split_first() else {
                return Err(bad(path, n, "`turns` is empty"));
            };
            (vec![Message::new(Role::User, first.clone())], rest.to_vec())
        } else if let Some((key, p)) = obj.get("prompt").map(|p| ("prompt", p)).or(obj.get("text").map(|p| ("text", p)))
        {
            let p = p.as_str().ok_or_else(|| bad(path, n, format!("`{key}` must be a string")))?;
            (vec![Message::new(Role::User, p)], Vec::new())
        } else if let Some(msgs) = obj.get("messages") {
            let msgs = msgs.as_array().ok_or_else(|| bad(path, n, "`messages` must be a list"))?;
            let mut context = Vec::with_capacity(msgs.len());
            for m in msgs {
                let role = m
                    .get("role")
                    .and_then(Value::as_str)
                    .and_then(Role::from_source)
                    .ok_or_else(|| bad(path, n, "every message needs a known `role` (system, user, assistant)"))?;
                let content = m
                    .get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(path, n, "every message needs a string `content`"))?;
                context.push(Message::new(role, content));
            }
            if context.last().is_none_or(|m| m.role != Role::User) {
                return Err(bad(path, n, "`messages` must end with a user message (the one to answer)"));
            }
            (context, Vec::new())
        } else {
            return Err(bad(path, n, "expected `turns` (MT-Bench), `prompt` or `messages`"));
        };
        out.push(Prompt { id, category, context, follow_ups });
    }
    if out.is_empty() {
        return Err(Error::Input { path: path.to_owned(), message: "holds no prompts".into() });
    }
    Ok(out)
}

/// The words of the long passage [`long_context`] puts before each prompt by default: about
/// 2,700 tokens of English, long beside MT-Bench's tens yet inside a 4,096-token context with
/// room for the answer.
pub const LONG_CONTEXT_WORDS: usize = 2000;

/// The prompts with a long context (the surface's `long` prompts, [`crate::surface::Context`]):
/// each first user message behind a passage of `words` words, the prompt file's own first turns
/// one after another, repeated as needed (deterministic, no data of its own, the same for every
/// engine and run). Only the prompt length changes: the question and later turns are the same.
pub fn long_context(prompts: &[Prompt], words: usize) -> Vec<Prompt> {
    let source: Vec<&str> = prompts
        .iter()
        .flat_map(|p| p.context.iter().filter(|m| m.role == Role::User))
        .flat_map(|m| m.content.split_whitespace())
        .collect();
    let passage = if source.is_empty() {
        String::new()
    } else {
        source.iter().cycle().take(words).copied().collect::<Vec<_>>().join(" ")
    };
    prompts
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if let Some(m) = p.context.iter_mut().find(|m| m.role == Role::User) {
                m.content = format!(
                    "Here is a document.\n\n{passage}\n\nThe document ends here. Now answer this:\n\n{}",
                    m.content
                );
            }
            p
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_prompt_file_without_end_is_refused_not_read_for_ever() {
        let e = read_prompts(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("at most 268435456 bytes"), "{e}");
    }

    fn read(text: &str) -> Result<Vec<Prompt>> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        std::fs::write(&p, text).unwrap();
        read_prompts(&p)
    }

    #[test]
    fn all_three_shapes() {
        let got = read(concat!(
            r#"{"question_id": 81, "category": "writing", "turns": ["a", "b"]}"#,
            "\n\n",
            r#"{"prompt": "hi"}"#,
            "\n",
            r#"{"id": "x", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}"#,
            "\n"
        ))
        .unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].id.as_str(), got[0].turns()), ("81", 2));
        assert_eq!(got[0].follow_ups, vec!["b".to_string()]);
        assert_eq!(got[1].id, "3");
        assert_eq!(got[2].context.len(), 2);
        assert_eq!(got[2].context[0].role, Role::System);
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = read("{\"prompt\": \"a\"}\n{\"turns\": []}\n").unwrap_err().to_string();
        assert!(e.contains("p.jsonl: line 2") && e.contains("empty"), "{e}");
        let e = read("{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("end with a user message"), "{e}");
        let e = read("not json\n").unwrap_err().to_string();
        assert!(e.contains("p.jsonl: line 1") && e.contains("JSON"), "{e}");
        assert!(read("\n").unwrap_err().to_string().contains("no prompts"));
    }

    /// Issue 34 §2: `--max-prompts 0` ran one prompt in the engine (`max(1)`) and none in the
    /// prediction; one selection now serves both, and refuses 0.
    #[test]
    fn one_selection_refuses_zero_and_first_turns_are_requests() {
        let all = read("{\"turns\": [\"a\", \"b\"]}\n{\"text\": \"c\"}\n").unwrap();
        assert!(select(all.clone(), Some(0)).unwrap_err().to_string().contains("--max-prompts 0"));
        assert_eq!(select(all.clone(), Some(1)).unwrap().len(), 1);
        assert_eq!(select(all.clone(), None).unwrap().len(), 2);
        assert_eq!(all[0].first_request(), aerie_engine::meta::Request::Text("a".into()));
        assert_eq!(all[1].first_request(), aerie_engine::meta::Request::Text("c".into()));
    }

    #[test]
    fn long_context_puts_the_same_passage_before_each_question() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        std::fs::write(&path, "{\"prompt\": \"one two three\"}\n{\"turns\": [\"four five\", \"six\"]}\n").unwrap();
        let short = read_prompts(&path).unwrap();
        let long = long_context(&short, 7);
        let first = &long[0].context[0].content;
        assert!(first.contains("one two three four five one two") && first.ends_with("one two three"), "{first}");
        assert!(long[1].context[0].content.ends_with("four five"));
        assert_eq!(long[1].follow_ups, short[1].follow_ups, "later turns unchanged");
    }
}
