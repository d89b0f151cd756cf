//! Fresh drafter weights, as HF's `LlamaPreTrainedModel._init_weights` does it: linear weights
//! N(0, 0.02), norm weights 1 (the MLA latent norms included). Deterministic for a seed, host-side, so a fresh drafter is the same
//! on every backend and machine.

use crate::DrafterConfig;
use crate::checkpoint::validate::{self, ElemKind};
use crate::checkpoint::{Dtype, HostTensor, TensorMap, keys};
use crate::rng::SplitMix;
use aerie_data::vocab::DraftVocab;

/// Fresh trainable weights plus the vocab map; `embed` is the target's embedding (a random
/// N(0, 0.02) one is made when `None`, for benchmarks and tests only).
pub fn init_tensors(config: &DrafterConfig, vocab: &DraftVocab, embed: Option<HostTensor>, seed: u64) -> TensorMap {
    let mut rng = SplitMix(seed);
    let mut map = TensorMap::new();
    for e in validate::expected_tensors(config) {
        if e.kind != ElemKind::Float || e.name == keys::EMBED {
            continue;
        }
        let (key, shape) = (e.name, e.shape);
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
