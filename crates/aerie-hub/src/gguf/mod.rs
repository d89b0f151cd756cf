//! Import a llama.cpp GGUF checkpoint as an HF `LlamaForCausalLM` directory, so that a small
//! target model published only as GGUF (SmolLM2-135M-Instruct, assets.md) can feed capture,
//! training and evaluation like any HF model.
//!
//! - [`reader`]: the GGUF v2/v3 container, memory-mapped and bounds-checked.
//! - [`ggml_type`]: ggml's tensor type ids, their names and block layouts.
//! - [`dequant`]: ggml storage types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)
//!   to `f32`.
//! - [`names`]: the llama.cpp ↔ HF tensor-name table and the Q/K row (un)permutation.
//! - [`config`]: `llama.*` hyperparameters → `config.json` and `generation_config.json`.
//! - [`tokenizer`]: the byte-level BPE vocabulary → `tokenizer.json` and
//!   `tokenizer_config.json`, with the pre-tokenizer named by `tokenizer.ggml.pre`.
//! - [`convert`]: [`import_gguf`], which composes them and writes the directory atomically.
//!
//! ```no_run
//! use std::path::Path;
//! use aerie_hub::gguf::{ImportOptions, import_gguf};
//!
//! let report = import_gguf(
//!     Path::new("SmolLM2-135M-Instruct.Q4_1.gguf"),
//!     Path::new("smollm2"),
//!     ImportOptions::default(),
//! )?;
//! assert_eq!(report.hparams.num_hidden_layers, 30);
//! # Ok::<(), aerie_hub::Error>(())
//! ```

pub mod config;
pub mod convert;
pub mod dequant;
pub mod ggml_type;
pub mod names;
pub mod reader;
pub mod tokenizer;

pub use config::LlamaHparams;
pub use convert::{ImportOptions, ImportReport, import_gguf, tensor_to_f32};
pub use ggml_type::GgmlType;
pub use reader::{GgufFile, TensorInfo, Value};
pub use tokenizer::{GgufVocab, PreTokenizer};
