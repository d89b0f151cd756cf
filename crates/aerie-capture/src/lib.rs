//! aerie-capture: the CPU/GPU capture engine of aerie.
//!
//! It runs the native target ([`aerie_model::TargetModel`]) over a prepared dataset
//! (`aerie data prepare`) and writes what EAGLE-3 training consumes: the pre-norm residual stream
//! at the aux layers, and a teacher (the post-norm final hidden state, or top-k log-probs), as
//! an `aerie-shard/1` dataset (docs/shard-format.md). Targets the native engine does not run
//! (Kimi-K2.5 under SGLang with tensor parallelism, any HF causal LM under transformers) are
//! captured by the Python worker in `python/aerie_capture`, which [`python`] starts and whose
//! dataset it verifies with aerie's reader (docs/capture-python.md).
//!
//! Captures resume: shards are committed atomically in input order, so a rerun after `kill -9`
//! skips the committed samples and produces exactly the dataset an uninterrupted run produces.
//!
//! [`regenerate()`] is the other job that runs the target: it replaces every assistant turn of a
//! chat dataset by the target's own answer (self-distillation data), resumable the same way.
#![deny(missing_docs)]

pub mod contract;
mod error;
pub mod provenance;
pub mod python;
pub mod regenerate;
mod run;

pub use error::{Error, Result};
pub use python::{PythonCapture, PythonEngine, PythonReport};
pub use regenerate::{RegenerateOptions, RegenerateProgress, RegenerateReport, regenerate, regenerate_server};
pub use run::{CaptureOptions, CaptureProgress, CaptureReport, capture, capture_prepared};
