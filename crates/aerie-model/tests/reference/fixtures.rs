//! Deterministic random fixtures: tiny checkpoints, configs and sequences from seeds.

#![allow(dead_code)]
#![allow(clippy::needless_range_loop)]

use aerie_model::checkpoint::{Dtype, HostTensor, TensorMap};
use aerie_model::{AuxConvention, AuxLayers, DrafterConfig, RopeConfig, RopeScaling};

use super::*;

// ------------------------------------------------------------------------------------------------
// Deterministic random fixtures
// ------------------------------------------------------------------------------------------------

/// The fixtures' generator: aerie's own splitmix64 (Steele, Lea, Flood 2014).
pub use aerie_model::rng::SplitMix as SplitMix64;

/// The fixtures' draws on top of the generator's 64 bits.
pub trait FixtureDraws {
    /// Uniform in [lo, hi).
    fn between(&mut self, lo: f64, hi: f64) -> f64;
    /// Zero-mean uniform with standard deviation `std` (half-width `std * sqrt(3)`).
    fn centered(&mut self, std: f64) -> f64;
    /// Uniform integer in [0, n), by modulo.
    fn below_mod(&mut self, n: usize) -> usize;
}

impl FixtureDraws for SplitMix64 {
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    fn centered(&mut self, std: f64) -> f64 {
        let a = std * 3f64.sqrt();
        self.between(-a, a)
    }

    fn below_mod(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub(super) fn seeded(seed: u64, salt: &str) -> SplitMix64 {
    // Mix the tensor name in so that adding a tensor does not shift the others' values.
    let mut s = seed ^ 0xA5A5_5A5A_DEAD_BEEF;
    for b in salt.bytes() {
        s = s.rotate_left(5) ^ b as u64;
        s = s.wrapping_mul(0x100_0000_01B3);
    }
    SplitMix64(s)
}

pub(super) fn rand_f32(rng: &mut SplitMix64, n: usize, std: f64) -> Vec<f32> {
    (0..n).map(|_| rng.centered(std) as f32).collect()
}

pub(super) fn rand_norm_weight(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.between(0.9, 1.1) as f32).collect()
}

/// The sorted draft vocabulary `random_tiny_checkpoint` picks for `(cfg, seed)`: Vd distinct
/// target ids in ascending order (all of 0..V when Vd == V).
pub fn random_draft_vocab(cfg: &DrafterConfig, seed: u64) -> Vec<usize> {
    let v = cfg.vocab_size;
    let vd = cfg.draft_vocab_size;
    assert!(vd <= v, "Vd > V");
    let mut rng = seeded(seed, "draft_vocab");
    let mut all: Vec<usize> = (0..v).collect();
    // Partial Fisher-Yates: the first vd entries are a uniform random subset.
    for i in 0..vd {
        let j = i + rng.below_mod(v - i);
        all.swap(i, j);
    }
    let mut ids = all[..vd].to_vec();
    ids.sort_unstable();
    ids
}

/// A random drafter checkpoint in canonical key naming (eagle3.md §1 table), all floats f32:
/// weights and embeddings zero-mean uniform with std 0.2, norm weights uniform in [0.9, 1.1],
/// `fc_norm.{i}.weight` only when `cfg.fc_norm`, and a valid d2t/t2d (§4) for the sorted draft
/// vocab [`random_draft_vocab`]. Deterministic in `(cfg, seed)`.
pub fn random_tiny_checkpoint(cfg: &DrafterConfig, seed: u64) -> TensorMap {
    let h = cfg.hidden_size;
    let ht = cfg.target_hidden_size;
    let a = cfg.num_aux();
    let d = cfg.head_dim;
    let nh = cfg.num_attention_heads;
    let nkv = cfg.num_key_value_heads;
    let i = cfg.intermediate_size;
    let v = cfg.vocab_size;
    let vd = cfg.draft_vocab_size;
    let std = 0.2;
    let mut m = TensorMap::new();
    let mat = |m: &mut TensorMap, key: &str, rows: usize, cols: usize| {
        let mut rng = seeded(seed, key);
        m.insert(
            key.to_string(),
            HostTensor::from_f32(vec![rows, cols], &rand_f32(&mut rng, rows * cols, std), Dtype::F32),
        );
    };
    mat(&mut m, "embed_tokens.weight", v, h);
    mat(&mut m, "fc.weight", h, a * ht);
    mat(&mut m, "midlayer.self_attn.q_proj.weight", nh * d, 2 * h);
    mat(&mut m, "midlayer.self_attn.k_proj.weight", nkv * d, 2 * h);
    mat(&mut m, "midlayer.self_attn.v_proj.weight", nkv * d, 2 * h);
    mat(&mut m, "midlayer.self_attn.o_proj.weight", h, nh * d);
    mat(&mut m, "midlayer.mlp.gate_proj.weight", i, h);
    mat(&mut m, "midlayer.mlp.up_proj.weight", i, h);
    mat(&mut m, "midlayer.mlp.down_proj.weight", h, i);
    mat(&mut m, "lm_head.weight", vd, h);
    let norm = |m: &mut TensorMap, key: &str, n: usize| {
        let mut rng = seeded(seed, key);
        m.insert(key.to_string(), HostTensor::from_f32(vec![n], &rand_norm_weight(&mut rng, n), Dtype::F32));
    };
    norm(&mut m, "midlayer.input_layernorm.weight", h);
    norm(&mut m, "midlayer.hidden_norm.weight", h);
    norm(&mut m, "midlayer.post_attention_layernorm.weight", h);
    norm(&mut m, "norm.weight", h);
    if cfg.fc_norm {
        for c in 0..a {
            norm(&mut m, &format!("fc_norm.{c}.weight"), ht);
        }
    }
    let vocab = random_draft_vocab(cfg, seed);
    let d2t: Vec<i64> = vocab.iter().enumerate().map(|(j, &t)| t as i64 - j as i64).collect();
    let mut t2d = vec![false; v];
    for &t in &vocab {
        t2d[t] = true;
    }
    m.insert("d2t".into(), HostTensor::from_i64(vec![vd], &d2t));
    m.insert("t2d".into(), HostTensor::from_bool(vec![v], &t2d));
    m
}

/// YaRN with the default betas (32, 1) and neither attention factor nor mscale: the scaling the
/// tiny tests run, stretched by `factor` over an original context of `original` positions.
pub fn plain_yarn(factor: f64, original: usize) -> RopeScaling {
    RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: None,
        mscale: None,
        mscale_all_dim: None,
    }
}

/// A tiny config whose every dimension differs, so transposed or confused shapes fail loudly:
/// H 16, Ht 12, I 24, nH 4, nKV 2, d 6 (not H/nH), V 40, Vd 24, A 3, default RoPE theta 10000.
pub fn tiny_config() -> DrafterConfig {
    DrafterConfig {
        hidden_size: 16,
        target_hidden_size: 12,
        intermediate_size: 24,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 6,
        rms_norm_eps: 1e-5,
        rope: RopeConfig { theta: 10000.0, scaling: RopeScaling::Default },
        max_position_embeddings: 256,
        vocab_size: 40,
        draft_vocab_size: 24,
        aux_layers: AuxLayers { ids: vec![1, 3, 5], convention: AuxConvention::OutputOfLayer },
        fc_norm: false,
        norm_output: false,
        norm_before_residual: false,
        target_name_or_path: None,
        mla: None,
    }
}

/// One random training sequence for `cfg`.
#[derive(Debug, Clone)]
pub struct RefSequence {
    /// Token ids x, len L, in 0..V.
    pub ids: Vec<i64>,
    /// Loss mask, len L: a 0 prompt prefix then random 0/1 with ~80% ones.
    pub loss_mask: Vec<f64>,
    /// Aux features f [L][A*Ht], std 1.
    pub aux: Mat,
    /// Target final hidden state [L][Ht], std 1.
    pub final_hidden: Mat,
    /// Target lm_head [V][Ht], std 0.5.
    pub target_lm_head: Mat,
    /// `ref_teacher_from_hidden(final_hidden, target_lm_head)` [L][V].
    pub teacher_logits: Mat,
}

/// A deterministic random sequence of length `len`. ids, aux, final_hidden and target_lm_head
/// are f32-representable, so an f32 implementation receives exactly the same inputs;
/// teacher_logits is their exact f64 product.
pub fn random_sequence(cfg: &DrafterConfig, len: usize, seed: u64) -> RefSequence {
    let mut rng = seeded(seed, "sequence");
    let f32r = |x: f64| x as f32 as f64;
    let ids: Vec<i64> = (0..len).map(|_| rng.below_mod(cfg.vocab_size) as i64).collect();
    let prompt = len / 4;
    let loss_mask: Vec<f64> = (0..len)
        .map(|t| {
            if t < prompt {
                0.0
            } else if rng.uniform() < 0.8 {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let aw = cfg.num_aux() * cfg.target_hidden_size;
    let aux: Mat = (0..len).map(|_| (0..aw).map(|_| f32r(rng.centered(1.0))).collect()).collect();
    let final_hidden: Mat =
        (0..len).map(|_| (0..cfg.target_hidden_size).map(|_| f32r(rng.centered(1.0))).collect()).collect();
    let target_lm_head: Mat =
        (0..cfg.vocab_size).map(|_| (0..cfg.target_hidden_size).map(|_| f32r(rng.centered(0.5))).collect()).collect();
    let teacher_logits = ref_teacher_from_hidden(&final_hidden, &target_lm_head);
    RefSequence { ids, loss_mask, aux, final_hidden, target_lm_head, teacher_logits }
}
