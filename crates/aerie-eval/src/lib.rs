//! aerie-eval: how good is a drafter, in the numbers serving cares about.
//!
//! Acceptance on captured shards ([`verify`], [`accept`]), decoding against the native target
//! ([`decode`]), the native target's batched generation rate ([`generation`]), serving-engine
//! measurements ([`measure`], with acceptance read from the engine's own numbers in
//! [`engine_acceptance`]) and evaluation inside an engine aerie starts ([`serve`]), cost models
//! and reports. Everything that names a serving engine (launch, HTTP, dialects, counters) is
//! `aerie_engine`'s.
//! The teacher-forced TTT metrics of eagle3.md §3 (`aerie eval loss`) live with the objective in
//! [`aerie_model::ttt::eval`], shared with training's periodic evaluation; shard batches come
//! from [`aerie_model::ttt::batch::collate`].
#![deny(missing_docs)]

pub mod accept;
pub mod compare;
pub mod cost;
pub mod cycles;
pub mod decode;
pub mod engine_acceptance;
mod error;
pub mod generation;
pub mod measure;
pub mod offline;
pub mod plot;
pub mod profile;
pub mod prompts;
pub mod serve;
pub mod surface;
pub mod verify;

pub use error::{Error, Result};
