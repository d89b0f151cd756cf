//! Fresh drafter weights, as HF's `LlamaPreTrainedModel._init_weights` does it: linear weights
//! N(0, 0.02), norm weights 1. Deterministic for a seed, host-side, so a fresh drafter is the same
//! on every backend and machine.

use crate::DrafterConfig;
use crate::checkpoint::{Dtype, HostTensor, TensorMap};
use crate::drafter::trainable_keys;
use aerie_data::vocab::DraftVocab;

/// splitmix64: tiny, fast, and fully determined by the seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Box–Muller normal sample.
    fn normal(&mut self, std: f64) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos() * std) as f32
    }
}

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
