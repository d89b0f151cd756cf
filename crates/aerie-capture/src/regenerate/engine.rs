//! The seam between the regeneration driver and whatever answers the turns: the driver submits
//! [`TurnJob`]s (one assistant turn each, the prompt already rendered), an engine answers them
//! in any order ([`TurnDone`]), and at most [`TurnEngine::capacity`] jobs are outstanding at once.
//!
//! Engines: [`NativeEngine`] (the native target, continuously batched, capacity = the batch
//! size) and `super::server::ServerEngine` (a serving engine over HTTP, `--concurrency`
//! requests in flight).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use aerie_data::conversation::Message;
use aerie_model::TargetModel;
use aerie_model::native::batch::{BatchGenerator, GenerationRequest, greedy, host_rows};
use burn::tensor::{Tensor, backend::Backend};

use super::RegenerateReport;
use super::sampling::{Rng, Sampling, sample};
use crate::Result;

/// Which in-flight conversation a job belongs to: the driver's slot index (< capacity).
pub(super) type JobKey = usize;

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
    /// The conversation's tool declarations (OpenAI function schemas), rendered into the
    /// prompt as the template declares them and sent to servers that render their own.
    pub tools: Option<serde_json::Value>,
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

/// The native target, continuously batched: up to `batch` turns decode at once
/// ([`BatchGenerator`]), each picked greedily or by [`sample`] on the host from its own stream
/// (seed, record, turn), so a turn's answer does not depend on the rows beside it.
pub(super) struct NativeEngine<'a, B: Backend> {
    generator: BatchGenerator<'a, B>,
    eos: &'a [u32],
    batch: usize,
    /// The jobs in flight by generation id: the job, its sampling stream, its share of the
    /// decode steps' time.
    jobs: HashMap<u64, (TurnJob, Rng, f64)>,
    next_id: u64,
    done: VecDeque<TurnDone>,
}

impl<'a, B: Backend> NativeEngine<'a, B> {
    pub(super) fn new(target: &'a TargetModel<B>, eos: &'a [u32], batch: usize) -> Result<Self> {
        Ok(Self {
            generator: BatchGenerator::new(target, batch, eos)?,
            eos,
            batch,
            jobs: HashMap::new(),
            next_id: 0,
            done: VecDeque::new(),
        })
    }

    /// One step of the batch; finished turns go to `self.done`.
    fn step(&mut self, on_tokens: &mut dyn FnMut(u64)) -> Result<()> {
        let jobs = &mut self.jobs;
        let start = Instant::now();
        let prefill_before = self.generator.prefill_seconds();
        let mut picked = 0u64;
        let mut pick = |ids: &[u64], logits: Tensor<B, 2>| -> aerie_model::Result<Vec<u32>> {
            picked += ids.len() as u64;
            let s = jobs[&ids[0]].0.sampling;
            if s.is_greedy() {
                return greedy(ids, logits);
            }
            let rows = host_rows(logits)?;
            Ok(ids
                .iter()
                .zip(&rows)
                .map(|(id, row)| {
                    let (job, rng, _) = jobs.get_mut(id).expect("a job per sequence");
                    sample(row, job.sampling.temperature, job.sampling.top_p, rng)
                })
                .collect())
        };
        let finished = self.generator.step(&mut pick)?;
        on_tokens(picked);
        // The step's decode time (its prefills aside) is shared by the rows that decoded.
        let decode = (start.elapsed().as_secs_f64() - (self.generator.prefill_seconds() - prefill_before)).max(0.0);
        let rows = self.generator.active() + finished.len();
        if rows > 0 {
            for (_, _, t) in self.jobs.values_mut() {
                *t += decode / rows as f64;
            }
        }
        for g in finished {
            let (job, _, decode_seconds) = self.jobs.remove(&g.id).expect("a job per sequence");
            let mut ids = g.tokens;
            let tokens = ids.len() as u64;
            let finish = match ids.last() {
                Some(t) if self.eos.contains(t) => {
                    ids.pop();
                    Finish::Eos
                }
                _ => Finish::Budget,
            };
            self.done.push_back(TurnDone {
                key: job.key,
                ids: Some(ids),
                text: None,
                reasoning: None,
                finish,
                prompt_tokens: job.prompt_ids.len() as u64,
                tokens,
                prefill_seconds: g.prefill_seconds,
                decode_seconds,
                decode_tokens: tokens.saturating_sub(1),
            });
        }
        Ok(())
    }
}

impl<B: Backend> TurnEngine for NativeEngine<'_, B> {
    fn capacity(&self) -> usize {
        self.batch
    }

    fn submit(&mut self, job: TurnJob) -> Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        let request = GenerationRequest { id, prompt: job.prompt_ids.clone(), max_new_tokens: job.max_new_tokens };
        self.generator.push(request)?;
        let rng = Rng::for_turn(job.sampling.seed, job.source_index, job.turn);
        self.jobs.insert(id, (job, rng, 0.0));
        Ok(())
    }

    fn next_done(&mut self, on_tokens: &mut dyn FnMut(u64)) -> Result<TurnDone> {
        while self.done.is_empty() {
            assert!(!self.generator.is_idle(), "the driver waits only on submitted jobs");
            self.step(on_tokens)?;
        }
        Ok(self.done.pop_front().expect("checked"))
    }
}
