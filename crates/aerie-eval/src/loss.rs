//! `aerie eval loss`: the TTT forward of eagle3.md §3 over held-out shards, no weight updates,
//! reduced to the public metrics ([`aerie_model::TttMetrics`]: loss, per-step loss, accuracy and
//! acceptance rate, simulated accept length, tokens).

use aerie_data::shard::ShardDataset;
use aerie_model::{Drafter, TargetHead, TttMetrics, TttOptions, TttSums, ttt_forward};
use burn::tensor::backend::Backend;

use crate::Result;
use crate::batch::{TeacherSource, check_compatible, collate, length_sorted_batches};

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

/// Evaluate `drafter` on `data`. The teacher is `head` × stored final hidden states when a head
/// is given, otherwise the stored top-k log-probabilities. `progress(done, total)` is called after
/// every batch (samples).
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
    let teacher = match head {
        Some(h) => TeacherSource::Head(h),
        None => TeacherSource::TopK,
    };
    let n = opts.max_samples.map_or(data.len(), |m| m.min(data.len()));
    let samples: Vec<_> = data.iter().take(n).collect();
    let lengths: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let device = drafter.embed_tokens.device();
    let mut sums = TttSums::default();
    let mut done = 0;
    for idx in length_sorted_batches(&lengths, opts.batch_size) {
        let chunk: Vec<_> = idx.iter().map(|&i| samples[i]).collect();
        let batch = collate::<B>(&chunk, cfg, drafter.vocab(), &teacher, &device)?;
        sums.add(&ttt_forward(drafter, &batch, &opts.ttt)?);
        done += chunk.len();
        progress(done, n);
    }
    Ok(sums.metrics(&opts.ttt.step_weights))
}
