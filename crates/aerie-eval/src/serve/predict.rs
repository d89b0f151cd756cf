//! `eval serve --predict`: aerie's own decoder on the same prompts, k and answer length as each
//! engine run, its τ and the speedup it projects through the engine's measured costs put beside
//! the engine's ([`super::ServeRun::predict`]).
//!
//! For targets the native engine cannot run (DeepSeek-V3, Kimi), [`predict_from_shards`] gives
//! the same prediction without decoding: at temperature 0 the engine's acceptance is fixed by
//! the target's own greedy answers and the drafter's drafts on them, so `eval accept`'s cycle
//! walk ([`crate::cycles`]) over shards captured from the engine's own greedy answers to the same
//! prompts (same template, budget and k) counts the engine's cycles and accepted drafts.

use std::path::Path;

use aerie_model::drafter::shape::DraftShape;
use burn::tensor::backend::Backend;

use super::{ServeReport, ServedDrafter};
use crate::accept::AcceptRule;
use crate::decode::{DecodeOptions, DecodeSession};
use crate::offline::ShardEval;
use crate::verify::AcceptOptions;
use crate::{Error, Result};

/// Decode every run's drafter (by its unique name) at the run's k on `session`'s prompts (the
/// same selection the engine answered) and attach the prediction; `progress(tokens)`.
pub fn predict<B: Backend>(
    report: &mut ServeReport,
    drafters: &[ServedDrafter],
    session: &DecodeSession<B>,
    target: &Path,
    max_new_tokens: usize,
    device: &B::Device,
    progress: &mut dyn FnMut(usize),
) -> Result<()> {
    if session.answers() != report.answers {
        return Err(Error::Incompatible(format!(
            "the prediction would decode {} answers where the engine gave {}: not the same prompts",
            session.answers(),
            report.answers
        )));
    }
    for run in &mut report.runs {
        let d = drafters.iter().find(|d| d.name == run.drafter).ok_or_else(|| {
            Error::Incompatible(format!("run of `{}` has no drafter of that name to predict from", run.drafter))
        })?;
        let opts = DecodeOptions {
            shape: DraftShape::Chain { k: run.k },
            temperature: 0.0,
            rule: AcceptRule::Greedy,
            max_new_tokens,
            seed: 0,
        };
        let (decoded, _) = session.run(target, &d.source, &opts, device, progress)?;
        run.predict(decoded.tau, decoded.greedy_identical.unwrap_or(false));
    }
    Ok(())
}

/// Walk every run's drafter (by its unique name) at the run's k over the cycles of `shards`
/// (captured from the engine's own greedy answers to the same prompts, cut at the same
/// `max_new_tokens`) and attach the prediction, with the walk's cycle and accepted-draft counts;
/// `target` gives the head (the target's argmax at each position) and the drafters' embedding.
/// `progress(samples)` after every batch.
pub fn predict_from_shards<B: Backend>(
    report: &mut ServeReport,
    drafters: &[ServedDrafter],
    shards: &Path,
    target: &Path,
    max_new_tokens: usize,
    device: &B::Device,
    progress: &dyn Fn(usize),
) -> Result<()> {
    let eval = ShardEval::<B>::open(shards, Some(target), device)?;
    if eval.samples(None) != report.answers {
        return Err(Error::Incompatible(format!(
            "{} holds {} samples where the engine gave {} answers: capture the engine's own answers to the same \
             prompts (one sample per answer)",
            shards.display(),
            eval.samples(None),
            report.answers
        )));
    }
    for run in &mut report.runs {
        let d = drafters.iter().find(|d| d.name == run.drafter).ok_or_else(|| {
            Error::Incompatible(format!("run of `{}` has no drafter of that name to predict from", run.drafter))
        })?;
        let opts = AcceptOptions {
            shape: DraftShape::Chain { k: run.k },
            answer_budget: Some(max_new_tokens),
            ..AcceptOptions::default()
        };
        let r = eval.accept(&d.source, Some(target), &opts, progress, device)?;
        let walk = r.cycles.last().cloned().ok_or_else(|| {
            Error::Incompatible(format!(
                "{}: the cycle walk counted no cycles (greedy chain expected)",
                shards.display()
            ))
        })?;
        // Greedy speculation changes no answer in the walk: its answers are the captured ones.
        run.predict(r.tau, true);
        if let Some(p) = run.prediction.as_mut() {
            p.shards = Some(shards.to_owned());
            p.cycles = Some(walk.cycles);
            p.accepted_drafts = Some(walk.accepted_drafts);
            // Counted alike: the walk's accepted drafts are answer tokens; so are the engine's
            // `accepted_within_answers` (the engine's `tau` also counts drafts past the ends).
            p.counted = match run.accepted_within_answers {
                Some(within) => {
                    p.tau_difference = 1.0 + within as f64 / run.drafts as f64 - r.tau;
                    super::COUNTED_WITHIN_ANSWERS.into()
                }
                None => super::COUNTED_WITHIN_ANSWERS_AGAINST_ALL.into(),
            };
        }
    }
    Ok(())
}
