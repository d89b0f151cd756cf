//! Periodic evaluation on held-out data with the teacher-forced metrics of `aerie eval loss`:
//! eval directories go through [`aerie_model::ttt::eval::eval_loss`] itself, and the
//! `eval_fraction` split (a subset of the training shards) through the same computation over its
//! samples ([`samples_loss`]).

use aerie_model::ttt::eval::{EvalLossOptions, eval_loss, samples_loss};
use aerie_model::{Drafter, TargetHead, TttOptions};
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
        let views: Vec<_> = refs.iter().map(|&r| catalog.view(r)).collect();
        let metrics = samples_loss(drafter, &views, head, ttt, batch_size, &mut |_, _| {})?;
        out.push(EvalRecord { kind: "eval".into(), step, set: HELD_OUT.into(), samples: refs.len(), metrics });
    }
    Ok(out)
}
