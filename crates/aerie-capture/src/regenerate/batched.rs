//! Regeneration of a chunk of conversations at once on the native target: every conversation's
//! next assistant turn is a sequence of one continuously batched [`BatchGenerator`], and a
//! conversation's following turn is queued as soon as its answer is known, so the batch stays
//! full across turns. Results come back in the chunk's (source) order.
//!
//! Sampling draws each turn from its own stream (seed, record, turn), whatever row it runs in,
//! so what a conversation gets does not depend on its neighbours in the batch.

use std::collections::HashMap;
use std::time::Instant;

use aerie_data::conversation::{Message, Role};
use aerie_model::native::batch::{BatchGenerator, GenerationRequest, greedy, host_rows};
use burn::tensor::{Tensor, backend::Backend};

use super::RegenerateReport;
use super::generate::{DecodeClock, Prompt, Regenerated, Turn, TurnGenerator};
use super::sampling::{Rng, sample};
use crate::Result;

/// A conversation of the chunk, before regeneration.
pub(super) struct Pending {
    /// Its id.
    pub conv_id: String,
    /// Its position in the input.
    pub source_index: u64,
    /// Its normalised messages.
    pub messages: Vec<Message>,
}

/// Where one conversation stands.
struct State {
    /// Messages not yet consumed (the next assistant turn and everything after it).
    rest: std::vec::IntoIter<Message>,
    answered: Vec<Message>,
    turn: u64,
    kept_turns: u64,
    stop_reason: Option<&'static str>,
    /// The token budget of the turn in flight.
    budget: usize,
}

impl<B: Backend> TurnGenerator<'_, B> {
    /// Regenerate `chunk` with up to `batch` sequences decoding at once; `on_token(report)`
    /// after every decode step.
    pub(super) fn chunk(
        &self,
        chunk: Vec<Pending>,
        batch: usize,
        report: &mut RegenerateReport,
        clock: &mut DecodeClock,
        on_token: &mut dyn FnMut(&RegenerateReport),
    ) -> Result<Vec<Regenerated>> {
        let mut generator = BatchGenerator::new(self.target, batch, self.eos)?;
        let mut states: Vec<State> = Vec::with_capacity(chunk.len());
        let mut ids = Vec::with_capacity(chunk.len());
        for p in chunk {
            ids.push((p.conv_id, p.source_index));
            states.push(State {
                rest: p.messages.into_iter(),
                answered: Vec::new(),
                turn: 0,
                kept_turns: 0,
                stop_reason: None,
                budget: 0,
            });
        }
        let mut rngs: HashMap<u64, Rng> = HashMap::new();
        for i in 0..states.len() {
            self.next_turn(i, &ids[i], &mut states[i], &mut generator, &mut rngs, report)?;
        }
        let greedy_run = self.opts.temperature == 0.0;
        let (temperature, top_p) = (self.opts.temperature, self.opts.top_p);
        let start = Instant::now();
        let mut prefill = 0.0;
        let mut turns = 0u64;
        let mut tokens = 0u64;
        while !generator.is_idle() {
            let finished = {
                let mut pick = |rows: &[u64], logits: Tensor<B, 2>| -> aerie_model::Result<Vec<u32>> {
                    let picked = if greedy_run {
                        greedy(rows, logits)?
                    } else {
                        let host = host_rows(logits)?;
                        rows.iter()
                            .zip(&host)
                            .map(|(id, row)| {
                                sample(row, temperature, top_p, rngs.get_mut(id).expect("a stream per turn"))
                            })
                            .collect()
                    };
                    report.tokens_generated += picked.len() as u64;
                    Ok(picked)
                };
                let finished = generator.step(&mut pick)?;
                on_token(report);
                finished
            };
            for g in finished {
                let i = g.id as usize;
                rngs.remove(&g.id);
                prefill += g.prefill_seconds;
                report.prefill_seconds += g.prefill_seconds;
                turns += 1;
                tokens += g.tokens.len() as u64;
                let st = &mut states[i];
                match self.answer(&g.tokens, st.budget, report)? {
                    Turn::Answer(text) => {
                        st.answered.push(Message::new(Role::Assistant, text));
                        st.kept_turns += 1;
                        st.turn += 1;
                        self.next_turn(i, &ids[i], st, &mut generator, &mut rngs, report)?;
                    }
                    Turn::End(reason) => {
                        st.stop_reason = Some(reason);
                    }
                }
            }
        }
        clock.seconds += (start.elapsed().as_secs_f64() - prefill).max(0.0);
        clock.tokens += tokens - turns;
        Ok(states
            .into_iter()
            .map(|mut st| {
                while st.answered.last().is_some_and(|m| m.role != Role::Assistant) {
                    st.answered.pop();
                }
                Regenerated { messages: st.answered, kept_turns: st.kept_turns, stop_reason: st.stop_reason }
            })
            .collect())
    }

    /// Move conversation `i` to its next assistant turn and queue it, or end it.
    fn next_turn(
        &self,
        i: usize,
        (conv_id, source_index): &(String, u64),
        st: &mut State,
        generator: &mut BatchGenerator<'_, B>,
        rngs: &mut HashMap<u64, Rng>,
        report: &mut RegenerateReport,
    ) -> Result<()> {
        for m in st.rest.by_ref() {
            if m.role != Role::Assistant {
                st.answered.push(m);
                continue;
            }
            match self.prompt(&st.answered, conv_id)? {
                Prompt::Ids { ids, budget } => {
                    report.prompt_tokens += ids.len() as u64;
                    st.budget = budget;
                    rngs.insert(i as u64, Rng::for_turn(self.opts.seed, *source_index, st.turn));
                    generator.push(GenerationRequest { id: i as u64, prompt: ids, max_new_tokens: budget })?;
                }
                Prompt::End(reason) => {
                    st.stop_reason = Some(reason);
                }
                Prompt::Unrenderable => {
                    st.stop_reason = Some("template_error");
                    st.kept_turns = 0;
                }
            }
            return Ok(());
        }
        Ok(())
    }
}
