//! aerie-data: the datasets an EAGLE-3 drafter trains on.
//!
//! Capture engines run the target model over chat data and record, per token, the residual
//! stream at a few target layers (`aux_hidden`) plus a teacher (the final hidden state, or top-k
//! log-probs); eagle3.md §2–§3 says what those are. [`shard`] defines how that is stored on disk
//! (`aerie-shard/1`, documented in `docs/shard-format.md`) and implements a crash-safe writer and
//! a zero-copy memory-mapped reader; [`shard::batch`] pads samples into host arrays. The crate
//! has no tensor backend: aerie-model uploads those arrays to a device. [`vocab`] owns the draft
//! vocabulary ([`vocab::DraftVocab`]) every stage uses.
//!
//! ```
//! use std::collections::BTreeMap;
//! use aerie_data::shard::{
//!     AuxConvention, HiddenDtype, SampleRef, ShardDataset, ShardMetadata, ShardWriter,
//!     ShardWriterOptions, Teacher,
//! };
//!
//! # fn main() -> aerie_data::Result<()> {
//! let dir = std::env::temp_dir().join(format!("aerie-data-doctest-{}", std::process::id()));
//! # let _ = std::fs::remove_dir_all(&dir);
//! let metadata = ShardMetadata {
//!     target: "tiny/target".into(),
//!     target_num_layers: 8,
//!     target_vocab_size: 100,
//!     aux_layer_ids: vec![1, 3, 4],
//!     aux_convention: AuxConvention::OutputOfLayer,
//!     hidden_size: 2,
//!     dtype: HiddenDtype::BF16,
//!     tokenizer_digest: "0".repeat(64),
//!     chat_template: "none".into(),
//!     teacher: Teacher::FinalHidden,
//!     created_by: "doctest".into(),
//!     extra: BTreeMap::new(),
//! };
//! let mut writer = ShardWriter::create(&dir, metadata, ShardWriterOptions::default())?;
//! let aux = vec![0.5f32; 3 * 6]; // 3 tokens × (3 layers × hidden 2)
//! let last = vec![1.0f32; 3 * 2];
//! writer.push(SampleRef::new(&[5, 6, 7], &[0, 1, 1], &aux).with_final_hidden(&last).with_sample_id(42))?;
//! writer.finish()?;
//!
//! let dataset = ShardDataset::open(&dir)?;
//! let sample = dataset.sample(0).unwrap();
//! assert_eq!(&*sample.input_ids(), &[5, 6, 7]);
//! assert_eq!(sample.sample_id(), Some(42));
//! assert_eq!(&*sample.aux_hidden().to_f32(), &aux[..]);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

// Shards are little-endian and views reinterpret mapped bytes in place.
#[cfg(target_endian = "big")]
compile_error!("aerie-data reads shards in place and supports little-endian targets only");

mod arrowutil;
pub mod atomic;
pub mod conversation;
mod error;
pub mod generation;
pub mod hf_config;
pub mod limits;
pub mod lock;
pub mod owned;
pub mod paths;
pub mod prepare;
pub mod readers;
pub mod shard;
pub mod st_header;
pub mod template;
pub mod tokenizer;
pub mod vocab;

pub use error::{Error, MetadataError, Result};
