//! The seam between the regeneration driver and whatever answers the turns: the driver submits
//! [`TurnJob`]s (one assistant turn each, the prompt already rendered), an engine answers them
//! in any order ([`TurnDone`]), and at most [`TurnEngine::capacity`] jobs are outstanding at once.
//!
//! Engines: [`NativeEngine`] (the native target, one sequence at a time, capacity 1) and
//! `super::server::ServerEngine` (a serving engine over HTTP, `--concurrency` requests in
//! flight). A batched native engine plugs in the same way with capacity = its batch size.

use std::collections::VecDeque;
use std::time::Instant;

use aerie_data::conversation::Message;
use aerie_model::TargetModel;
use burn::tensor::{DType, Tensor, backend::Backend};

use super::RegenerateReport;
use super::sampling::{Rng, sample};
use crate::Result;

/// Which in-flight conversation a job belongs to: the driver's slot index (< capacity).
pub(super) type JobKey = usize;

/// How the answer is drawn: greedy at temperature 0, else seeded temperature/top-p sampling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass; 1 = no cut.
    pub top_p: f32,
    /// The run's `--seed`; with the record position and turn it seeds the turn's stream
    /// ([`Rng::for_turn`]; servers get [`super::sampling::turn_seed`]).
    pub seed: u64,
}

/// One assistant turn to answer.
#[derive(Debug, Clone)]
pub(super) struct TurnJob {
    /// The driver's slot of the conversation.
    pub key: JobKey,
    /// The conversation's id (named in errors).
    pub conv_id: String,
    /// The record's position in the input.
    pub source_index: u64,
    /// Assistant turn number within the conversation (0-based).
    pub turn: u64,
    /// aerie's chat-template render of the history (the target's own earlier answers
    /// included) with `add_generation_prompt=true`, tokenised without added special tokens.
    pub prompt_ids: Vec<u32>,
    /// The same history as messages, for servers that render their own template.
    pub messages: Vec<Message>,
    /// The turn's budget: `--max-new-tokens`, or less where `--max-length` leaves less.
    pub max_new_tokens: usize,
    /// Sampling.
    pub sampling: Sampling,
}

/// Why a turn's decoding ended, as the engine saw it. The driver tells `max_length` from
/// `max_new_tokens` by the job's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finish {
    /// An eos / stop token (not part of the answer).
    Eos,
    /// The job's `max_new_tokens` ran out.
    Budget,
}

/// One answered turn.
#[derive(Debug, Clone)]
pub(super) struct TurnDone {
    /// The job's key.
    pub key: JobKey,
    /// The generated ids without the stopping eos, when the engine knows them (native, SGLang
    /// `output_ids`); the driver decodes them with aerie's tokenizer.
    pub ids: Option<Vec<u32>>,
    /// The answer text when the ids are unknown (OpenAI-compatible servers).
    pub text: Option<String>,
    /// The server's `reasoning_content`, when it split one off.
    pub reasoning: Option<String>,
    /// Why decoding ended.
    pub finish: Finish,
    /// Prompt tokens the engine fed.
    pub prompt_tokens: u64,
    /// Tokens generated (the stopping eos included).
    pub tokens: u64,
    /// Seconds up to the first generated token (0 where unknown).
    pub prefill_seconds: f64,
    /// Seconds from the first token to the last (0 where unknown).
    pub decode_seconds: f64,
    /// Tokens generated after the first (0 where unknown).
    pub decode_tokens: u64,
}

/// Answers submitted turns; completions come back in any order.
pub(super) trait TurnEngine {
    /// How many submitted jobs may be outstanding at once.
    fn capacity(&self) -> usize;
    /// Queue one job (the driver never exceeds [`Self::capacity`] outstanding jobs).
    fn submit(&mut self, job: TurnJob) -> Result<()>;
    /// Block until one submitted job finishes. `on_tokens(n)` may be called while waiting
    /// with `n` newly generated tokens (progress only; the totals are in [`TurnDone`]).
    fn next_done(&mut self, on_tokens: &mut dyn FnMut(u64)) -> Result<TurnDone>;
    /// Add what only the engine knows to the run's report, before it is written.
    fn finish_report(&self, _report: &mut RegenerateReport) {}
}

/// The native target, one sequence at a time: a job is decoded when [`TurnEngine::next_done`]
/// asks for it (greedy argmax, or [`sample`] on the host from the turn's own stream).
pub(super) struct NativeEngine<'a, B: Backend> {
    target: &'a TargetModel<B>,
    eos: &'a [u32],
    queue: VecDeque<TurnJob>,
}

impl<'a, B: Backend> NativeEngine<'a, B> {
    pub(super) fn new(target: &'a TargetModel<B>, eos: &'a [u32]) -> Self {
        Self { target, eos, queue: VecDeque::new() }
    }
}

impl<B: Backend> TurnEngine for NativeEngine<'_, B> {
    fn capacity(&self) -> usize {
        1
    }

    fn submit(&mut self, job: TurnJob) -> Result<()> {
        self.queue.push_back(job);
        Ok(())
    }

    fn next_done(&mut self, on_tokens: &mut dyn FnMut(u64)) -> Result<TurnDone> {
        let job = self.queue.pop_front().expect("the driver waits only on submitted jobs");
        let s = job.sampling;
        let greedy = s.temperature == 0.0;
        let mut rng = Rng::for_turn(s.seed, job.source_index, job.turn);
        let start = Instant::now();
        let mut first_token_at: Option<Instant> = None;
        let mut pick = |logits: Tensor<B, 1>| -> u32 {
            let token = if greedy {
                logits.argmax(0).into_data().iter::<i64>().next().expect("one id") as u32
            } else {
                let row: Vec<f32> = logits.cast(DType::F32).into_data().into_vec::<f32>().expect("f32 logits");
                sample(&row, s.temperature, s.top_p, &mut rng)
            };
            first_token_at.get_or_insert_with(Instant::now);
            on_tokens(1);
            token
        };
        let mut generated = self.target.generate_with(&job.prompt_ids, job.max_new_tokens, self.eos, &mut pick)?;
        let (prefill_seconds, decode_seconds) = match first_token_at {
            Some(t) => ((t - start).as_secs_f64(), t.elapsed().as_secs_f64()),
            None => (start.elapsed().as_secs_f64(), 0.0),
        };
        let tokens = generated.len() as u64;
        let finish = match generated.last() {
            Some(t) if self.eos.contains(t) => {
                generated.pop();
                Finish::Eos
            }
            _ => Finish::Budget,
        };
        Ok(TurnDone {
            key: job.key,
            ids: Some(generated),
            text: None,
            reasoning: None,
            finish,
            prompt_tokens: job.prompt_ids.len() as u64,
            tokens,
            prefill_seconds,
            decode_seconds,
            decode_tokens: tokens.saturating_sub(1),
        })
    }
}
