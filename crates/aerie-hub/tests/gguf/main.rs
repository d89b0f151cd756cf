//! `aerie import gguf` tests: a GGUF writer builds tiny files covering each storage type,
//! malformed and unsupported inputs, and an end-to-end conversion; `real_assets` tests convert
//! the real SmolLM2-135M-Instruct GGUF when it is present.

mod convert;
mod dequant;
mod errors;
mod model;
mod real_assets;
mod writer;
