//! A decoding session: the target, its prompt encoder (tokenizer and chat template) and the
//! prompts, loaded once, then any number of drafters decoded against them (`aerie eval decode`
//! runs one, `aerie compare --prompts` several), and the costs such a run measured, named after
//! the target and device it ran on.

use std::path::Path;

use aerie_data::generation::PromptEncoder;
use aerie_data::template::TemplateChoice;
use aerie_model::checkpoint::load_drafter;
use aerie_model::{Drafter, TargetModel};
use burn::tensor::backend::Backend;

use aerie_model::drafter::shape::DraftShape;

use super::run::{BatchedPlain, PlainRun};
use super::{DecodeOptions, DecodeReport, DecodeTimings, SpecDecoder, decode_prompts};
use crate::accept::{AcceptCounter, AcceptReport};
use crate::cost::Costs;
use crate::prompts::{Prompt, read_prompts, select};
use crate::{Error, Result};
use aerie_data::conversation::{Message, Role};
use aerie_model::native::batch::{BatchGenerator, GenerationRequest, greedy};

/// What decoding runs against: the target, its prompt encoder and stop ids, the prompts.
pub struct DecodeSession<B: Backend> {
    /// The target model.
    pub target: TargetModel<B>,
    /// Its tokenizer and chat template.
    pub encoder: PromptEncoder,
    /// The prompts.
    pub prompts: Vec<Prompt>,
}

impl<B: Backend> DecodeSession<B> {
    /// Load the target at `target_dir` and the first `max_prompts` prompts of `prompts`.
    pub fn load(
        target_dir: &Path,
        prompts: &Path,
        max_prompts: Option<usize>,
        template: &str,
        device: &B::Device,
    ) -> Result<Self> {
        let list = select(read_prompts(prompts)?, max_prompts)?;
        let template: TemplateChoice = template.parse()?;
        let encoder = PromptEncoder::load(target_dir, &template).map_err(|e| {
            Error::step(format!("loading the tokenizer and chat template of {}", target_dir.display()), e)
        })?;
        let target = TargetModel::<B>::load(target_dir, device)
            .map_err(|e| Error::step(format!("loading target {}", target_dir.display()), e))?;
        Ok(Self { target, encoder, prompts: list })
    }

    /// Answers per drafter run (prompts × turns).
    pub fn answers(&self) -> usize {
        self.prompts.iter().map(|p| p.turns()).sum()
    }

    /// Decode every prompt plainly and with the drafter at `drafter_dir`; `progress(tokens)`.
    pub fn run(
        &self,
        target_dir: &Path,
        drafter_dir: &Path,
        opts: &DecodeOptions,
        device: &B::Device,
        progress: &mut dyn FnMut(usize),
    ) -> Result<(DecodeReport, DecodeTimings)> {
        let ckpt = load_drafter(drafter_dir, Some(target_dir))
            .map_err(|e| Error::step(format!("loading drafter {}", drafter_dir.display()), e))?;
        let drafter = Drafter::<B>::from_tensors(&ckpt.config, &ckpt.tensors, device)
            .map_err(|e| Error::step(format!("building drafter {}", drafter_dir.display()), e))?
            .into_decoding_layout();
        opts.validate(drafter.config().draft_vocab_size)?;
        let dec = SpecDecoder::new(&self.target, &drafter, self.stop_ids()).map_err(|e| {
            Error::step(format!("{} does not draft for {}", drafter_dir.display(), target_dir.display()), e)
        })?;
        decode_prompts(&dec, &self.encoder, &self.prompts, opts, progress)
    }

    /// τ of speculative decoding alone with `drafter` (in its training layout; turned into the
    /// decoding one here) over every prompt, multi-turn prompts continuing from their own
    /// answers: what choosing a checkpoint by decoded τ (`[select]` of a training config)
    /// needs, without the plain decode [`Self::run`] also makes (under the greedy rule the
    /// answers are the same, and τ does not depend on it).
    pub fn speculative_tau(&self, drafter: Drafter<B>, opts: &DecodeOptions) -> Result<SpeculativeTau> {
        let drafter = drafter.into_decoding_layout();
        opts.validate(drafter.config().draft_vocab_size)?;
        let dec = SpecDecoder::new(&self.target, &drafter, self.stop_ids())
            .map_err(|e| Error::step("the drafter does not draft for the target", e))?;
        let mut counter = AcceptCounter::new(opts.shape.depth());
        let mut timings = DecodeTimings::default();
        let mut out = SpeculativeTau::default();
        let start = std::time::Instant::now();
        for (pi, prompt) in self.prompts.iter().enumerate() {
            let mut ctx = prompt.context.clone();
            for turn in 0..prompt.turns() {
                if turn > 0 {
                    ctx.push(Message::new(Role::User, prompt.follow_ups[turn - 1].clone()));
                }
                // The seeds of `decode_prompts`, so a sampled run draws what `eval decode` draws.
                let turn_opts = DecodeOptions { seed: opts.seed ^ ((pi as u64) << 16 | turn as u64), ..opts.clone() };
                let ids = self.encoder.encode(&ctx)?;
                let spec = dec.speculative(&ids, &turn_opts, &mut timings)?;
                spec.accepted.iter().for_each(|&a| counter.add_length(a));
                out.answers += 1;
                out.cycles += spec.accepted.len();
                out.tokens += spec.tokens.len();
                ctx.push(Message::new(Role::Assistant, self.encoder.decode(&spec.tokens)?));
            }
        }
        let tree = opts.shape.tree().map(|t| (t.topk, t.verify_tokens));
        out.tau = AcceptReport::from_counter(&counter, opts.rule, tree, opts.temperature).tau;
        out.seconds = start.elapsed().as_secs_f64();
        Ok(out)
    }

    /// The ids that end an answer: the target's eos ids and the template's end of turn.
    fn stop_ids(&self) -> Vec<u32> {
        self.encoder.stop_ids(&self.target.spec().eos_token_ids)
    }

    /// Greedy plain decoding of `runs` (a report's `plain_answers`) up to `batch` at a time,
    /// each with the budget of the batch-1 run, stopping at the same stop ids; the tokens are
    /// compared with the batch-1 answers.
    pub fn plain_batched(&self, runs: &[PlainRun], batch: usize, max_new_tokens: usize) -> Result<BatchedPlain> {
        let mut generator = BatchGenerator::new(&self.target, batch, &self.stop_ids())
            .map_err(|e| Error::step("starting batched plain decoding", e))?;
        for (i, run) in runs.iter().enumerate() {
            let request = GenerationRequest { id: i as u64, prompt: run.prompt.clone(), max_new_tokens };
            generator.push(request).map_err(|e| Error::step(format!("answer {i}"), e))?;
        }
        let start = std::time::Instant::now();
        let mut pick = greedy::<B>;
        let done = generator.run_to_end(&mut pick).map_err(|e| Error::step("batched plain decoding", e))?;
        let seconds = start.elapsed().as_secs_f64();
        let tokens: usize = done.iter().map(|g| g.tokens.len()).sum();
        Ok(BatchedPlain {
            batch,
            answers: done.len(),
            tokens,
            seconds,
            prefill_seconds: done.iter().map(|g| g.prefill_seconds).sum(),
            tokens_per_s: if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 },
            identical_answers: done.iter().filter(|g| runs[g.id as usize].tokens == g.tokens).count(),
        })
    }
}

/// What [`DecodeSession::speculative_tau`] measured.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SpeculativeTau {
    /// Accept length: tokens per verify cycle, bonus included (`eval decode`'s τ).
    pub tau: f64,
    /// Answers decoded (prompts × turns).
    pub answers: usize,
    /// Verify cycles.
    pub cycles: usize,
    /// New tokens over all answers.
    pub tokens: usize,
    /// Wall seconds of the whole decode, prefills included.
    pub seconds: f64,
}

/// The measured costs of a run as a costs file, named after the target and `device` (as
/// `--device` spells it) and dated `when` (YYYY-MM-DD); `None` when no decode step was timed.
pub fn measured_costs(
    timings: &DecodeTimings,
    target_dir: &Path,
    device: &str,
    shape: &DraftShape,
    when: &str,
) -> Option<Costs> {
    let name = format!(
        "{}-native-{device}",
        target_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "target".into())
    );
    let place = format!(
        "aerie eval decode, native burn target {} on {device} ({} threads), batch 1, {shape:?}",
        target_dir.display(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    timings.costs(&name, shape, &place, when)
}
