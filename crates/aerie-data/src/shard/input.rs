//! What a capture engine hands the writer: one sample's tensors, borrowed from its own buffers
//! in whatever float type it computed them in. Conversion to the dataset's storage dtype happens
//! in the writer, so engines never need to know how the dataset is stored.

use half::{bf16, f16};

/// Hidden-state rows handed to the writer, row-major, in whatever type the capture engine has.
/// They are converted to the dataset's storage dtype (round-to-nearest-even for f16/bf16); the
/// same type is copied bit for bit.
#[derive(Debug, Clone, Copy)]
pub enum HiddenInput<'a> {
    /// float32 values.
    F32(&'a [f32]),
    /// float16 values.
    F16(&'a [f16]),
    /// bfloat16 values.
    BF16(&'a [bf16]),
}

impl HiddenInput<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            HiddenInput::F32(v) => v.len(),
            HiddenInput::F16(v) => v.len(),
            HiddenInput::BF16(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> From<&'a [f32]> for HiddenInput<'a> {
    fn from(v: &'a [f32]) -> Self {
        HiddenInput::F32(v)
    }
}

impl<'a> From<&'a Vec<f32>> for HiddenInput<'a> {
    fn from(v: &'a Vec<f32>) -> Self {
        HiddenInput::F32(v)
    }
}

impl<'a> From<&'a [f16]> for HiddenInput<'a> {
    fn from(v: &'a [f16]) -> Self {
        HiddenInput::F16(v)
    }
}

impl<'a> From<&'a [bf16]> for HiddenInput<'a> {
    fn from(v: &'a [bf16]) -> Self {
        HiddenInput::BF16(v)
    }
}

/// Top-k teacher rows of one sample, [T, K] row-major each.
#[derive(Debug, Clone, Copy)]
pub struct TopKRef<'a> {
    /// Target token ids, best first.
    pub ids: &'a [i32],
    /// Their log-probabilities over the full target vocabulary, descending. Stored as f32.
    pub logprobs: &'a [f32],
}

/// One sample to append, borrowed from the capture engine's buffers. All tensors cover the same
/// T tokens; hidden rows are row-major.
#[derive(Debug, Clone, Copy)]
pub struct SampleRef<'a> {
    /// Token ids, T of them.
    pub input_ids: &'a [i32],
    /// 1 on tokens to train on, else 0; T of them, unshifted.
    pub loss_mask: &'a [u8],
    /// [T, A*Ht]: the captured layers' residual streams, concatenated low → high per token.
    pub aux_hidden: HiddenInput<'a>,
    /// [T, Ht]: required when the teacher includes `final-hidden`, refused otherwise.
    pub final_hidden: Option<HiddenInput<'a>>,
    /// [T, K]: required when the teacher includes `topk:K`, refused otherwise.
    pub topk: Option<TopKRef<'a>>,
    /// The source sample's id, for dedup and resume. Either every sample of a dataset has one
    /// or none has.
    pub sample_id: Option<i64>,
}

impl<'a> SampleRef<'a> {
    /// A sample with no teacher and no id yet.
    pub fn new(input_ids: &'a [i32], loss_mask: &'a [u8], aux_hidden: impl Into<HiddenInput<'a>>) -> Self {
        Self { input_ids, loss_mask, aux_hidden: aux_hidden.into(), final_hidden: None, topk: None, sample_id: None }
    }

    /// Attach the final hidden state.
    pub fn with_final_hidden(mut self, rows: impl Into<HiddenInput<'a>>) -> Self {
        self.final_hidden = Some(rows.into());
        self
    }

    /// Attach top-k ids and log-probs.
    pub fn with_topk(mut self, ids: &'a [i32], logprobs: &'a [f32]) -> Self {
        self.topk = Some(TopKRef { ids, logprobs });
        self
    }

    /// Attach the source id.
    pub fn with_sample_id(mut self, id: i64) -> Self {
        self.sample_id = Some(id);
        self
    }
}
