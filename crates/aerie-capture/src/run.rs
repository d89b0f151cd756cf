//! One capture run: target forward per sample, aux features and teacher into shards, then a
//! verification pass over everything written.

use aerie_model::precision::host_f32;
use std::path::Path;
use std::time::Instant;

use aerie_data::prepare::PreparedDataset;
use aerie_data::shard::{HiddenDtype, ShardDataset, ShardWriter, ShardWriterOptions, Teacher, VerifyReport};
use aerie_model::{AuxConvention, AuxLayers, CaptureRequest, LogitsMode, TargetModel};
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, Int, Tensor, TensorData, backend::Backend};

use crate::contract::{self, TargetShape};
use crate::{Result, provenance};

/// What to capture.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// Target name recorded in the shards (`name_or_path`).
    pub target_name: String,
    /// Aux layers in the output-of-layer convention; `None` = EAGLE-3's default `[1, N/2-1, N-4]`
    /// ([`contract::aux_layers`] has the rule).
    pub aux_layers: Option<Vec<usize>>,
    /// Storage of the hidden states (a plain float or a compact encoding).
    pub dtype: HiddenDtype,
    /// Teacher to store.
    pub teacher: Teacher,
    /// Tokens per shard.
    pub shard_tokens: usize,
    /// Which split of the prepared dataset (`train`, `eval`).
    pub split: String,
    /// Capture only the first N samples of the split.
    pub max_samples: Option<usize>,
}

/// Progress after each sample.
#[derive(Debug, Clone, Copy)]
pub struct CaptureProgress {
    /// Samples done (including those resumed from disk).
    pub samples: u64,
    /// Samples to do in all.
    pub total: u64,
    /// Tokens captured by this run.
    pub tokens: u64,
}

/// What a capture did.
#[derive(Debug, Clone)]
pub struct CaptureReport {
    /// Samples already on disk when the run started (resume).
    pub resumed_samples: u64,
    /// Samples captured by this run.
    pub captured_samples: u64,
    /// Tokens captured by this run.
    pub captured_tokens: u64,
    /// Wall time of the forward passes and writes.
    pub seconds: f64,
    /// The verification pass over the whole dataset.
    pub verify: VerifyReport,
    /// Bytes per stored token (all tensors, from the manifest and file sizes).
    pub bytes_per_token: f64,
    /// What the user should know (an output on a file system without locks).
    pub warnings: Vec<String>,
}

/// Capture `split` of `data` through `target` into `out` (created, or resumed when it holds a
/// capture with the same metadata).
pub fn capture<B: Backend>(
    target: &TargetModel<B>,
    target_dir: &Path,
    data: &PreparedDataset,
    out: &Path,
    opts: &CaptureOptions,
    progress: &mut dyn FnMut(CaptureProgress),
) -> Result<CaptureReport> {
    let spec = target.spec();
    let shape =
        TargetShape { num_layers: target.num_layers(), hidden_size: spec.hidden_size, vocab_size: spec.vocab_size };
    let mut metadata = contract::metadata(target_dir, shape, data, opts)?;
    let claim = provenance::claim(out, target_dir, data.dir(), &opts.split)?;
    if let Some(name) = &claim.recorded_target {
        metadata.target = name.clone();
    }
    let aux = AuxLayers { ids: metadata.aux_layer_ids.clone(), convention: AuxConvention::OutputOfLayer };
    let options = ShardWriterOptions { shard_tokens: opts.shard_tokens, ..Default::default() };
    let (mut writer, resumed) = ShardWriter::open_or_create(out, metadata, options)?;
    let resumed_samples = resumed.map_or(0, |r| r.samples);
    let available = data.len(&opts.split);
    let total = opts.max_samples.map_or(available, |m| (m as u64).min(available));

    let request = CaptureRequest::with_aux(
        aux.clone(),
        if opts.teacher.topk().is_some() { LogitsMode::All } else { LogitsMode::None },
    );
    let device = target.device();
    let start = Instant::now();
    let (mut captured_samples, mut captured_tokens) = (0u64, 0u64);
    for (index, sample) in data.samples(&opts.split)?.enumerate().take(total as usize) {
        let sample = sample?;
        if (index as u64) < resumed_samples {
            continue;
        }
        let len = sample.input_ids.len();
        let ids: Vec<i32> = sample.input_ids.iter().map(|&t| t as i32).collect();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [1, len]), &device);
        let mut cache = target.new_cache();
        let out = target.forward(input, &mut cache, &request)?;
        let aux_rows = host_f32(out.aux_concat().expect("aux layers requested"));
        let final_rows = opts.teacher.has_final_hidden().then(|| host_f32(out.final_hidden.clone()));
        let topk = match (opts.teacher.topk(), out.logits) {
            (Some(k), Some(logits)) => {
                let logprobs = log_softmax(logits.cast(DType::F32), 2);
                let (values, indices) = logprobs.topk_with_indices(k, 2);
                let ids: Vec<i32> = indices.into_data().convert::<i32>().into_vec::<i32>().expect("i32 top-k ids");
                Some((ids, host_f32(values)))
            }
            _ => None,
        };
        let mut record = aerie_data::shard::SampleRef::new(&ids, &sample.loss_mask, aux_rows.as_slice());
        if let Some(rows) = &final_rows {
            record = record.with_final_hidden(rows.as_slice());
        }
        if let Some((ids, lps)) = &topk {
            record = record.with_topk(ids, lps);
        }
        record.sample_id = Some(sample.sample_id);
        writer.push(record)?;
        captured_samples += 1;
        captured_tokens += len as u64;
        progress(CaptureProgress { samples: index as u64 + 1, total, tokens: captured_tokens });
    }
    let seconds = start.elapsed().as_secs_f64();
    let manifest = writer.finish()?;
    let dataset = ShardDataset::open(out)?;
    let verify = dataset.verify()?;
    let bytes: u64 =
        manifest.shards.iter().map(|s| std::fs::metadata(out.join(&s.file)).map(|m| m.len()).unwrap_or(0)).sum();
    Ok(CaptureReport {
        resumed_samples,
        captured_samples,
        captured_tokens,
        seconds,
        bytes_per_token: bytes as f64 / manifest.tokens.max(1) as f64,
        verify,
        warnings: claim.warnings,
    })
}

/// [`capture`] from paths: load the target in `target_dir` on `device` and open the prepared
/// dataset in `data` (`aerie data prepare`'s output), then capture its `opts.split` into `out`.
pub fn capture_prepared<B: Backend>(
    target_dir: &Path,
    data: &Path,
    out: &Path,
    opts: &CaptureOptions,
    device: &B::Device,
    progress: &mut dyn FnMut(CaptureProgress),
) -> Result<CaptureReport> {
    // Every check that needs no weights (aux layers, vocabulary, tokenizer) before the target
    // loads: a wrong flag costs a second, not the load.
    let data = PreparedDataset::open(data)?;
    contract::metadata(target_dir, TargetShape::from_config(target_dir)?, &data, opts)?;
    let target = TargetModel::<B>::load(target_dir, device)?;
    capture(&target, target_dir, &data, out, opts, progress)
}
