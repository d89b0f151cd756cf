//! The KV cache of an engine aerie starts to evaluate drafters (`eval serve`, `compare
//! --engine`), sized for the run instead of the engine's share of the device.
//!
//! vLLM's default reserves `--gpu-memory-utilization` (0.85) of the device, and on its CPU backend
//! of the whole machine's memory, refusing to start unless that much is free (issue 34 measured
//! it with 12 of 24 GB free). An evaluation needs only its conversations in flight, each at most
//! `max_model_len` tokens: aerie asks for that (`--kv-cache-memory-bytes` for vLLM, which skips
//! the memory check; `--max-total-tokens` for SGLang) unless `--kv-cache-gb` says otherwise.
//! vLLM's legacy `VLLM_CPU_KVCACHE_SPACE`, when set in the environment, still wins over both
//! (vLLM's own rule, `platforms/cpu.py`).

use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// A quarter more than the tokens asked, for the engines' block rounding and the drafts in flight.
const SLACK: f64 = 1.25;

/// The KV cache an engine is started with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvCache {
    /// Bytes (vLLM's `--kv-cache-memory-bytes`).
    pub bytes: u64,
    /// Tokens it holds (SGLang's `--max-total-tokens`).
    pub tokens: u64,
}

/// Bytes of KV cache one token takes in every layer of the text model of `config` (plus one
/// layer for an EAGLE-3 drafter) at `dtype_bytes` per element: multi-latent attention caches one
/// latent of `kv_lora_rank + qk_rope_head_dim`, other attention a key and a value per KV head.
pub fn bytes_per_token(config: &Value, dtype_bytes: u64) -> Option<u64> {
    let text = aerie_data::hf_config::text_model(config);
    let u = |k: &str| text.get(k).and_then(Value::as_u64);
    let layers = u("num_hidden_layers")?;
    let width = match u("kv_lora_rank") {
        Some(rank) => rank + u("qk_rope_head_dim").unwrap_or(0),
        None => {
            let heads = u("num_attention_heads")?;
            let kv_heads = u("num_key_value_heads").unwrap_or(heads);
            let head_dim = u("head_dim").unwrap_or(u("hidden_size")? / heads.max(1));
            2 * kv_heads * head_dim
        }
    };
    Some((layers + 1) * width * dtype_bytes)
}

impl KvCache {
    /// The cache for `sequences` conversations of at most `max_model_len` tokens each in the
    /// target at `target` (f32, aerie's dtype for engines; a narrower `--dtype` only needs
    /// less), or `gib` GiB when given.
    pub fn for_run(target: &Path, max_model_len: usize, sequences: usize, gib: Option<f64>) -> Result<Self> {
        let path = aerie_data::hf_config::config_json_path(target);
        let bad = |message: String| Error::Incompatible(format!("{}: {message}", path.display()));
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let config: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
        let per_token = bytes_per_token(&config, 4).filter(|&b| b > 0).ok_or_else(|| {
            bad("no attention shape to size the KV cache by (num_hidden_layers, num_attention_heads, ...): \
                 give --kv-cache-gb"
                .into())
        })?;
        Ok(match gib {
            Some(g) if g.is_finite() && g > 0.0 => {
                let bytes = (g * f64::from(1u32 << 30)) as u64;
                Self { bytes, tokens: bytes / per_token }
            }
            Some(g) => return Err(Error::Incompatible(format!("--kv-cache-gb {g}: give a size above 0 GiB"))),
            None => {
                let tokens = ((sequences.max(1) * max_model_len) as f64 * SLACK).ceil() as u64;
                Self { bytes: tokens * per_token + (64 << 20), tokens }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sized_for_the_conversations_in_flight_or_as_given() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64: (30 + 1) · 2 · 3 · 64 · 4 bytes a token.
        let smol = json!({"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "hidden_size": 576});
        assert_eq!(bytes_per_token(&smol, 4), Some(31 * 2 * 3 * 64 * 4));
        let mla = json!({"text_config": {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
            "num_attention_heads": 64}});
        assert_eq!(bytes_per_token(&mla, 2), Some(62 * 576 * 2));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), smol.to_string()).unwrap();
        let kv = KvCache::for_run(dir.path(), 4096, 2, None).unwrap();
        assert_eq!(kv.tokens, 10_240);
        assert_eq!(kv.bytes, 10_240 * 47_616 + (64 << 20));
        assert!(kv.bytes < 1 << 30, "{kv:?}: well under a GiB for SmolLM2, not 85% of the machine");
        let given = KvCache::for_run(dir.path(), 4096, 2, Some(1.5)).unwrap();
        assert_eq!((given.bytes, given.tokens), (3 << 29, (3 << 29) / 47_616));
        assert!(KvCache::for_run(dir.path(), 4096, 1, Some(0.0)).unwrap_err().to_string().contains("above 0"));
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        assert!(KvCache::for_run(dir.path(), 4096, 1, None).unwrap_err().to_string().contains("--kv-cache-gb"));
    }
}
