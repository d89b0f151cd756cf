//! `eval serve --predict`: aerie's own decoder on the same prompts, k and answer length as each
//! engine run, its τ and the speedup it projects through the engine's measured costs put beside
//! the engine's ([`super::ServeRun::predict`]).

use std::path::Path;

use aerie_model::drafter::shape::DraftShape;
use burn::tensor::backend::Backend;

use super::{ServeReport, ServedDrafter};
use crate::accept::AcceptRule;
use crate::decode::{DecodeOptions, DecodeSession};
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
