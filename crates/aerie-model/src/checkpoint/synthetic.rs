//! Deterministic synthetic drafters: a valid checkpoint (every tensor, a d2t/t2d map obeying
//! eagle3.md §4) built from a seed, for tests, smoke runs and examples that must not depend on
//! downloaded weights. Values are small pseudo-random numbers, not a trained model.

use std::path::PathBuf;

use super::tensors::{Dtype, HostTensor, TensorMap};
use super::{Dialect, DrafterCheckpoint, keys, validate};
use crate::rng::SplitMix as Rng;
use crate::{AuxConvention, AuxLayers, DrafterConfig, RopeConfig, RopeScaling};

/// A scaled-down drafter shape that exercises every path a Kimi-sized one does (GQA, head_dim
/// != H/nH, reduced vocab): H 64, 4 heads of 32 with 2 KV heads, I 96, V 512, Vd 64, aux
/// [1, 4, 6] output-of-layer of a 10-layer target.
pub fn tiny_config() -> DrafterConfig {
    DrafterConfig {
        hidden_size: 64,
        target_hidden_size: 64,
        intermediate_size: 96,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-5,
        rope: RopeConfig { theta: 10000.0, scaling: RopeScaling::Default },
        max_position_embeddings: 4096,
        vocab_size: 512,
        draft_vocab_size: 64,
        aux_layers: AuxLayers { ids: vec![1, 4, 6], convention: AuxConvention::OutputOfLayer },
        fc_norm: false,
        norm_output: false,
        norm_before_residual: false,
        target_name_or_path: Some("synthetic/tiny-target".into()),
        mla: None,
    }
}

/// [`tiny_config`] with multi-latent attention (`Eagle3DeepseekV2ForCausalLM`): q_lora 24,
/// kv_lora 16, heads of 16 + 8 (rotated) query/key and 12 value dims, YaRN RoPE as the published
/// Kimi MLA drafters carry it (factor 32, mscale 1, mscale_all_dim 1), full vocabulary (no d2t).
pub fn tiny_mla_config() -> DrafterConfig {
    DrafterConfig {
        num_key_value_heads: 4,
        head_dim: 8,
        rope: RopeConfig {
            theta: 50000.0,
            scaling: RopeScaling::Yarn {
                factor: 32.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
                mscale: Some(1.0),
                mscale_all_dim: Some(1.0),
            },
        },
        draft_vocab_size: 512,
        mla: Some(crate::MlaConfig {
            q_lora_rank: 24,
            kv_lora_rank: 16,
            qk_nope_head_dim: 16,
            qk_rope_head_dim: 8,
            v_head_dim: 12,
        }),
        ..tiny_config()
    }
}

/// A valid d2t/t2d pair: `vd` distinct target ids out of `v`, chosen by `seed`, ascending.
pub fn vocab_map(v: usize, vd: usize, seed: u64) -> (Vec<i64>, Vec<bool>) {
    let mut rng = Rng(seed);
    let mut ids: Vec<usize> = (0..v).collect();
    for i in 0..vd.min(v) {
        let j = i + (rng.next_u64() % (v - i) as u64) as usize;
        ids.swap(i, j);
    }
    let mut chosen: Vec<usize> = ids[..vd.min(v)].to_vec();
    chosen.sort_unstable();
    let d2t: Vec<i64> = chosen.iter().enumerate().map(|(i, &id)| id as i64 - i as i64).collect();
    (d2t.clone(), validate::derive_t2d(&d2t, v))
}

/// A complete drafter for `cfg` with float weights in `dtype` (embedding included, d2t/t2d
/// included when the vocab is reduced). Norm weights are near 1, everything else near 0.
pub fn random_drafter(cfg: &DrafterConfig, dtype: Dtype, seed: u64) -> DrafterCheckpoint {
    let mut rng = Rng(seed);
    let mut tensors = TensorMap::new();
    for e in validate::expected_tensors(cfg) {
        if e.kind != validate::ElemKind::Float {
            continue;
        }
        let n: usize = e.shape.iter().product();
        let is_norm = e.shape.len() == 1;
        let values: Vec<f32> =
            (0..n).map(|_| if is_norm { 1.0 + 0.1 * rng.signed_unit() } else { 0.05 * rng.signed_unit() }).collect();
        tensors.insert(e.name, HostTensor::from_f32(e.shape, &values, dtype));
    }
    if cfg.draft_vocab_size < cfg.vocab_size {
        let (d2t, t2d) = vocab_map(cfg.vocab_size, cfg.draft_vocab_size, seed ^ 0xD27);
        tensors.insert(keys::D2T.into(), HostTensor::from_i64(vec![d2t.len()], &d2t));
        tensors.insert(keys::T2D.into(), HostTensor::from_bool(vec![t2d.len()], &t2d));
    }
    DrafterCheckpoint {
        config: cfg.clone(),
        dialect: Dialect::Sglang,
        weight_dtype: dtype,
        tensors,
        dir: PathBuf::new(),
        source: None,
    }
}
