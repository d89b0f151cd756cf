//! aerie-model: the EAGLE-3 drafter in burn, its configuration and checkpoint I/O, and the
//! native target model whose features it learns from.
//!
//! The drafter follows `LlamaForCausalLMEagle3` (SGLang `llama_eagle3.py`, SpecForge
//! `llama3_eagle.py`; EAGLE-3, arXiv 2503.01840). Everything is generic over the burn backend;
//! the CPU default is burn-flex, and the `cuda` feature adds burn-cuda.
//!
//! - [`drafter`]: the drafter model, and its two drafting modes (at decode time over a KV cache,
//!   and offline over every position of a captured sequence) with the draft tree they share.
//! - [`ttt`]: the training-time-test objective over a batch, with [`teacher`] targets;
//!   [`ttt::batch`] uploads shard batches to a device with their teacher, and [`ttt::eval`]
//!   holds the teacher-forced metrics that `aerie eval loss` and training's periodic evaluation
//!   both report.
//! - [`teacher`]: the teacher's distribution over the draft vocabulary, from the target head or
//!   stored top-k, and the per-sequence full-vocabulary statistics.
//! - [`native`]: the native target engine (Llama/Qwen2/Qwen3 with KV cache and aux outputs).
//! - [`layers`]: the Llama building blocks both models use (linear, RMSNorm, SwiGLU MLP);
//!   [`rope`]: rotary position embeddings; [`kernels`]: the CPU backend's fused host kernels.
//! - [`config`], [`init`], [`rng`] and [`checkpoint`]: drafter configuration, initialisation,
//!   the one PRNG and the checkpoint formats; [`autodiff`]: the guard that keeps concurrent
//!   backward passes from losing gradients (burn 0.21's graph sweep race).
//!
//! The crate sits on aerie-data (shard format, draft vocabulary, aux conventions).
#![deny(missing_docs)]

pub mod autodiff;
pub mod checkpoint;
pub mod config;
pub mod drafter;
mod error;
pub mod init;
pub mod kernels;
pub mod layers;
pub mod native;
pub mod precision;
pub mod rng;
pub mod rope;
pub mod teacher;
pub mod ttt;

pub use config::{AuxConvention, AuxLayers, DrafterConfig, MlaConfig, RopeConfig, RopeScaling};
pub use drafter::Drafter;
pub use error::{Error, Result};
pub use native::{CaptureRequest, LogitsMode, TargetCache, TargetConfig, TargetModel, TargetOutput};
pub use teacher::{TargetHead, TeacherTargets, VocabStats};
pub use ttt::{TttBatch, TttMetrics, TttOptions, TttSums, ttt_forward};
