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

use aerie_data::hf_config::TargetShape;
use aerie_data::shard::ShardDataset;
use aerie_data::tokenizer::TokenizerFiles;

use super::{AnswerText, ServeReport, ServedDrafter};
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
        run.predict(decoded.tau, decoded.greedy_identical);
        if let Some(p) = run.prediction.as_mut() {
            p.profile = Some(decoded.profile);
        }
    }
    Ok(())
}

/// Check, before any engine starts, that `shards` can predict the engine serving `target`: every
/// shard file the manifest lists opens whole (a missing or truncated one is named), it holds a
/// sample, and it was captured from this target (its [`TargetShape`]) through this tokenizer
/// (the digest of `TokenizerFiles::load`). What only the engine's answers can show (the shards
/// hold its answers to these prompts) is checked after the runs.
pub fn check_predict_shards(shards: &Path, target: &Path) -> Result<()> {
    let what = |m: String| Error::Input { path: shards.to_owned(), message: format!("--predict-from: {m}") };
    let data = ShardDataset::open(shards).map_err(|e| what(format!("not a capture's shard directory, whole: {e}")))?;
    if data.is_empty() {
        return Err(what("the capture holds no sample".into()));
    }
    let meta = data.metadata();
    let shape = TargetShape::from_config(target)
        .map_err(|e| Error::step(format!("reading the shape of the target {}", target.display()), e))?;
    for (name, have, want) in [
        ("hidden_size", meta.hidden_size, shape.hidden_size),
        ("vocab_size", meta.target_vocab_size, shape.vocab_size),
        ("num_hidden_layers", meta.target_num_layers, shape.num_layers),
    ] {
        if have != want {
            return Err(what(format!(
                "captured from a target of {name} {have} ({}), but {} has {want}: capture the engine's answers with \
                 this target",
                meta.target,
                target.display()
            )));
        }
    }
    let files = TokenizerFiles::load(target)
        .map_err(|e| Error::step(format!("loading the tokenizer of {} to check the shards", target.display()), e))?;
    if files.digest != meta.tokenizer_digest {
        return Err(what(format!(
            "captured through another tokenizer (digest {}) than {}'s ({}): capture through the target's own",
            meta.tokenizer_digest,
            target.display(),
            files.digest
        )));
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
    // The walk predicts the engine only over the engine's own answers: shards of other prompts
    // (or of another engine's answers) with the same count must not pass.
    let files = TokenizerFiles::load(target).map_err(|e| {
        Error::step(format!("loading the tokenizer of {} to read the shards' answers", target.display()), e)
    })?;
    let decode = |ids: &[u32], skip: bool| files.tokenizer.decode(ids, skip).map_err(|e| e.to_string());
    shards_hold_the_answers(&trained_spans(&eval.data), &report.plain_answers, &decode).map_err(|m| {
        Error::Incompatible(format!(
            "{} does not hold the engine's own answers to these prompts: {m}. Capture the engine's greedy answers to \
             the same prompts (`aerie regenerate` through the engine with the same template and --max-new-tokens, \
             `data prepare`, `capture`)",
            shards.display()
        ))
    })?;
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
        // The walk decodes nothing (its answers are the captured ones): greedy identity was not
        // compared, so it is not reported.
        run.predict(r.tau, None);
        if let Some(p) = run.prediction.as_mut() {
            p.shards = Some(shards.to_owned());
            p.cycles = Some(walk.cycles);
            p.accepted_drafts = Some(walk.accepted_drafts);
            p.profile = r.profile.clone();
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

/// Each sample's trained token ids (its `loss_mask` = 1 positions), in dataset order.
fn trained_spans(data: &ShardDataset) -> Vec<Vec<u32>> {
    data.iter()
        .map(|v| v.input_ids().iter().zip(v.loss_mask()).filter(|(_, m)| **m == 1).map(|(id, _)| *id as u32).collect())
        .collect()
}

/// An answer's text as compared: outer whitespace off, and a trailing incomplete character
/// (U+FFFD from a token cut in the middle of a UTF-8 sequence, which a streaming detokenizer holds
/// back) dropped.
fn normalized(text: &str) -> &str {
    text.trim().trim_end_matches('\u{FFFD}').trim_end()
}

/// A detokenizer: `(ids, skip_special_tokens)` to text, or the reason it cannot.
type Detokenize<'a> = dyn Fn(&[u32], bool) -> std::result::Result<String, String> + 'a;

/// Whether every one of the engine's `answers` is the text of a distinct trained span of the
/// shards (`spans`, one per sample; order free: `data prepare` may reorder). The engine's chat
/// endpoint returns text, not ids, so the span is decoded by the target's tokenizer
/// (`decode(ids, skip_special)`) with special tokens skipped, as the engine's detokenizer does, or
/// kept, for a special token the engine shows; the two must name the same tokens for equal text.
/// `Err` names the first answer no span matches.
pub(crate) fn shards_hold_the_answers(
    spans: &[Vec<u32>],
    answers: &[AnswerText],
    decode: &Detokenize<'_>,
) -> std::result::Result<(), String> {
    if answers.is_empty() {
        return Err("the report keeps no engine answers to compare the shards with".into());
    }
    if spans.len() != answers.len() {
        return Err(format!("{} samples against {} answers", spans.len(), answers.len()));
    }
    let mut texts: Vec<Option<[String; 2]>> = Vec::with_capacity(spans.len());
    for span in spans {
        let skipped = decode(span, true)?;
        let kept = decode(span, false)?;
        texts.push(Some([normalized(&skipped).to_string(), normalized(&kept).to_string()]));
    }
    for a in answers {
        let want = normalized(&a.text);
        let found = texts.iter().position(|t| t.as_ref().is_some_and(|t| t.iter().any(|s| s == want)));
        match found {
            Some(i) => texts[i] = None,
            None => {
                let excerpt: String = want.chars().take(80).collect();
                return Err(format!(
                    "no sample's trained tokens are the engine's answer to prompt {} turn {} ({excerpt:?}...)",
                    a.prompt,
                    a.turn + 1
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(prompt: &str, turn: usize, text: &str) -> AnswerText {
        AnswerText { prompt: prompt.into(), turn, text: text.into() }
    }

    /// A toy detokenizer: id i is the letter `a + i`, 0 a special token (shown only when kept).
    fn decode(ids: &[u32], skip: bool) -> std::result::Result<String, String> {
        Ok(ids
            .iter()
            .filter(|&&i| !(skip && i == 0))
            .map(|&i| if i == 0 { "<|im_end|>".to_string() } else { char::from(b'a' + i as u8).to_string() })
            .collect())
    }

    /// Issue 44 §5: shards of other prompts with the same count used to pass `--predict-from`;
    /// the trained spans must be the engine's own answers (order free, special tokens as the
    /// engine shows them, a trailing cut character tolerated).
    #[test]
    fn only_the_engines_own_answers_pass() {
        let spans = vec![vec![1, 2, 3, 0], vec![4, 5]];
        let answers = [answer("1", 0, "bcd"), answer("1", 1, " ef\u{FFFD}")];
        assert_eq!(shards_hold_the_answers(&spans, &answers, &decode), Ok(()));
        // Order free: prepare may reorder samples.
        let swapped = [answers[1].clone(), answers[0].clone()];
        assert_eq!(shards_hold_the_answers(&spans, &swapped, &decode), Ok(()));
        // The same count, other answers: refused, naming the answer.
        let other = [answer("1", 0, "bcd"), answer("2", 0, "xyz")];
        let e = shards_hold_the_answers(&spans, &other, &decode).unwrap_err();
        assert!(e.contains("prompt 2 turn 1") && e.contains("xyz"), "{e}");
        // One span cannot stand for two equal answers.
        let twice = [answer("1", 0, "bcd"), answer("2", 0, "bcd")];
        assert!(shards_hold_the_answers(&spans, &twice, &decode).is_err());
        // No answers kept (a report of an older aerie): nothing was compared, refused.
        assert!(shards_hold_the_answers(&spans, &[], &decode).unwrap_err().contains("no engine answers"));
    }
}
