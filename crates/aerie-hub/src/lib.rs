//! aerie-hub: move EAGLE-3 drafters between trainers and serving engines, and tell what a drafter
//! checkpoint holds before an engine loads it silently wrong.
//!
//! - [`export()`] writes a drafter in the SGLang (`LlamaForCausalLMEagle3`, `midlayer.*`,
//!   output-of-layer aux ids) or the vLLM/speculators dialect (`Eagle3Speculator`, `layers.0.*`,
//!   input-of-layer aux ids), then reads its own output back and checks every tensor bit for bit.
//! - [`inspect()`] reports shapes, parameter counts, the vocab map and the aux layers in both
//!   conventions, and lints for the mistakes that cost accept length without an error message
//!   (eagle3.md §5). It reads tensor headers only, plus `d2t`/`t2d`.
//!
//! Key renames and config dialects live in [`aerie_model::checkpoint`]; this crate only
//! composes them. Library only: the `aerie` binary maps [`InspectReport::exit_code`] and errors
//! to process exit codes.
//!
//! ```no_run
//! use std::path::Path;
//! use aerie_hub::{ExportOptions, export, inspect};
//! use aerie_model::checkpoint::Dialect;
//!
//! let report = inspect(Path::new("drafter"), Some(Path::new("target-model")))?;
//! if report.exit_code(false) == 0 {
//!     export(Path::new("drafter"), Dialect::Sglang, Path::new("out"), ExportOptions::default())?;
//! }
//! # Ok::<(), aerie_hub::Error>(())
//! ```
#![deny(missing_docs)]

pub mod assets;
pub mod doctor;
mod error;
pub mod export;
pub mod gguf;
pub mod hf;
pub mod inspect;
pub mod published;
pub mod served;
mod severity;

pub use error::{Error, Result};
pub use export::{ExportOptions, ExportReport, ExportedTensor, export};
pub use inspect::{Finding, InspectReport, Severity, inspect};
