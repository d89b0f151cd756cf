//! Periodic evaluation on held-out data with the teacher-forced metrics of `aerie eval loss`:
//! eval directories go through [`aerie_eval::loss::eval_loss`] itself; the `eval_fraction`
//! split (a subset of the training shards, which `eval_loss` cannot take) is evaluated with the
//! same pieces (`collate`, `length_sorted_batches`, `ttt_forward`, `TttSums`).

use aerie_eval::batch::{TeacherSource, collate, length_sorted_batches};
use aerie_eval::loss::{EvalLossOptions, eval_loss};
use aerie_model::{Drafter, TargetHead, TttOptions, TttSums, ttt_forward};
use burn::tensor::backend::Backend;

use crate::Result;
use crate::data::Catalog;
use crate::metrics::EvalRecord;

/// Name of the `eval_fraction` split in eval records.
pub const HELD_OUT: &str = "held-out";

/// Evaluate `drafter` on every eval set of `catalog`; one record per set.
pub fn evaluate<B: Backend>(
    drafter: &Drafter<B>,
    head: Option<&TargetHead<B>>,
    catalog: &Catalog,
    ttt: &TttOptions,
    batch_size: usize,
    max_samples: Option<usize>,
    step: u64,
) -> Result<Vec<EvalRecord>> {
    let mut out = Vec::new();
    let opts = EvalLossOptions { ttt: ttt.clone(), batch_size, max_samples };
    for set in &catalog.eval_sets {
        let metrics = eval_loss(drafter, set, head, &opts, &mut |_, _| {})?;
        out.push(EvalRecord {
            kind: "eval".into(),
            step,
            set: set.dir().display().to_string(),
            samples: max_samples.map_or(set.len(), |m| m.min(set.len())),
            metrics,
        });
    }
    if !catalog.held_out.is_empty() {
        let refs: Vec<_> = catalog.held_out.iter().take(max_samples.unwrap_or(usize::MAX)).copied().collect();
        let teacher = match head {
            Some(h) => TeacherSource::Head(h),
            None => TeacherSource::TopK,
        };
        let lengths: Vec<usize> = refs.iter().map(|r| r.len).collect();
        let device = drafter.embed_tokens.device();
        let mut sums = TttSums::default();
        for idx in length_sorted_batches(&lengths, batch_size) {
            let views: Vec<_> = idx.iter().map(|&i| catalog.view(refs[i])).collect();
            let batch = collate::<B>(&views, drafter.config(), drafter.vocab(), &teacher, &device)?;
            sums.add(&ttt_forward(drafter, &batch, ttt)?);
        }
        out.push(EvalRecord {
            kind: "eval".into(),
            step,
            set: HELD_OUT.into(),
            samples: refs.len(),
            metrics: sums.metrics(&ttt.step_weights),
        });
    }
    Ok(out)
}
