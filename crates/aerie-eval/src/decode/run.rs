//! `aerie eval decode` over a prompt file: every answer decoded twice in the same run, plainly
//! and speculatively, each from its own earlier answers on multi-turn prompts; the report says
//! τ, the acceptance by position, tokens/s of both, the measured speedup, whether greedy outputs
//! agree, and the costs measured on the way.

use aerie_data::conversation::{Message, Role};
use aerie_data::generation::PromptEncoder;
use burn::tensor::backend::Backend;
use serde::Serialize;

use super::{DecodeOptions, DecodeTimings, SpecDecoder};
use crate::Result;
use crate::accept::{AcceptCounter, AcceptReport, AcceptRule, CurvePoint};
use crate::cycles::CycleCount;
use crate::profile::AcceptanceProfile;
use crate::prompts::Prompt;

/// One answer of one prompt.
#[derive(Debug, Clone, Serialize)]
pub struct TurnReport {
    /// 0-based turn.
    pub turn: usize,
    /// Prompt tokens (chat template applied).
    pub prompt_tokens: usize,
    /// New tokens of plain decoding.
    pub plain_tokens: usize,
    /// New tokens of speculative decoding.
    pub spec_tokens: usize,
    /// Verify cycles.
    pub cycles: usize,
    /// Tokens per cycle (the first token comes from the prefill and is not counted).
    pub tau: f64,
    /// Greedy only: speculative tokens equal plain tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identical: Option<bool>,
    /// The speculative answer's text.
    pub text: String,
}

/// One prompt's answers.
#[derive(Debug, Clone, Serialize)]
pub struct PromptReport {
    /// The prompt's id.
    pub id: String,
    /// MT-Bench category.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// τ over this prompt's cycles.
    pub tau: f64,
    /// Its answers.
    pub turns: Vec<TurnReport>,
}

/// Throughput of one decoding mode.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Throughput {
    /// New tokens over all answers.
    pub tokens: usize,
    /// Seconds of prefill.
    pub prefill_seconds: f64,
    /// Seconds after the prefill (what speculation speeds up).
    pub decode_seconds: f64,
    /// Tokens after the first, per decode second.
    pub decode_tokens_per_s: f64,
    /// All tokens per second of prefill + decode.
    pub end_to_end_tokens_per_s: f64,
}

impl Throughput {
    fn add(&mut self, tokens: usize, prefill: f64, decode: f64) {
        self.tokens += tokens;
        self.prefill_seconds += prefill;
        self.decode_seconds += decode;
    }

    fn finish(&mut self, answers: usize) {
        let after_first = self.tokens.saturating_sub(answers) as f64;
        self.decode_tokens_per_s = if self.decode_seconds > 0.0 { after_first / self.decode_seconds } else { 0.0 };
        let total = self.prefill_seconds + self.decode_seconds;
        self.end_to_end_tokens_per_s = if total > 0.0 { self.tokens as f64 / total } else { 0.0 };
    }
}

/// Mean milliseconds of each timed forward.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeasuredCosts {
    /// T_d: one plain decode step.
    pub t_d_ms: Option<f64>,
    /// T_s: one drafter forward (extends and steps together).
    pub t_s_ms: Option<f64>,
    /// A drafter extend over one cycle's accepted tokens.
    pub extend_ms: Option<f64>,
    /// A drafter step (all branches of a tree level at once).
    pub draft_step_ms: Option<f64>,
    /// T_v(n) by verified tokens n.
    pub t_v_ms: std::collections::BTreeMap<usize, f64>,
    /// A whole draft + verify cycle.
    pub cycle_ms: Option<f64>,
    /// Raw timers.
    pub timers: DecodeTimings,
}

/// The result of `aerie eval decode` (its `--json` output; field names are a stable interface).
#[derive(Debug, Clone, Serialize)]
pub struct DecodeReport {
    /// Options decoded with.
    pub options: DecodeOptions,
    /// Answers decoded (prompts × turns).
    pub answers: usize,
    /// Verify cycles.
    pub cycles: usize,
    /// Accept length: tokens per cycle, bonus included, from the verdicts (answers cut by a stop
    /// token or the budget count what was accepted, not what was kept).
    pub tau: f64,
    /// Tokens emitted per cycle (≤ τ: the last cycle of an answer may be cut).
    pub tokens_per_cycle: f64,
    /// The cycles counting only the accepted drafts that are answer tokens (a last cycle's
    /// drafts past the stop token or the budget left out): what `eval accept`'s cycle walk on
    /// the same answers predicts, count for count. `tau` above counts what the verdicts
    /// accepted, as the engines do.
    pub within_answers: CycleCount,
    /// τ(k) for the chain prefixes k = 1..=K (a single point for a tree): what `aerie project`
    /// reads.
    pub curve: Vec<CurvePoint>,
    /// Acceptance by position, in `eval accept`'s terms (positions = cycles).
    pub acceptance: AcceptReport,
    /// The acceptance profile of the cycles as the verdicts count them (as the engines do), τ by
    /// the output position each cycle started at included ([`crate::profile`]).
    pub profile: AcceptanceProfile,
    /// The same cycles counting only the accepted drafts that are answer tokens
    /// (`within_answers`): what `eval accept`'s cycle walk on the same answers gives, bucket for
    /// bucket.
    pub within_answers_profile: AcceptanceProfile,
    /// Plain decoding.
    pub plain: Throughput,
    /// Speculative decoding.
    pub speculative: Throughput,
    /// speculative / plain decode tokens/s (prefill excluded).
    pub speedup: f64,
    /// Greedy: every speculative answer equals the plain one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub greedy_identical: Option<bool>,
    /// Greedy: answers that differ.
    pub mismatched_answers: usize,
    /// Measured costs.
    pub costs: MeasuredCosts,
    /// Per prompt.
    pub prompts: Vec<PromptReport>,
    /// Plain greedy decoding of the same answers many at a time (`aerie eval decode
    /// --plain-batch N`): the throughput a server gets without speculation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_batched: Option<BatchedPlain>,
    /// Every answer's plain prompt and tokens, for [`super::DecodeSession::plain_batched`].
    #[serde(skip)]
    pub plain_answers: Vec<PlainRun>,
}

/// One plain answer: the prompt's ids and the tokens plain decoding produced.
#[derive(Debug, Clone)]
pub struct PlainRun {
    /// Prompt ids (chat template applied).
    pub prompt: Vec<u32>,
    /// The answer.
    pub tokens: Vec<u32>,
}

/// Plain greedy decoding with many answers in flight at once.
#[derive(Debug, Clone, Serialize)]
pub struct BatchedPlain {
    /// Answers decoded at once at most.
    pub batch: usize,
    /// Answers (the same prompts as the batch-1 runs).
    pub answers: usize,
    /// New tokens over all answers.
    pub tokens: usize,
    /// Wall seconds of the whole batched run, prefills included.
    pub seconds: f64,
    /// Seconds of the prompts' prefills.
    pub prefill_seconds: f64,
    /// All tokens per wall second.
    pub tokens_per_s: f64,
    /// Answers whose tokens equal batch-1 plain decoding's (all, unless a float near-tie flipped
    /// an argmax: the batched matmuls sum in another order).
    pub identical_answers: usize,
}

/// Decode every prompt plainly and speculatively; `progress(tokens)` after each answer.
pub fn decode_prompts<B: Backend>(
    dec: &SpecDecoder<'_, B>,
    encoder: &PromptEncoder,
    prompts: &[Prompt],
    opts: &DecodeOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<(DecodeReport, DecodeTimings)> {
    let greedy = opts.rule == AcceptRule::Greedy;
    let mut counter = AcceptCounter::new(opts.shape.depth());
    let mut within = CycleCount { k: opts.shape.depth(), ..CycleCount::default() };
    let mut verdicts = within.clone();
    let mut timings = DecodeTimings::default();
    let (mut plain_tp, mut spec_tp) = (Throughput::default(), Throughput::default());
    let (mut answers, mut emitted_total, mut mismatched) = (0usize, 0usize, 0usize);
    let mut reports = Vec::with_capacity(prompts.len());
    let mut plain_answers = Vec::new();
    for (pi, prompt) in prompts.iter().enumerate() {
        // Each mode continues from its own earlier answers.
        let (mut plain_ctx, mut spec_ctx) = (prompt.context.clone(), prompt.context.clone());
        let mut turns = Vec::new();
        let mut prompt_counter = AcceptCounter::new(opts.shape.depth());
        for turn in 0..prompt.turns() {
            if turn > 0 {
                let user = Message::new(Role::User, prompt.follow_ups[turn - 1].clone());
                plain_ctx.push(user.clone());
                spec_ctx.push(user);
            }
            let turn_opts = DecodeOptions { seed: opts.seed ^ ((pi as u64) << 16 | turn as u64), ..opts.clone() };
            let plain_ids = encoder.encode(&plain_ctx)?;
            let spec_ids = encoder.encode(&spec_ctx)?;
            let plain = dec.plain(&plain_ids, &turn_opts, &mut timings)?;
            let spec = dec.speculative(&spec_ids, &turn_opts, &mut timings)?;
            // Answer tokens emitted before each cycle: the prefill's first, then each cycle's kept.
            let mut position = 1u64;
            for (&a, &kept) in spec.accepted.iter().zip(&spec.emitted) {
                counter.add_length(a);
                prompt_counter.add_length(a);
                verdicts.add(position, a);
                // Kept tokens are the accepted drafts and then the bonus: min(a, kept) drafts.
                within.add(position, a.min(kept));
                position += kept as u64;
            }
            let emitted: usize = spec.emitted.iter().sum();
            emitted_total += emitted;
            answers += 1;
            plain_tp.add(plain.tokens.len(), plain.prefill_seconds, plain.decode_seconds);
            spec_tp.add(spec.tokens.len(), spec.prefill_seconds, spec.decode_seconds);
            let identical = greedy.then(|| plain.tokens == spec.tokens);
            if identical == Some(false) {
                mismatched += 1;
            }
            let spec_text = encoder.decode(&spec.tokens)?;
            plain_ctx.push(Message::new(Role::Assistant, encoder.decode(&plain.tokens)?));
            spec_ctx.push(Message::new(Role::Assistant, spec_text.clone()));
            let cycles = spec.accepted.len();
            turns.push(TurnReport {
                turn,
                prompt_tokens: spec_ids.len(),
                plain_tokens: plain.tokens.len(),
                spec_tokens: spec.tokens.len(),
                cycles,
                tau: if cycles > 0 {
                    spec.accepted.iter().map(|a| a + 1).sum::<usize>() as f64 / cycles as f64
                } else {
                    0.0
                },
                identical,
                text: spec_text,
            });
            progress(plain.tokens.len() + spec.tokens.len());
            plain_answers.push(PlainRun { prompt: plain_ids, tokens: plain.tokens });
        }
        let tau = AcceptReport::from_counter(&prompt_counter, opts.rule, None, opts.temperature).tau;
        reports.push(PromptReport { id: prompt.id.clone(), category: prompt.category.clone(), tau, turns });
    }
    plain_tp.finish(answers);
    spec_tp.finish(answers);
    let tree = opts.shape.tree().map(|t| (t.topk, t.verify_tokens));
    let mut acceptance = AcceptReport::from_counter(&counter, opts.rule, tree, opts.temperature);
    acceptance.samples = answers;
    acceptance.warnings.clear();
    // The report's own `profile` below (the verdicts' cycles, bucketed); not repeated here.
    acceptance.profile = None;
    let tree = tree.is_some();
    let profile =
        verdicts.profile(tree, "eval decode", "every accepted draft, as the verdicts (and the engines) count them")?;
    let within_answers_profile = within.profile(
        tree,
        "eval decode",
        "the accepted drafts that are answer tokens (as the cycle walk counts them)",
    )?;
    let cycles = counter.positions as usize;
    let costs = MeasuredCosts {
        t_d_ms: timings.plain_step.mean_ms(),
        t_s_ms: timings.t_s_ms(),
        extend_ms: timings.extend.mean_ms(),
        draft_step_ms: timings.draft_step.mean_ms(),
        t_v_ms: timings.verify.iter().filter_map(|(n, t)| Some((*n, t.mean_ms()?))).collect(),
        cycle_ms: timings.cycle.mean_ms(),
        timers: timings.clone(),
    };
    let report = DecodeReport {
        options: opts.clone(),
        answers,
        cycles,
        tau: acceptance.tau,
        tokens_per_cycle: if cycles > 0 { emitted_total as f64 / cycles as f64 } else { 0.0 },
        within_answers: within,
        curve: acceptance.curve.clone(),
        acceptance,
        profile,
        within_answers_profile,
        plain: plain_tp,
        speculative: spec_tp,
        speedup: if plain_tp.decode_tokens_per_s > 0.0 {
            spec_tp.decode_tokens_per_s / plain_tp.decode_tokens_per_s
        } else {
            0.0
        },
        greedy_identical: greedy.then_some(mismatched == 0),
        mismatched_answers: mismatched,
        costs,
        prompts: reports,
        plain_batched: None,
        plain_answers,
    };
    Ok((report, timings))
}
