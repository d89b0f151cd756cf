//! One pass of a prompt set through a running server: every conversation answered turn by turn
//! (a follow-up sees the engine's own earlier answer, as `eval decode` does with its own), every
//! answer streamed and timed, and the pass reduced to the decode rate a user would see.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use aerie_engine::counters::{SETTLE_WAIT, SpecCounters, settled_vllm_counters};
use aerie_engine::meta::{Message, Request, SpecMeta};

use crate::engine_acceptance::{RunAcceptance, sglang_histogram};
use crate::measure::{MeasureOptions, RequestResult, TimedCycles, agent, run_pool, send, timed_cycles};
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

/// [`super::Prediction::counted`] of aerie's decoder (`--predict`).
pub const COUNTED_ALL: &str = "all accepted drafts, as the engine counts them";
/// [`super::Prediction::counted`] of the cycle walk (`--predict-from`).
pub const COUNTED_WITHIN_ANSWERS: &str = "accepted drafts within the answers (the walk sees no draft past an \
answer's stop token or budget); the engine's τ counted alike: 1 + accepted_within_answers / drafts";
/// [`super::Prediction::counted`] of the cycle walk where the engine's count within the answers could not
/// be told (one count for the run, with tokens cut at the answers' ends).
pub const COUNTED_WITHIN_ANSWERS_AGAINST_ALL: &str = "accepted drafts within the answers (the walk sees no draft \
past an answer's stop token or budget); the engine's count within the answers could not be told (one count for \
the run, tokens cut at the ends), so tau_difference is against its τ of all accepted drafts, which also counts \
drafts past the answers' ends (at most k − 1 per answer)";

/// The accepted drafts that are answer tokens ([`super::ServeRun::accepted_within_answers`]): per answer
/// min(accepted, tokens − cycles) where every speculative answer carries its own counts (SGLang),
/// else from the run's `cycles` and `accepted` (vLLM) when nothing was cut (Σ tokens − answers −
/// cycles = accepted). `None` when a count is missing or that cannot be told.
pub fn accepted_within_answers(answers: &[Answer], cycles: u64, accepted: u64) -> Option<u64> {
    let metas = answers.iter().map(|a| &a.result.meta);
    let own = |m: &aerie_engine::meta::SpecMeta| {
        let n = m.completion_tokens?;
        match (m.verify_ct, m.accepted_drafts) {
            (Some(c), Some(a)) => Some(a.min(n.checked_sub(c)?)),
            (None, _) if n <= 1 => Some(0),
            _ => None,
        }
    };
    if let Some(per_answer) = metas.clone().map(own).sum::<Option<u64>>() {
        return Some(per_answer);
    }
    let tokens: u64 = metas.map(|m| m.completion_tokens.map(|n| n.saturating_sub(1))).sum::<Option<u64>>()?;
    (tokens.checked_sub(cycles)? == accepted).then_some(accepted)
}

/// The engine's acceptance over one speculative pass at `k`: vLLM's counters settled after the
/// pass less their reading `before` it, or, without one (SGLang), every speculative answer's
/// accepted-drafts histogram, checked against its raw counts ([`sglang_histogram`]: refused
/// naming the server and the field, never skipped or cut).
pub fn pass_acceptance(
    label: &str,
    k: usize,
    before: Option<SpecCounters>,
    base_url: &str,
    answers: &[Answer],
    warnings: &mut Vec<String>,
) -> Result<RunAcceptance> {
    if let Some(before) = before {
        let settled = settled_vllm_counters(base_url, SETTLE_WAIT)?;
        warnings.extend(settled.warning.map(|w| format!("{label}: {w}")));
        return RunAcceptance::between(&before, &settled.counters, k);
    }
    let metas: Vec<&SpecMeta> = answers.iter().map(|a| &a.result.meta).collect();
    let hist = sglang_histogram(&metas, Some(k), base_url, true)?.unwrap_or_else(|| vec![0; k + 1]);
    RunAcceptance::from_histogram(&hist)
}

/// The decode time and the cycles of the same answers of a speculative pass
/// ([`timed_cycles`]): each answer's own count (SGLang, `run_cycles` `None`), or the engine's one
/// count for the run (vLLM), which every answer must then qualify for (else an error naming
/// `label`). Answers left out of both are a warning.
pub fn pass_cycle(
    label: &str,
    answers: &[Answer],
    run_cycles: Option<u64>,
    warnings: &mut Vec<String>,
) -> Result<TimedCycles> {
    let results: Vec<&RequestResult> = answers.iter().map(|a| &a.result).collect();
    let t = timed_cycles(&results, run_cycles)
        .map_err(|why| Error::Incompatible(format!("{label}: no cycle time can be measured: {why}")))?;
    if t.left_out > 0 {
        warnings.push(format!(
            "{label}: cycle time over {} of {} answers: {} left out of both its time and its cycles",
            t.responses,
            results.len(),
            t.left_out
        ));
    }
    Ok(t)
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

    /// Issue 44 §2.3: the engine's accepted drafts within the answers (what the cycle walk counts)
    /// from its own counts, against what it counts in all.
    #[test]
    fn the_engines_accepted_drafts_within_the_answers() {
        let answer = |completion: Option<u64>, cycles: Option<u64>, accepted: Option<u64>| Answer {
            prompt: "p".into(),
            turn: 0,
            result: RequestResult {
                meta: aerie_engine::meta::SpecMeta {
                    completion_tokens: completion,
                    verify_ct: cycles,
                    accepted_drafts: accepted,
                    ..Default::default()
                },
                ..Default::default()
            },
        };
        // SGLang, per answer. 16 tokens, 6 cycles accepting 9: 1 + 6 + 9 = 16, nothing cut: 9.
        // 5 tokens, 2 cycles accepting 5 (k = 3: the last cycle accepted 3 drafts where 2 tokens
        // were left): the answer holds 5 − 2 = 3 of them; the engine counts 5.
        let per_answer = [answer(Some(16), Some(6), Some(9)), answer(Some(5), Some(2), Some(5))];
        assert_eq!(accepted_within_answers(&per_answer, 8, 14), Some(12));
        // A one-token answer has no cycle and no count.
        let one = [per_answer[0].clone(), answer(Some(1), None, None)];
        assert_eq!(accepted_within_answers(&one, 6, 9), Some(9));
        // vLLM, one count for the run: exact when nothing was cut (22 − 2 − 10 = 10 = accepted),
        // unknown otherwise (which answers' last cycles were cut is not counted).
        let run = [answer(Some(16), None, None), answer(Some(6), None, None)];
        assert_eq!(accepted_within_answers(&run, 10, 10), Some(10));
        assert_eq!(accepted_within_answers(&run, 8, 14), None);
        assert_eq!(accepted_within_answers(&[answer(None, None, None)], 8, 10), None, "a count missing");
        // SGLang 0.5.23's four answers of serve_sglang.rs (32 tokens each; cycles / accepted 26 / 6,
        // 23 / 8, 25 / 7, 20 / 11, recorded 2026-12-05): every accepted draft is an answer token,
        // 32. Two answers had only their bonus token cut (1 + 26 + 6 = 33), so tokens − prefill −
        // cycles (128 − 4 − 94 = 30, the first version of this count) says 2 too few.
        let recorded: Vec<Answer> =
            [(26, 6), (23, 8), (25, 7), (20, 11)].iter().map(|&(c, a)| answer(Some(32), Some(c), Some(a))).collect();
        assert_eq!(accepted_within_answers(&recorded, 94, 32), Some(32));
    }
}
