//! The teacher-forced TTT metrics over captured shards: the forward of eagle3.md §3 with no
//! weight updates, reduced to the public metrics ([`TttMetrics`]: loss, per-step loss, accuracy
//! and acceptance rate, simulated accept length, tokens). One home for what `aerie eval loss`
//! reports and what training's periodic evaluation records, so the two numbers are the same
//! computation.

use aerie_data::shard::batch::length_sorted_batches;
use aerie_data::shard::{SampleView, ShardDataset};
use burn::tensor::backend::Backend;

use super::batch::{TeacherSource, check_compatible, collate_finite};
use super::{TttMetrics, TttOptions, TttSums, ttt_forward};
use crate::Result;
use crate::drafter::Drafter;
use crate::teacher::TargetHead;

/// What to evaluate and how.
#[derive(Debug, Clone)]
pub struct EvalLossOptions {
    /// Unroll length and step weights.
    pub ttt: TttOptions,
    /// Samples per forward.
    pub batch_size: usize,
    /// Evaluate only the first N samples of the dataset.
    pub max_samples: Option<usize>,
}

impl Default for EvalLossOptions {
    fn default() -> Self {
        Self { ttt: TttOptions::default(), batch_size: 4, max_samples: None }
    }
}

/// Evaluate `drafter` on `data` (`aerie eval loss`). The teacher is `head` × stored final hidden
/// states when a head is given, otherwise the stored top-k log-probabilities. `progress(done,
/// total)` is called after every batch (samples).
pub fn eval_loss<B: Backend>(
    drafter: &Drafter<B>,
    data: &ShardDataset,
    head: Option<&TargetHead<B>>,
    opts: &EvalLossOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<TttMetrics> {
    opts.ttt.validate()?;
    let cfg = drafter.config();
    check_compatible(cfg, data.metadata())?;
    let n = opts.max_samples.map_or(data.len(), |m| m.min(data.len()));
    let samples: Vec<_> = data.iter().take(n).collect();
    samples_loss(drafter, &samples, head, &opts.ttt, opts.batch_size, progress)
}

/// The metrics of `drafter` on `samples` in length-sorted batches of `batch_size` (any samples:
/// training evaluates a held-out subset of its training shards this way). The caller has checked
/// the options and that the data fits the drafter.
pub fn samples_loss<B: Backend>(
    drafter: &Drafter<B>,
    samples: &[SampleView<'_>],
    head: Option<&TargetHead<B>>,
    ttt: &TttOptions,
    batch_size: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<TttMetrics> {
    let cfg = drafter.config();
    let teacher = match head {
        Some(h) => TeacherSource::Head(h),
        None => TeacherSource::TopK,
    };
    let n = samples.len();
    let lengths: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let device = drafter.embed_tokens.device();
    let mut sums = TttSums::default();
    let mut done = 0;
    for idx in length_sorted_batches(&lengths, batch_size) {
        let chunk: Vec<_> = idx.iter().map(|&i| samples[i]).collect();
        let batch = collate_finite::<B>(&chunk, cfg, drafter.vocab(), &teacher, &device)?;
        sums.add(&ttt_forward(drafter, &batch, ttt)?);
        done += chunk.len();
        progress(done, n);
    }
    Ok(sums.metrics(&ttt.step_weights))
}
