//! One pass of a prompt set through a running server: every conversation answered turn by turn
//! (a follow-up sees the engine's own earlier answer, as `eval decode` does with its own), every
//! answer streamed and timed, and the pass reduced to the decode rate a user would see.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use aerie_engine::meta::{Message, Request};

use crate::measure::{MeasureOptions, RequestResult, agent, run_pool, send};
use crate::prompts::Prompt;
use crate::{Error, Result};

/// One answer of a pass, in prompt-file order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The prompt's id.
    pub prompt: String,
    /// 0 for the first answer, 1 for the answer to the first follow-up, ...
    pub turn: usize,
    /// The request's outcome: text, tokens, timings.
    pub result: RequestResult,
}

/// What one pass measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PassTimings {
    /// Answers.
    pub answers: usize,
    /// Σ generated tokens.
    pub completion_tokens: u64,
    /// Σ tokens generated after each answer's first chunk.
    pub decode_tokens: u64,
    /// Σ time from each answer's first chunk to its last, s.
    pub decode_s: f64,
    /// decode_tokens / decode_s: the decode rate of one sequence.
    pub decode_tokens_per_s: f64,
    /// Mean time to the first token, ms.
    pub ttft_ms: f64,
    /// Wall time of the pass, s.
    pub wall_s: f64,
}

fn to_message(m: &aerie_data::conversation::Message) -> Message {
    Message { role: m.role.as_str().to_string(), content: m.content.clone() }
}

/// Answer every prompt (`concurrency` conversations at once, turns of one conversation in
/// order) against the server of `opts`; `progress(answers done)`. `check` is called when a
/// request fails, to put the engine's own state (it died) before the HTTP error.
pub fn run_pass(
    prompts: &[Prompt],
    opts: &MeasureOptions,
    progress: &(dyn Fn(usize) + Sync),
    check: &(dyn Fn() -> Result<()> + Sync),
) -> Result<(Vec<Answer>, PassTimings)> {
    let agent = agent(opts);
    let done = AtomicUsize::new(0);
    let start = std::time::Instant::now();
    let conversation = |p: &Prompt| -> Result<Vec<Answer>> {
        let mut messages: Vec<Message> = p.context.iter().map(to_message).collect();
        let mut out = Vec::with_capacity(p.turns());
        for turn in 0..p.turns() {
            if turn > 0 {
                messages.push(Message { role: "user".into(), content: p.follow_ups[turn - 1].clone() });
            }
            let r = send(&agent, &Request::Messages(messages.clone()), opts).map_err(|e| match check() {
                Err(dead) => dead,
                Ok(()) => Error::step(format!("prompt {} turn {}", p.id, turn + 1), e),
            })?;
            messages.push(Message { role: "assistant".into(), content: r.answer.clone() });
            out.push(Answer { prompt: p.id.clone(), turn, result: r });
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
        }
        Ok(out)
    };
    // Conversations in the pool, turns of one conversation in order within it.
    let answers: Vec<Answer> =
        run_pool(prompts, opts.concurrency, &conversation, &|_| {})?.into_iter().flatten().collect();
    let wall_s = start.elapsed().as_secs_f64();
    let timings = timings(&answers, wall_s);
    Ok((answers, timings))
}

/// Reduce a pass's answers (pure).
pub fn timings(answers: &[Answer], wall_s: f64) -> PassTimings {
    let decode_tokens: u64 = answers.iter().filter_map(|a| a.result.decode_tokens).sum();
    let decode_s: f64 = answers.iter().filter_map(|a| a.result.decode_s).sum();
    let ttft: Vec<f64> = answers.iter().filter_map(|a| a.result.ttft_s).collect();
    PassTimings {
        answers: answers.len(),
        completion_tokens: answers.iter().filter_map(|a| a.result.meta.completion_tokens).sum(),
        decode_tokens,
        decode_s,
        decode_tokens_per_s: if decode_s > 0.0 { decode_tokens as f64 / decode_s } else { 0.0 },
        ttft_ms: if ttft.is_empty() { 0.0 } else { 1000.0 * ttft.iter().sum::<f64>() / ttft.len() as f64 },
        wall_s,
    }
}

/// The first answer where two passes differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstDifference {
    /// The prompt's id.
    pub prompt: String,
    /// The turn (0-based).
    pub turn: usize,
    /// Character offset of the first differing character.
    pub at_char: usize,
    /// The plain answer from a little before that point.
    pub plain: String,
    /// The speculative answer from the same point.
    pub speculative: String,
}

/// How many answers of `spec` equal `plain` character for character, and the first that does
/// not. Greedy speculation must reproduce plain greedy decoding exactly (in f32).
pub fn compare_answers(plain: &[Answer], spec: &[Answer]) -> (usize, Option<FirstDifference>) {
    let mut identical = 0;
    let mut first = None;
    for (p, s) in plain.iter().zip(spec) {
        if p.result.answer == s.result.answer {
            identical += 1;
            continue;
        }
        if first.is_none() {
            let at = p.result.answer.chars().zip(s.result.answer.chars()).take_while(|(a, b)| a == b).count();
            let from = at.saturating_sub(20);
            let excerpt = |t: &str| t.chars().skip(from).take(80).collect::<String>();
            first = Some(FirstDifference {
                prompt: p.prompt.clone(),
                turn: p.turn,
                at_char: at,
                plain: excerpt(&p.result.answer),
                speculative: excerpt(&s.result.answer),
            });
        }
    }
    (identical, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(prompt: &str, text: &str, decode_s: f64, decode_tokens: u64) -> Answer {
        Answer {
            prompt: prompt.into(),
            turn: 0,
            result: RequestResult {
                answer: text.into(),
                decode_s: Some(decode_s),
                decode_tokens: Some(decode_tokens),
                ttft_s: Some(0.1),
                ..Default::default()
            },
        }
    }

    #[test]
    fn timings_are_token_weighted() {
        // 30 tokens in 1.5 s and 10 in 0.5 s: 40 / 2.0 = 20 tokens/s (not the mean of rates).
        let t = timings(&[answer("a", "", 1.5, 30), answer("b", "", 0.5, 10)], 3.0);
        assert_eq!(t.decode_tokens, 40);
        assert!((t.decode_tokens_per_s - 20.0).abs() < 1e-12);
        assert!((t.ttft_ms - 100.0).abs() < 1e-9);
    }

    #[test]
    fn the_first_difference_is_located() {
        let plain = [answer("1", "same", 1.0, 1), answer("2", "The cat sat on the mat.", 1.0, 1)];
        let spec = [answer("1", "same", 1.0, 1), answer("2", "The cat sat on a mat.", 1.0, 1)];
        let (n, d) = compare_answers(&plain, &spec);
        assert_eq!(n, 1);
        let d = d.unwrap();
        assert_eq!((d.prompt.as_str(), d.at_char), ("2", 15));
        assert!(d.plain.ends_with("the mat.") && d.speculative.ends_with("a mat."));
        assert_eq!(compare_answers(&plain, &plain), (2, None));
    }
}
