//! Host-side batching of shard samples: right-padding, loss and valid masks, and the aux and
//! teacher rows gathered from [`SampleView`]s into flat arrays. Burn-free on purpose: the
//! drafter crate uploads a [`HostBatch`] to its device (`aerie_model::ttt::batch::collate`), and
//! everything that decides what a batch holds stays next to the format it reads.

use rayon::prelude::*;

use super::{HiddenRows, SampleView, ShardMetadata, names};
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
    /// The first value of the batch (in sample order) that is NaN or infinite (`-inf` top-k
    /// log-probs excepted: K beyond the support), found while decoding. Training lets such a
    /// value reach the loss, where the step stops naming its samples; evaluations refuse the
    /// batch with [`HostBatch::ensure_finite`] (a NaN loss would print as `null`).
    pub non_finite: Option<NonFinite>,
}

/// Where a batch holds a value that is not finite.
#[derive(Debug, Clone, PartialEq)]
pub struct NonFinite {
    /// The sample's position in the batch.
    pub sample: usize,
    /// The tensor it was decoded from.
    pub tensor: &'static str,
    /// Token (row) inside the sample.
    pub row: usize,
    /// Column inside the row.
    pub col: usize,
    /// The value.
    pub value: f32,
}

impl HostBatch {
    /// Refuse a batch that holds a NaN or an infinity, naming the shard, the sample and the
    /// position: what every evaluation does before it computes a number.
    pub fn ensure_finite(&self, samples: &[SampleView<'_>]) -> Result<()> {
        match &self.non_finite {
            None => Ok(()),
            Some(nf) => Err(Error::Incompatible(format!(
                "{}: {}[{}, {}] = {} is not finite; `aerie shards verify DIR` lists the first such value of a dataset",
                describe(&samples[nf.sample]),
                nf.tensor,
                nf.row,
                nf.col,
                nf.value
            ))),
        }
    }
}

/// `…/shard-00003.safetensors: sample 812 (id 4471)`, for error messages.
pub fn describe(s: &SampleView<'_>) -> String {
    let id = s.sample_id().map_or_else(String::new, |id| format!(" (id {id})"));
    format!("{}: sample {}{id}", s.shard_path().display(), s.index())
}

/// Output values one decode task writes: large enough that a task amortises its scheduling,
/// small enough that a batch of a few long samples still spreads over every core.
const TASK_VALUES: usize = 1 << 16;

/// One decode task: rows `row0..` of sample `sample`, into `out`.
struct Task<'o> {
    sample: usize,
    row0: usize,
    out: &'o mut [f32],
}

/// Cut each sample's region of a `[B, L, width]` buffer into tasks of whole rows.
fn tasks<'o>(buf: &'o mut [f32], samples: &[SampleView<'_>], l: usize, width: usize) -> Vec<Task<'o>> {
    let rows_per_task = (TASK_VALUES / width.max(1)).max(1);
    let mut out = Vec::new();
    for (i, (region, s)) in buf.chunks_mut(l * width).zip(samples).enumerate() {
        for (c, chunk) in region[..s.len() * width].chunks_mut(rows_per_task * width).enumerate() {
            out.push(Task { sample: i, row0: c * rows_per_task, out: chunk });
        }
    }
    out
}

/// Decode hidden rows of every sample into `buf` in parallel, straight from the mapped shards
/// (no staging copy), checking each task's scales and, on the freshly written (cache-hot)
/// values, finiteness. A bad scale is an error (a damaged file); a non-finite value is
/// returned, the first in sample order.
fn decode_hidden_rows<'a>(
    buf: &mut [f32],
    samples: &[SampleView<'a>],
    l: usize,
    width: usize,
    tensor: &'static str,
    scales_tensor: &'static str,
    rows_of: &(dyn Fn(&SampleView<'a>) -> Result<HiddenRows<'a>> + Sync),
) -> Result<Option<NonFinite>> {
    let mut work = tasks(buf, samples, l, width);
    let results: Vec<Result<Option<NonFinite>>> = work
        .par_iter_mut()
        .map(|task| {
            let s = &samples[task.sample];
            let n = task.out.len() / width;
            let rows = rows_of(s)?.slice_rows(task.row0..task.row0 + n).expect("rows inside the sample");
            if let Some((row, g, v)) = rows.bad_scale() {
                return Err(Error::Incompatible(format!(
                    "{}: {scales_tensor}[{}, {g}] = {v} is not a positive finite scale (a damaged shard)",
                    describe(s),
                    task.row0 + row
                )));
            }
            rows.decode_into(task.out)?;
            Ok(task.out.iter().position(|v| !v.is_finite()).map(|i| NonFinite {
                sample: task.sample,
                tensor,
                row: task.row0 + i / width,
                col: i % width,
                value: task.out[i],
            }))
        })
        .collect();
    let mut first = None;
    for r in results {
        if let Some(nf) = r? {
            first.get_or_insert(nf);
        }
    }
    Ok(first)
}

/// Pad `samples` on the right into one host batch. `aux_width` is the drafter's A·Ht and
/// `hidden_size` its Ht; a sample of another aux width, or without the asked-for teacher, is
/// refused (the drafter would run on features it was not trained for).
///
/// Hidden states are decoded from their storage encoding (bf16, fp8-e4m3, int4, ...) directly
/// into the batch, on rayon's pool (`RAYON_NUM_THREADS`), so a compact dataset costs its decode
/// once, here, and never a second pass; `aerie bench shards` measures this against the disk.
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
    let mut non_finite: Option<NonFinite> = None;
    for (i, s) in samples.iter().enumerate() {
        s.check_ids_and_mask()?;
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
        match teacher {
            TeacherRows::FinalHidden => {
                if s.final_hidden().is_none() {
                    return Err(Error::Incompatible(format!(
                        "{}: no `final_hidden` teacher in the shard",
                        s.shard_path().display()
                    )));
                }
            }
            TeacherRows::TopK => {
                let t = s.topk().ok_or_else(|| {
                    Error::Incompatible(format!("{}: no top-k teacher in the shard", s.shard_path().display()))
                })?;
                topk_ids[at * k..(at + n) * k].copy_from_slice(&t.ids());
                let lp = &mut topk_lp[at * k..(at + n) * k];
                t.decode_logprobs_into(lp)?;
                if non_finite.is_none()
                    && let Some(j) = lp.iter().position(|v| v.is_nan() || *v == f32::INFINITY)
                {
                    let (row, col, value) = (j / k, j % k, lp[j]);
                    non_finite = Some(NonFinite { sample: i, tensor: names::TOPK_LOGPROBS, row, col, value });
                }
            }
        }
    }
    let aux_nf = decode_hidden_rows(&mut aux, samples, l, aw, names::AUX_HIDDEN, names::AUX_HIDDEN_SCALES, &|s| {
        Ok(s.aux_hidden())
    })?;
    let fin_nf = match teacher {
        TeacherRows::FinalHidden => {
            decode_hidden_rows(&mut fin, samples, l, ht, names::FINAL_HIDDEN, names::FINAL_HIDDEN_SCALES, &|s| {
                s.final_hidden().ok_or_else(|| Error::Incompatible("no final_hidden".into()))
            })?
        }
        TeacherRows::TopK => None,
    };
    // The first in sample order, whichever tensor.
    let non_finite = [aux_nf, fin_nf, non_finite].into_iter().flatten().min_by_key(|nf| nf.sample);
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
        non_finite,
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

    /// What keeps two datasets out of one run (training on both, training on one and evaluating
    /// on the other): token ids of another tokenizer, or features of another target, layer set or
    /// width, which a drafter would take for the same thing. One line per field, `field: this vs
    /// other`; storage, teacher and provenance may differ.
    pub fn mixing_differences(&self, other: &ShardMetadata) -> Vec<String> {
        let fields: [(&str, String, String); 5] = [
            ("tokenizer_digest", self.tokenizer_digest.clone(), other.tokenizer_digest.clone()),
            ("target", self.target.clone(), other.target.clone()),
            ("target_vocab_size", self.target_vocab_size.to_string(), other.target_vocab_size.to_string()),
            (
                "aux_layer_ids (output-of-layer)",
                format!("{:?}", self.aux_output_of_layer_ids()),
                format!("{:?}", other.aux_output_of_layer_ids()),
            ),
            ("hidden_size", self.hidden_size.to_string(), other.hidden_size.to_string()),
        ];
        fields.into_iter().filter(|(_, a, b)| a != b).map(|(f, a, b)| format!("{f}: `{a}` vs `{b}`")).collect()
    }
}
