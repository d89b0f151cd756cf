//! aerie-model: the EAGLE-3 drafter in burn, its configuration, and checkpoint I/O.
//!
//! The drafter follows `LlamaForCausalLMEagle3` (SGLang `llama_eagle3.py`, SpecForge
//! `llama3_eagle.py`; EAGLE-3, arXiv 2503.01840). Everything is generic over the burn backend;
//! the CPU default is burn-flex, and the `cuda` feature adds burn-cuda.
//!
//! The crate sits on aerie-data (shard format, draft vocabulary, aux conventions): [`teacher`]
//! uploads shard batches to a device with their teacher ([`teacher::collate`]), and
//! [`ttt::eval`] holds the teacher-forced metrics that `aerie eval loss` and training's periodic
//! evaluation both report.
#![deny(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod decode;
mod error;

pub use config::{AuxConvention, AuxLayers, DrafterConfig, RopeConfig, RopeScaling};
pub use error::{Error, Result};
pub mod draft;
pub mod drafter;
pub mod init;
pub mod layers;
pub mod rope;
pub mod target;
pub mod teacher;
pub mod ttt;

pub use drafter::Drafter;
pub use target::{CaptureRequest, LogitsMode, TargetCache, TargetConfig, TargetModel, TargetOutput};
pub use teacher::{TargetHead, TeacherTargets, VocabStats};
pub use ttt::{TttBatch, TttMetrics, TttOptions, TttSums, ttt_forward};
