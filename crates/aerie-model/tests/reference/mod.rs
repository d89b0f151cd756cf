//! An independent, deliberately unoptimised f64 reference of the EAGLE-3 drafter forward and of
//! its training-time-test (TTT) metrics, written from `shared/reference/eagle3.md` (§1 the layer,
//! §3 the objective) with plain nested loops over `Vec<f64>`: no burn, no BLAS, no batching, no
//! masks-as-tensors. It is the ground truth the optimised burn implementation is tested against.
//!
//! Integration tests include it with `mod reference;`. Everything is computed in f64 from the f32
//! (or bf16/f16) values stored in the [`TensorMap`], so differences against an f32 implementation
//! are that implementation's rounding only.
//!
//! Conventions (eagle3.md §1): linear weights are `[out, in]` and `y[o] = Σ_i W[o][i] x[i]`; no
//! biases; RMSNorm is `w * x / sqrt(mean(x^2) + eps)`; RoPE uses the `rotate_half` convention.
//!
//! Choices where the spec leaves room are marked `CHOICE:` in the comments.
#![allow(dead_code)]
// Index loops are the point of this module: every sum is written out as in the formulas.
#![allow(clippy::needless_range_loop)]

/// A row-major matrix: `m[row][col]`.
pub type Mat = Vec<Vec<f64>>;

pub mod check;
mod fixtures;
mod ops;
mod ttt;
mod weights;

pub use fixtures::*;
pub use ops::*;
pub use ttt::*;
pub use weights::*;
