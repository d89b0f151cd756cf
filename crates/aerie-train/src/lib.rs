//! aerie-train: fine-tune EAGLE-3 drafters (EAGLE-3, arXiv 2503.01840) with the training-time
//! test objective of eagle3.md §3, following the reference trainer (SpecForge
//! `scripts/train_eagle3.py`, `core/eagle3.py`) where it is right and saying where it differs.
//!
//! - [`config`]: `TrainConfig` (TOML), key table with "did you mean", `--set` overrides, the
//!   fingerprint that guards resumes.
//! - [`init`]: a fresh drafter shaped after the target, or a warm start that keeps d2t/t2d.
//! - [`data`]: hold-out split, seeded per-epoch shuffle, length bucketing under a token budget.
//! - [`objective`]: soft-CE, TV and LK losses normalised over the whole optimizer step.
//! - [`anchor`]: L2-SP, the pull toward a warm start's weights (`optim.anchor_weight`).
//! - [`replay`]: on-policy replay of the positions greedy decoding drafts from
//!   (`optim.replay_weight`).
//! - [`grads`]: stable parameter ids, gradient sums across micro-batches, global norm clipping.
//! - [`collective`]: the all-reduce that sums the replicas' gradients (host memory on every
//!   backend, NCCL on CUDA).
//! - [`step`]: the [`Trainer`] (AdamW on float32 weights, data parallelism: one copy of the
//!   weights and optimizer per device, gradients summed through [`collective`]).
//! - [`checkpoint`]: atomic `checkpoint-<step>/` directories loadable as drafters, plus the
//!   training state for a bit-identical resume.
//! - [`eval`]: periodic evaluation through the metrics of `aerie eval loss`
//!   ([`aerie_model::ttt::eval`]).
//! - [`metrics`]: `metrics.jsonl`, its TensorBoard mirror and the curves drawn from it;
//!   [`schedule`], and [`run`] with the entry point [`train`], one named function per step of a
//!   run.
//! - [`select`]: choosing the checkpoint by decoded τ (`[select]`), `RUN/best/`.
//! - [`bench`]: throughput and memory of the TTT objective for a drafter shape or a config
//!   (`aerie bench ttt|train`).
//!
//! ```no_run
//! use std::ops::ControlFlow;
//! use std::path::Path;
//! use aerie_train::{RunOptions, TrainConfig, train};
//!
//! type B = burn::backend::Autodiff<burn::backend::Flex>;
//! let cfg = TrainConfig::load(Path::new("configs/smollm2-quickstart.toml"), &[])?;
//! let opts = RunOptions::<B> { devices: vec![Default::default()], resume: None, all_reduce: None, selector: None };
//! let summary = train(&cfg, &opts, &mut |_event| ControlFlow::Continue(()))?;
//! println!("{} steps, {:.0} tokens/s", summary.steps, summary.tokens_per_s);
//! # Ok::<(), aerie_train::Error>(())
//! ```
#![deny(missing_docs)]

pub mod anchor;
pub mod bench;
pub mod checkpoint;
pub mod collective;
pub mod config;
pub mod data;
mod error;
pub mod eval;
mod fan_out;
pub mod grads;
pub mod init;
pub mod metrics;
pub mod objective;
pub mod replay;
pub mod run;
pub mod schedule;
pub mod select;
pub mod step;

pub use config::{LossKind, TrainConfig};
pub use error::{Error, Result};
pub use metrics::{Event, Status, StepProgress, Summary};
pub use run::{RunOptions, train};
pub use step::Trainer;
