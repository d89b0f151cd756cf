//! The native target model: an HF causal LM (transformers `modeling_llama.py`, plus the Qwen2 and
//! Qwen3 deltas) run in burn, with a KV cache, capture of the aux features EAGLE-3 consumes
//! (eagle3.md §2) and the teacher's logits, and a masked forward for speculative verification.
//!
//! - [`TargetConfig`] (HF `config.json`) resolves into a [`TargetSpec`] ([`config`]).
//! - [`TargetModel`] is loaded from an HF directory ([`load`]) and run by [`llama`].
//! - [`TargetCache`] holds keys/values ([`cache`]).
//! - [`BatchGenerator`] decodes many sequences at once, continuously batched ([`batch`]).
//! - [`bench::bench_generate`] measures that batched generation against the machine's limits.
//!
//! ```no_run
//! use std::path::Path;
//! use aerie_model::native::{CaptureRequest, LogitsMode, TargetModel};
//! use aerie_model::AuxLayers;
//! use burn::backend::Flex;
//! use burn::tensor::{Int, Tensor, TensorData};
//!
//! let device = Default::default();
//! let target = TargetModel::<Flex>::load(Path::new("SmolLM2-135M-Instruct"), &device)?;
//! let mut cache = target.new_cache();
//! let want = CaptureRequest::with_aux(AuxLayers::default_for_target(target.num_layers()), LogitsMode::All);
//! let ids = Tensor::<Flex, 2, Int>::from_data(TensorData::new(vec![1i64, 504, 3156], [1, 3]), &device);
//! let out = target.forward(ids, &mut cache, &want)?;
//! let features = out.aux_concat().expect("aux asked for"); // [1, 3, 3·576], low → high
//! # Ok::<(), aerie_model::Error>(())
//! ```

pub mod batch;
pub mod bench;
pub mod cache;
pub mod config;
pub mod llama;
pub mod load;

use burn::tensor::{Tensor, backend::Backend};

pub use batch::{BatchGenerator, Generated, GenerationRequest};
pub use cache::TargetCache;
pub use config::{TargetArch, TargetConfig, TargetSpec, TokenIds};
pub use llama::TargetModel;

use crate::AuxLayers;

/// Which positions get logits (the `[.., V]` head is the most expensive matmul of a small model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogitsMode {
    /// Every new position: `[B, S, V]` (teacher logits, verification).
    #[default]
    All,
    /// The last new position only: `[B, 1, V]` (decoding).
    Last,
    /// None (feature capture from the final hidden state).
    None,
}

/// What a forward should return besides the final hidden state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CaptureRequest {
    /// Layers whose pre-norm residual stream to return, with their numbering convention; the
    /// order of `ids` is the order of [`TargetOutput::aux`] (low → high for EAGLE-3).
    pub aux: Option<AuxLayers>,
    /// Logits wanted.
    pub logits: LogitsMode,
}

impl CaptureRequest {
    /// Logits only.
    pub fn logits(mode: LogitsMode) -> Self {
        Self { aux: None, logits: mode }
    }

    /// Aux features at `layers` plus logits per `mode`.
    pub fn with_aux(layers: AuxLayers, mode: LogitsMode) -> Self {
        Self { aux: Some(layers), logits: mode }
    }
}

/// The result of a target forward over S new tokens.
#[derive(Debug, Clone)]
pub struct TargetOutput<B: Backend> {
    /// `[B, S, V]` ([`LogitsMode::All`]), `[B, 1, V]` ([`LogitsMode::Last`]) or `None`.
    pub logits: Option<Tensor<B, 3>>,
    /// Per requested layer, the residual stream `[B, S, H]` BEFORE any norm. Output-of-layer id i
    /// is the stream after decoder layer i, HF `output_hidden_states[i + 1]` (input-of-layer id
    /// i is `output_hidden_states[i]`; id 0 is the embedding output). For the LAST layer HF
    /// returns the post-norm state instead; this returns the pre-norm one, and the post-norm
    /// state is [`Self::final_hidden`].
    pub aux: Vec<Tensor<B, 3>>,
    /// `[B, S, H]` after the final norm (the teacher's input to the head).
    pub final_hidden: Tensor<B, 3>,
}

impl<B: Backend> TargetOutput<B> {
    /// The aux features concatenated along the hidden axis in request order, `[B, S, A·H]` (what
    /// the drafter's `fc` consumes); `None` when none were requested.
    pub fn aux_concat(&self) -> Option<Tensor<B, 3>> {
        if self.aux.is_empty() { None } else { Some(Tensor::cat(self.aux.clone(), 2)) }
    }
}
