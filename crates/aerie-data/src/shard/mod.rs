//! The capture shard format `aerie-shard/1` and `/2` (compact encodings): the contract between capture engines (this
//! workspace's, or a Python SGLang worker) and the trainer. See `docs/shard-format.md` for the
//! normative description; this module is its reference implementation.
//!
//! A dataset is a directory of plain safetensors files (`shard-00000.safetensors`, ...) plus a
//! `manifest.json` listing the complete ones. Inside a shard, samples are concatenated along the
//! token axis and delimited by `sample_offsets`. [`ShardWriter`] appends samples with crash-safe
//! shard rotation and resume; [`ShardDataset`] memory-maps a dataset, validates it, and hands out
//! zero-copy [`SampleView`]s; [`batch`] pads them into host arrays for a trainer or evaluator.

pub mod batch;
pub mod bench;
mod checks;
mod codec;
mod convert;
mod encoding;
mod fsutil;
mod header;
mod input;
mod manifest;
mod metadata;
mod reader;
mod verify;
mod view;
mod writer;

pub use convert::{ConvertOptions, ConvertReport, convert};
pub use encoding::{FORMAT, FORMAT_V2, FP8_E4M3_MAX, FloatDtype, HiddenDtype, INT4_GROUP};
pub use fsutil::{MANIFEST_FILE, sha256_file, shard_file_name};
pub use input::{HiddenInput, SampleRef, TopKRef};
pub use manifest::{Manifest, ShardEntry};
pub use metadata::{AuxConvention, FORMAT_MAJOR, ShardMetadata, Teacher, format_is_supported};
pub use reader::{Samples, ShardDataset};
pub use verify::VerifyReport;
pub use view::{HiddenRows, SampleView, TopKView};
pub use writer::{ResumeInfo, ShardWriter, ShardWriterOptions};

/// Tensor names inside a shard, as the format fixes them.
pub mod names {
    /// int32 `[T]`: token ids.
    pub const INPUT_IDS: &str = "input_ids";
    /// uint8 `[T]`: 1 on tokens to train on.
    pub const LOSS_MASK: &str = "loss_mask";
    /// int64 `[N+1]`: sample i is tokens `offsets[i]..offsets[i+1]`.
    pub const SAMPLE_OFFSETS: &str = "sample_offsets";
    /// float `[T, A*Ht]`: captured residual streams, low → high.
    pub const AUX_HIDDEN: &str = "aux_hidden";
    /// f32 `[T, groups]`: the scales of a scaled `aux_hidden` (format 2).
    pub const AUX_HIDDEN_SCALES: &str = "aux_hidden_scales";
    /// float `[T, Ht]`: the target's post-final-norm state.
    pub const FINAL_HIDDEN: &str = "final_hidden";
    /// f32 `[T, groups]`: the scales of a scaled `final_hidden` (format 2).
    pub const FINAL_HIDDEN_SCALES: &str = "final_hidden_scales";
    /// int32 `[T, K]`: top-k target token ids.
    pub const TOPK_IDS: &str = "teacher_topk_ids";
    /// f16/f32 `[T, K]`: their log-probs over the full target vocabulary, descending.
    pub const TOPK_LOGPROBS: &str = "teacher_topk_logprobs";
    /// int64 `[N]`: source sample ids.
    pub const SAMPLE_IDS: &str = "sample_ids";
}
