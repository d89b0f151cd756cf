//! aerie-eval: how good is a drafter, in the numbers serving cares about.
//!
//! This crate holds the teacher-forced validation of eagle3.md §3 ([`loss`]): the training
//! objective and its per-step accuracy and acceptance rate, evaluated on captured shards without
//! updating weights. [`batch`] turns shard samples into padded [`aerie_model::TttBatch`]es and is
//! shared with training.
#![deny(missing_docs)]

pub mod accept;
pub mod batch;
pub mod compare;
pub mod cost;
pub mod decode;
mod error;
pub mod loss;
pub mod measure;
pub mod offline;
pub mod plot;
pub mod prompts;
pub mod sglang;
pub mod verify;

pub use error::{Error, Result};
