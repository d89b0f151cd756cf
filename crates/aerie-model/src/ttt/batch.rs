//! Shard samples → one right-padded [`TttBatch`] on a device, with the teacher computed from the
//! stored final hidden states (through the target head) or from the stored top-k
//! log-probabilities; plus the check that a drafter fits the data. The padding and gathering is
//! burn-free and lives with the shard format ([`aerie_data::shard::batch`]); this module uploads
//! its arrays and builds the teacher, which needs the target head.

use aerie_data::shard::batch::{HostBatch, TeacherRows, gather};
use aerie_data::shard::{SampleView, ShardMetadata};
use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use super::TttBatch;
use crate::config::{AuxConvention, DrafterConfig};
use crate::teacher::{TargetHead, TeacherTargets, VocabStats, targets_from_topk};
use crate::{Error, Result};
use aerie_data::vocab::DraftVocab;

/// Where the teacher comes from.
pub enum TeacherSource<'a, B: Backend> {
    /// Final hidden states times this target head.
    Head(&'a TargetHead<B>),
    /// The same, keeping each sample's full-vocabulary statistics in the cache after its first
    /// batch (training's later epochs skip the pass over the whole head; see
    /// [`TargetHead::targets_with`]).
    CachedHead(&'a TargetHead<B>, &'a VocabStatsCache),
    /// Stored top-k log-probabilities.
    TopK,
}

/// Per-sample full-vocabulary teacher statistics, keyed by shard file and position in the
/// dataset. 16 bytes per token (SmolLM2's quickstart: 1.9 MB for 116k tokens), against the
/// pass over V × Ht head weights per token that it saves.
#[derive(Debug, Default)]
pub struct VocabStatsCache {
    samples: std::sync::Mutex<std::collections::HashMap<(std::path::PathBuf, usize), VocabStats>>,
}

impl VocabStatsCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn key(s: &SampleView<'_>) -> (std::path::PathBuf, usize) {
        (s.shard_path().to_path_buf(), s.index())
    }

    /// The batch's statistics (`[B, L]` row-major, padding positions 0), computing and keeping
    /// those of samples seen for the first time from their rows of `fin` (`[B, L, Ht]` values).
    fn batch<B: Backend>(
        &self,
        head: &TargetHead<B>,
        samples: &[SampleView<'_>],
        fin: &[f32],
        [l, ht]: [usize; 2],
        device: &B::Device,
    ) -> VocabStats {
        let mut out = VocabStats { log_z: vec![0.0; samples.len() * l], argmax: vec![0; samples.len() * l] };
        for (i, s) in samples.iter().enumerate() {
            let key = Self::key(s);
            let held = self.samples.lock().expect("vocab stats cache").get(&key).cloned();
            let st = held.unwrap_or_else(|| {
                let rows = &fin[i * l * ht..(i * l + s.len()) * ht];
                let st = head.vocab_stats(Tensor::from_data(TensorData::new(rows.to_vec(), [s.len(), ht]), device));
                self.samples.lock().expect("vocab stats cache").insert(key, st.clone());
                st
            });
            out.log_z[i * l..i * l + st.log_z.len()].copy_from_slice(&st.log_z);
            out.argmax[i * l..i * l + st.argmax.len()].copy_from_slice(&st.argmax);
        }
        out
    }
}

/// Refuse data captured for another target or aux layout: the drafter would run on features it
/// was not trained for and report a meaningless number.
pub fn check_compatible(cfg: &DrafterConfig, meta: &ShardMetadata) -> Result<()> {
    let mut problems = Vec::new();
    let data_ids = meta.aux_output_of_layer_ids();
    let drafter_ids = cfg.aux_layers.output_of_layer();
    if data_ids != drafter_ids {
        problems.push(format!(
            "aux layers differ: the data holds outputs of layers {data_ids:?}, the drafter expects {drafter_ids:?} (output-of-layer convention){}",
            if cfg.aux_layers.convention == AuxConvention::InputOfLayer { " (converted from its input-of-layer ids)" } else { "" }
        ));
    }
    if meta.hidden_size != cfg.target_hidden_size {
        problems.push(format!(
            "hidden size differs: the data has {}, the drafter's target_hidden_size is {}",
            meta.hidden_size, cfg.target_hidden_size
        ));
    }
    if meta.target_vocab_size != cfg.vocab_size {
        problems.push(format!(
            "target vocab differs: the data has {}, the drafter has {}",
            meta.target_vocab_size, cfg.vocab_size
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Incompatible(format!(
            "data captured from `{}` does not fit this drafter:\n  - {}",
            meta.target,
            problems.join("\n  - ")
        )))
    }
}

/// Pad `samples` on the right into one batch on `device`. A NaN or infinity in the data is
/// passed on: training lets it reach the loss, where the step stops naming its samples.
pub fn collate<B: Backend>(
    samples: &[SampleView<'_>],
    cfg: &DrafterConfig,
    vocab: &DraftVocab,
    teacher: &TeacherSource<'_, B>,
    device: &B::Device,
) -> Result<TttBatch<B>> {
    collate_with(samples, cfg, vocab, teacher, device, false)
}

/// [`collate`] for evaluations: a NaN or infinity in the samples' features or teacher is an
/// error naming the shard, the sample and the position, not a `null` metric.
pub fn collate_finite<B: Backend>(
    samples: &[SampleView<'_>],
    cfg: &DrafterConfig,
    vocab: &DraftVocab,
    teacher: &TeacherSource<'_, B>,
    device: &B::Device,
) -> Result<TttBatch<B>> {
    collate_with(samples, cfg, vocab, teacher, device, true)
}

fn collate_with<B: Backend>(
    samples: &[SampleView<'_>],
    cfg: &DrafterConfig,
    vocab: &DraftVocab,
    teacher: &TeacherSource<'_, B>,
    device: &B::Device,
    finite: bool,
) -> Result<TttBatch<B>> {
    let rows = match teacher {
        TeacherSource::Head(_) | TeacherSource::CachedHead(..) => TeacherRows::FinalHidden,
        TeacherSource::TopK => TeacherRows::TopK,
    };
    let ht = cfg.target_hidden_size;
    let aw = cfg.num_aux() * ht;
    let host = gather(samples, aw, ht, rows)?;
    if finite {
        host.ensure_finite(samples)?;
    }
    let HostBatch {
        batch: b,
        len: l,
        input_ids,
        loss_mask,
        valid,
        aux,
        final_hidden: fin,
        k,
        topk_ids,
        topk_logprobs,
        ..
    } = host;
    // Padding rows of a top-k teacher: point at id 0 with log-prob 0; they are masked.
    let teacher: TeacherTargets<B> = match teacher {
        TeacherSource::Head(head) => head.targets(Tensor::from_data(TensorData::new(fin, [b, l, ht]), device)),
        TeacherSource::CachedHead(head, cache) => {
            let stats = cache.batch(head, samples, &fin, [l, ht], device);
            head.targets_with(Tensor::from_data(TensorData::new(fin, [b, l, ht]), device), &stats)
        }
        TeacherSource::TopK => targets_from_topk(&topk_ids, &topk_logprobs, k, [b, l], vocab, device),
    };
    Ok(TttBatch {
        input_ids: Tensor::<B, 2, Int>::from_data(TensorData::new(input_ids, [b, l]), device),
        loss_mask: Tensor::from_data(TensorData::new(loss_mask, [b, l]), device),
        valid: Tensor::from_data(TensorData::new(valid, [b, l]), device),
        aux: Tensor::from_data(TensorData::new(aux, [b, l, aw]), device),
        teacher,
    })
}
