//! Host-side batching of shard samples: right-padding, loss and valid masks, and the aux and
//! teacher rows gathered from [`SampleView`]s into flat arrays. Burn-free on purpose: the
//! drafter crate uploads a [`HostBatch`] to its device (`aerie_model::ttt::batch::collate`), and
//! everything that decides what a batch holds stays next to the format it reads.

use super::{SampleView, ShardMetadata};
use crate::{Error, Result};

/// Which teacher rows to gather.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TeacherRows {
    /// The stored final hidden states (`final_hidden`), for a target head.
    FinalHidden,
    /// The stored top-k ids and log-probabilities.
    TopK,
}

/// A right-padded batch on the host, row-major over `[B, L]` (padding positions 0).
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    /// Samples B.
    pub batch: usize,
    /// Longest sample L.
    pub len: usize,
    /// Token ids `[B, L]`.
    pub input_ids: Vec<i32>,
    /// 1 on tokens to train on `[B, L]`.
    pub loss_mask: Vec<f32>,
    /// 1 on real (not padding) tokens `[B, L]`.
    pub valid: Vec<f32>,
    /// Aux features `[B, L, aux_width]`.
    pub aux: Vec<f32>,
    /// Final hidden states `[B, L, Ht]` (empty unless [`TeacherRows::FinalHidden`]).
    pub final_hidden: Vec<f32>,
    /// Top-k width K (0 unless [`TeacherRows::TopK`] and the shards carry top-k).
    pub k: usize,
    /// Top-k ids `[B, L, K]`; padding rows point at id 0 (empty unless [`TeacherRows::TopK`]).
    pub topk_ids: Vec<i32>,
    /// Top-k log-probabilities `[B, L, K]`; padding rows hold 0 (empty unless [`TeacherRows::TopK`]).
    pub topk_logprobs: Vec<f32>,
}

/// Pad `samples` on the right into one host batch. `aux_width` is the drafter's A·Ht and
/// `hidden_size` its Ht; a sample of another aux width, or without the asked-for teacher, is
/// refused (the drafter would run on features it was not trained for).
pub fn gather(
    samples: &[SampleView<'_>],
    aux_width: usize,
    hidden_size: usize,
    teacher: TeacherRows,
) -> Result<HostBatch> {
    let b = samples.len();
    let l = samples.iter().map(|s| s.len()).max().unwrap_or(0);
    if b == 0 || l == 0 {
        return Err(Error::Incompatible("empty batch".into()));
    }
    let aw = aux_width;
    let ht = hidden_size;
    let mut ids = vec![0i32; b * l];
    let mut mask = vec![0f32; b * l];
    let mut valid = vec![0f32; b * l];
    let mut aux = vec![0f32; b * l * aw];
    let mut fin = match teacher {
        TeacherRows::FinalHidden => vec![0f32; b * l * ht],
        TeacherRows::TopK => Vec::new(),
    };
    let k = samples[0].topk().map(|t| t.k()).unwrap_or(0);
    let (mut topk_ids, mut topk_lp) = match teacher {
        TeacherRows::TopK => (vec![0i32; b * l * k], vec![0f32; b * l * k]),
        TeacherRows::FinalHidden => (Vec::new(), Vec::new()),
    };
    for (i, s) in samples.iter().enumerate() {
        let n = s.len();
        let at = i * l;
        ids[at..at + n].copy_from_slice(&s.input_ids());
        for (dst, &m) in mask[at..at + n].iter_mut().zip(s.loss_mask()) {
            *dst = m as f32;
        }
        valid[at..at + n].fill(1.0);
        let rows = s.aux_hidden();
        if rows.width() != aw {
            return Err(Error::Incompatible(format!(
                "{}: sample {} has aux width {}, the drafter expects {aw}",
                s.shard_path().display(),
                s.index(),
                rows.width()
            )));
        }
        rows.decode_into(&mut aux[at * aw..(at + n) * aw])?;
        match teacher {
            TeacherRows::FinalHidden => {
                let f = s.final_hidden().ok_or_else(|| {
                    Error::Incompatible(format!("{}: no `final_hidden` teacher in the shard", s.shard_path().display()))
                })?;
                f.decode_into(&mut fin[at * ht..(at + n) * ht])?;
            }
            TeacherRows::TopK => {
                let t = s.topk().ok_or_else(|| {
                    Error::Incompatible(format!("{}: no top-k teacher in the shard", s.shard_path().display()))
                })?;
                topk_ids[at * k..(at + n) * k].copy_from_slice(&t.ids());
                t.decode_logprobs_into(&mut topk_lp[at * k..(at + n) * k])?;
            }
        }
    }
    Ok(HostBatch {
        batch: b,
        len: l,
        input_ids: ids,
        loss_mask: mask,
        valid,
        aux,
        final_hidden: fin,
        k,
        topk_ids,
        topk_logprobs: topk_lp,
    })
}

/// Sample indices grouped into batches of at most `batch_size`, sorted by length so that padding
/// stays small; deterministic.
pub fn length_sorted_batches(lengths: &[usize], batch_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| (lengths[i], i));
    order.chunks(batch_size.max(1)).map(|c| c.to_vec()).collect()
}

impl ShardMetadata {
    /// The captured aux layers in the output-of-layer convention, whichever the data states: the
    /// data's side of the check that a drafter fits the data.
    pub fn aux_output_of_layer_ids(&self) -> Vec<usize> {
        self.aux_convention.output_of_layer(&self.aux_layer_ids)
    }
}
