//! `aerie import gguf FILE --out DIR`: turn a llama-architecture GGUF file into an HF
//! `LlamaForCausalLM` directory (float32 safetensors, config, tokenizer), written atomically
//! and read back before it is moved into place.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use aerie_hub::gguf::{ImportOptions, import_gguf};
use anyhow::{Context, Result};
use clap::Subcommand;

/// `aerie import ...`
#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Convert a llama.cpp GGUF (llama architecture; F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q6_K
    /// tensors, byte-level BPE vocabulary) into an HF directory with float32 weights.
    Gguf {
        /// The GGUF file.
        file: PathBuf,
        /// Output directory (written atomically).
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing directory at --out (only once the new one is complete).
        #[arg(long)]
        force: bool,
        /// Print the import report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run `aerie import`.
pub fn run(cmd: ImportCommand) -> Result<()> {
    match cmd {
        ImportCommand::Gguf { file, out, force, json } => {
            let t0 = Instant::now();
            let report = import_gguf(&file, &out, ImportOptions { force })
                .with_context(|| format!("importing {} into {}", file.display(), out.display()))?;
            let secs = t0.elapsed().as_secs_f64();
            // writeln! rather than println!: a closed pipe (`| head`) is an error, not a panic.
            if json {
                let mut v = serde_json::to_value(&report)?;
                v["seconds"] = secs.into();
                writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                let h = &report.hparams;
                let types: Vec<String> = report.source_types.iter().map(|(t, n)| format!("{n} {t}")).collect();
                writeln!(
                    std::io::stdout(),
                    "imported {} → {} in {secs:.1}s: {} tensors ({}), {:.1}M parameters as float32, \
                     {} layers × hidden {} ({} heads / {} KV heads of {}), vocab {}, {} embeddings, \
                     tokenizer pre `{}`; read back and verified",
                    report.source.display(),
                    report.out.display(),
                    report.tensors,
                    types.join(", "),
                    report.parameters as f64 / 1e6,
                    h.num_hidden_layers,
                    h.hidden_size,
                    h.num_attention_heads,
                    h.num_key_value_heads,
                    h.head_dim,
                    h.vocab_size,
                    if report.tie_word_embeddings { "tied" } else { "untied" },
                    report.pre_tokenizer,
                )?;
            }
            Ok(())
        }
    }
}
