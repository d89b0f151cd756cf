//! Fresh drafter weights, as HF's `LlamaPreTrainedModel._init_weights` does it: linear weights
//! N(0, 0.02), norm weights 1. Deterministic for a seed, host-side, so a fresh drafter is the same
//! on every backend and machine.

use crate::DrafterConfig;
use crate::checkpoint::{Dtype, HostTensor, TensorMap};
use crate::drafter::trainable_keys;
use crate::rng::SplitMix;
use aerie_data::vocab::DraftVocab;

fn shape_of(config: &DrafterConfig, key: &str) -> Vec<usize> {
    let c = config;
    let (h, d) = (c.hidden_size, c.head_dim);
    match key {
        "fc.weight" => vec![h, c.num_aux() * c.target_hidden_size],
        "midlayer.self_attn.q_proj.weight" => vec![c.num_attention_heads * d, 2 * h],
        "midlayer.self_attn.k_proj.weight" | "midlayer.self_attn.v_proj.weight" => {
            vec![c.num_key_value_heads * d, 2 * h]
        }
        "midlayer.self_attn.o_proj.weight" => vec![h, c.num_attention_heads * d],
        "midlayer.mlp.gate_proj.weight" | "midlayer.mlp.up_proj.weight" => vec![c.intermediate_size, h],
        "midlayer.mlp.down_proj.weight" => vec![h, c.intermediate_size],
        "lm_head.weight" => vec![c.draft_vocab_size, h],
        k if k.starts_with("fc_norm.") => vec![c.target_hidden_size],
        _ => vec![h],
    }
}

/// Fresh trainable weights plus the vocab map; `embed` is the target's embedding (a random
/// N(0, 0.02) one is made when `None`, for benchmarks and tests only).
pub fn init_tensors(config: &DrafterConfig, vocab: &DraftVocab, embed: Option<HostTensor>, seed: u64) -> TensorMap {
    let mut rng = SplitMix(seed);
    let mut map = TensorMap::new();
    for key in trainable_keys(config) {
        let shape = shape_of(config, &key);
        let n: usize = shape.iter().product();
        let values: Vec<f32> = if shape.len() == 1 { vec![1.0; n] } else { (0..n).map(|_| rng.normal(0.02)).collect() };
        map.insert(key, HostTensor::from_f32(shape, &values, Dtype::F32));
    }
    let embed = embed.unwrap_or_else(|| {
        let n = config.vocab_size * config.hidden_size;
        let values: Vec<f32> = (0..n).map(|_| rng.normal(0.02)).collect();
        HostTensor::from_f32(vec![config.vocab_size, config.hidden_size], &values, Dtype::F32)
    });
    map.insert("embed_tokens.weight".into(), embed);
    map.insert("d2t".into(), HostTensor::from_i64(vec![vocab.draft_vocab_size()], vocab.d2t()));
    map.insert("t2d".into(), HostTensor::from_bool(vec![vocab.vocab_size()], vocab.t2d()));
    map
}
