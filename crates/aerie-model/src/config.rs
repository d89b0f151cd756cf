//! The resolved drafter configuration: one struct that every aerie stage uses, whichever dialect
//! (SGLang/SpecForge `LlamaForCausalLMEagle3` or speculators `eagle3`) the `config.json` was
//! written in. Parsing and writing the dialects lives in [`crate::checkpoint::config`]; this
//! module only holds the meaning (eagle3.md §1–2).

use serde::{Deserialize, Serialize};

/// Which numbering the aux-layer ids follow (eagle3.md §2); the shard format's type, shared so
/// that data and drafter speak of the same thing.
pub use aerie_data::shard::AuxConvention;

/// Target layers whose pre-norm residual stream the drafter consumes, low → high.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuxLayers {
    /// Layer ids in [`AuxLayers::convention`].
    pub ids: Vec<usize>,
    /// The numbering `ids` follow.
    pub convention: AuxConvention,
}

impl AuxLayers {
    /// Ids in the output-of-layer convention (SGLang exports).
    pub fn output_of_layer(&self) -> Vec<usize> {
        self.convention.output_of_layer(&self.ids)
    }

    /// Ids in the input-of-layer convention (speculators/vLLM exports).
    pub fn input_of_layer(&self) -> Vec<usize> {
        self.convention.input_of_layer(&self.ids)
    }

    /// The defaults of eagle3.md §2 for a target with `num_layers` decoder layers, in the
    /// output-of-layer convention: `[1, N/2 - 1, N - 4]`.
    pub fn default_for_target(num_layers: usize) -> Self {
        Self {
            ids: vec![1, (num_layers / 2).saturating_sub(1), num_layers.saturating_sub(4)],
            convention: AuxConvention::OutputOfLayer,
        }
    }
}

/// RoPE frequency scaling as HF `rope_scaling` / `rope_parameters` describe it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Positions divided by `factor`.
    Linear {
        /// Scale factor.
        factor: f64,
    },
    /// Llama-3.1 frequency-band scaling.
    Llama3 {
        /// Scale factor.
        factor: f64,
        /// Low-frequency factor (HF default 1).
        low_freq_factor: f64,
        /// High-frequency factor (HF default 4).
        high_freq_factor: f64,
        /// Context length the base model was trained on.
        original_max_position_embeddings: usize,
    },
    /// YaRN (NTK-by-parts with attention temperature).
    Yarn {
        /// Scale factor.
        factor: f64,
        /// Context length the base model was trained on.
        original_max_position_embeddings: usize,
        /// HF default 32.
        beta_fast: f64,
        /// HF default 1.
        beta_slow: f64,
        /// Attention factor; HF default `0.1 * ln(factor) + 1`.
        attention_factor: Option<f64>,
        /// mscale / mscale_all_dim (DeepSeek-style); HF defaults absent.
        mscale: Option<f64>,
        /// See `mscale`.
        mscale_all_dim: Option<f64>,
    },
}

/// Rotary position embedding parameters, from the DRAFTER's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeConfig {
    /// Base of the frequencies (`rope_theta`, default 10000).
    pub theta: f64,
    /// Frequency scaling.
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// What is wrong with these parameters, one message per problem (the key and its value):
    /// every RoPE number must be finite and positive (a YaRN `factor` of 0 gave NaN losses, a
    /// τ of 1.0 and an export that served nothing; `rope_theta` 0 makes every frequency 0), and
    /// an original context must be positive. The one check of the RoPE that `inspect`, `eval`,
    /// `train` and `export` all make, through [`DrafterConfig::problems`].
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let mut positive = |key: &str, v: f64| {
            if !(v.is_finite() && v > 0.0) {
                p.push(format!("{key} = {v} must be a finite number above 0"));
            }
        };
        positive("rope_theta", self.theta);
        let mut originals = Vec::new();
        match &self.scaling {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } => positive("rope_scaling.factor", *factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                positive("rope_scaling.factor", *factor);
                positive("rope_scaling.low_freq_factor", *low_freq_factor);
                positive("rope_scaling.high_freq_factor", *high_freq_factor);
                originals.push(*original_max_position_embeddings);
                if high_freq_factor <= low_freq_factor {
                    p.push(format!(
                        "rope_scaling.high_freq_factor = {high_freq_factor} must be above low_freq_factor = {low_freq_factor}"
                    ));
                }
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                mscale,
                mscale_all_dim,
            } => {
                positive("rope_scaling.factor", *factor);
                positive("rope_scaling.beta_fast", *beta_fast);
                positive("rope_scaling.beta_slow", *beta_slow);
                originals.push(*original_max_position_embeddings);
                if let Some(a) = attention_factor {
                    positive("rope_scaling.attention_factor", *a);
                }
                // DeepSeek's mscale and mscale_all_dim may be 0 (no scaling), never NaN or below.
                for (key, v) in [("rope_scaling.mscale", mscale), ("rope_scaling.mscale_all_dim", mscale_all_dim)] {
                    if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                        p.push(format!("{key} = {v} must be a finite number of at least 0"));
                    }
                }
            }
        }
        if originals.contains(&0) {
            p.push("rope_scaling.original_max_position_embeddings = 0 must be at least 1".into());
        }
        p
    }
}

impl Default for RopeConfig {
    fn default() -> Self {
        Self { theta: 10000.0, scaling: RopeScaling::Default }
    }
}

/// DeepSeek-V2 multi-latent attention (MLA) of the drafter layer, as `Eagle3DeepseekV2ForCausalLM`
/// (SGLang `kimi_k25_eagle3.py`, vLLM `deepseek_eagle3.py`) runs it: queries through a low-rank
/// `q_a_proj` → `q_a_layernorm` → `q_b_proj`, keys and values from one shared latent
/// (`kv_a_proj_with_mqa` → `kv_a_layernorm` → `kv_b_proj`) plus one RoPE key shared by every head.
/// The down-projections take the layer's `2H` input (`cat(input_layernorm(emb), hidden_norm(h))`).
/// The config keys are DeepSeek's (`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`,
/// `qk_rope_head_dim`, `v_head_dim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaConfig {
    /// Query latent width (`q_a_proj` rows). SGLang's MLA drafter requires one; vLLM's direct
    /// `q_proj` variant is not published for drafters.
    pub q_lora_rank: usize,
    /// Key/value latent width (`kv_a_layernorm` width).
    pub kv_lora_rank: usize,
    /// Per-head query/key width without position (`qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// Per-head query/key width that is rotated; the rotated key is shared by all heads.
    pub qk_rope_head_dim: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
}

impl MlaConfig {
    /// Query/key head width `qk_nope_head_dim + qk_rope_head_dim` (the softmax scale's d).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// Weights (elements) of one drafter at most: 2^36, about 69 billion, where the largest drafters
/// in use (Kimi K2's) have about 2 billion.
pub const MAX_PARAMETERS: u128 = 1 << 36;

/// Everything that determines an EAGLE-3 drafter's shapes and math (eagle3.md §1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrafterConfig {
    /// H: the drafter's hidden size.
    pub hidden_size: usize,
    /// Ht: the target's hidden size (width of one aux feature and of the final hidden state).
    pub target_hidden_size: usize,
    /// I: SwiGLU width.
    pub intermediate_size: usize,
    /// nH.
    pub num_attention_heads: usize,
    /// nKV (GQA when < nH).
    pub num_key_value_heads: usize,
    /// d; may differ from H / nH.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE.
    pub rope: RopeConfig,
    /// Context the drafter is configured for; must cover the served context.
    pub max_position_embeddings: usize,
    /// V: the TARGET vocabulary (embedding rows, t2d length).
    pub vocab_size: usize,
    /// Vd: the draft vocabulary (lm_head rows, d2t length).
    pub draft_vocab_size: usize,
    /// Target layers consumed.
    pub aux_layers: AuxLayers,
    /// EAGLE-3.1: per-feature RMSNorm (`fc_norm.{i}.weight`) on each aux feature before `fc`.
    pub fc_norm: bool,
    /// EAGLE-3.1: the next draft step consumes the post-final-norm state instead of the pre-norm one.
    pub norm_output: bool,
    /// vLLM's `norm_before_residual`: the residual is `hidden_norm(h)` rather than `h`. SGLang
    /// and SpecForge drafters use `false`.
    pub norm_before_residual: bool,
    /// Target model the drafter was trained for (`name_or_path`), when known.
    pub target_name_or_path: Option<String>,
    /// Multi-latent attention instead of grouped-query attention (`Eagle3DeepseekV2ForCausalLM`);
    /// `head_dim` and `num_key_value_heads` then have no role. Absent from serialised configs of
    /// Llama-style drafters, so their fingerprints are unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaConfig>,
}

impl DrafterConfig {
    /// A: number of aux features.
    pub fn num_aux(&self) -> usize {
        self.aux_layers.ids.len()
    }

    /// Grouped-query ratio nH / nKV (1 for MLA: every head has its own keys).
    pub fn kv_groups(&self) -> usize {
        if self.mla.is_some() {
            return 1;
        }
        self.num_attention_heads / self.num_key_value_heads.max(1)
    }

    /// Width of the rotated part of a head: `head_dim`, or MLA's `qk_rope_head_dim`.
    pub fn rope_dim(&self) -> usize {
        self.mla.map_or(self.head_dim, |m| m.qk_rope_head_dim)
    }

    /// The attention's softmax scale: `1/sqrt(head_dim)`, or for MLA `1/sqrt(qk_head_dim)`
    /// times DeepSeek's YaRN `mscale²` (`0.1·mscale_all_dim·ln(factor) + 1`, squared, when the
    /// RoPE is YaRN with a non-zero `mscale_all_dim`), as DeepSeek-V2/V3, SGLang and vLLM scale it.
    pub fn softmax_scale(&self) -> f64 {
        let Some(m) = self.mla else {
            return 1.0 / (self.head_dim as f64).sqrt();
        };
        let base = 1.0 / (m.qk_head_dim() as f64).sqrt();
        match self.rope.scaling {
            RopeScaling::Yarn { factor, mscale_all_dim: Some(all), .. } if all != 0.0 && factor > 1.0 => {
                let mscale = 0.1 * all * factor.ln() + 1.0;
                base * mscale * mscale
            }
            _ => base,
        }
    }

    /// Check the shape relations the forward relies on; returns a message per problem.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.num_key_value_heads == 0 || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            p.push(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        match self.mla {
            None if !self.head_dim.is_multiple_of(2) => {
                p.push(format!("head_dim {} must be even for RoPE", self.head_dim));
            }
            Some(m) if !m.qk_rope_head_dim.is_multiple_of(2) || m.qk_rope_head_dim == 0 => {
                p.push(format!("qk_rope_head_dim {} must be even and positive for RoPE", m.qk_rope_head_dim));
            }
            Some(m) if m.q_lora_rank == 0 || m.kv_lora_rank == 0 || m.v_head_dim == 0 || m.qk_nope_head_dim == 0 => {
                p.push(format!(
                    "q_lora_rank {}, kv_lora_rank {}, qk_nope_head_dim {} and v_head_dim {} must be positive",
                    m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim
                ));
            }
            _ => {}
        }
        p.extend(self.rope.problems());
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 || self.rms_norm_eps.is_infinite() {
            p.push(format!("rms_norm_eps = {} must be a finite number of at least 0", self.rms_norm_eps));
        }
        if self.draft_vocab_size > self.vocab_size {
            p.push(format!(
                "draft_vocab_size {} exceeds the target vocab_size {}",
                self.draft_vocab_size, self.vocab_size
            ));
        }
        if self.aux_layers.ids.is_empty() {
            p.push("no aux layer ids".into());
        }
        // Sizes bounded before anything is allocated by them (a `vocab_size` of 10^10 is a
        // corrupt config, and `t2d` alone would be 10 GB).
        use aerie_data::limits::{self, MAX_LAYERS, MAX_POSITIONS, MAX_WIDTH, WHY_LAYERS, WHY_POSITIONS, WHY_WIDTH};
        let checks = [
            limits::vocab("vocab_size", self.vocab_size),
            limits::vocab("draft_vocab_size", self.draft_vocab_size),
            limits::check("hidden_size", self.hidden_size, MAX_WIDTH, WHY_WIDTH),
            limits::check("target_hidden_size", self.target_hidden_size, MAX_WIDTH, WHY_WIDTH),
            limits::check("intermediate_size", self.intermediate_size, MAX_WIDTH, WHY_WIDTH),
            limits::check("num_attention_heads", self.num_attention_heads, MAX_WIDTH, WHY_WIDTH),
            limits::check("head_dim", self.head_dim, MAX_WIDTH, WHY_WIDTH),
            limits::check("num_key_value_heads", self.num_key_value_heads, MAX_WIDTH, WHY_WIDTH),
            limits::check("max_position_embeddings", self.max_position_embeddings, MAX_POSITIONS, WHY_POSITIONS),
            limits::check(
                "an aux layer id",
                self.aux_layers.ids.iter().copied().max().unwrap_or(0),
                MAX_LAYERS,
                WHY_LAYERS,
            ),
        ];
        p.extend(checks.into_iter().filter_map(|r| r.err()).map(|e| e.to_string()));
        // MLA's widths, bounded like every other (a `v_head_dim` of 10^12 aborted on allocation).
        if let Some(m) = self.mla {
            for (key, v) in [
                ("q_lora_rank", m.q_lora_rank),
                ("kv_lora_rank", m.kv_lora_rank),
                ("qk_nope_head_dim", m.qk_nope_head_dim),
                ("qk_rope_head_dim", m.qk_rope_head_dim),
                ("v_head_dim", m.v_head_dim),
            ] {
                if let Err(e) = limits::check(key, v, MAX_WIDTH, WHY_WIDTH) {
                    p.push(e.to_string());
                }
            }
        }
        // Each width within its limit can still multiply into more weights than any machine
        // holds; the total is bounded too, before anything is allocated by it.
        if p.is_empty() && self.parameter_count() > MAX_PARAMETERS {
            p.push(format!(
                "the config describes {} weights, past the limit of {MAX_PARAMETERS} (the largest drafters in use \
                 have a few billion): check its widths",
                self.parameter_count()
            ));
        }
        p
    }

    /// How many weights (elements) the drafter this config describes has, about: the embedding,
    /// the head, `fc`, one layer's attention and MLP. In `u128`, so any config's count fits.
    pub fn parameter_count(&self) -> u128 {
        let u = |x: usize| x as u128;
        let (h, ht, v, vd) =
            (u(self.hidden_size), u(self.target_hidden_size), u(self.vocab_size), u(self.draft_vocab_size));
        let heads = u(self.num_attention_heads);
        let attention = match self.mla {
            None => {
                let d = u(self.head_dim);
                2 * h * heads * d + 2 * 2 * h * u(self.num_key_value_heads) * d
            }
            Some(m) => {
                let (ql, kl) = (u(m.q_lora_rank), u(m.kv_lora_rank));
                let (nope, rope, vh) = (u(m.qk_nope_head_dim), u(m.qk_rope_head_dim), u(m.v_head_dim));
                2 * h * ql
                    + ql * heads * (nope + rope)
                    + 2 * h * (kl + rope)
                    + kl * heads * (nope + vh)
                    + heads * vh * h
            }
        };
        v * h + vd * h + u(self.num_aux()) * ht * h + attention + 3 * h * u(self.intermediate_size)
    }

    /// A SmolLM2-135M-sized drafter (H 576, 9 heads / 3 KV of 64, I 1536, V 49152, Vd 8192,
    /// 30-layer target), the shape the CPU quickstart and benchmarks use.
    pub fn smollm2_135m(draft_vocab_size: usize) -> Self {
        Self {
            hidden_size: 576,
            target_hidden_size: 576,
            intermediate_size: 1536,
            num_attention_heads: 9,
            num_key_value_heads: 3,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope: RopeConfig { theta: 100000.0, scaling: RopeScaling::Default },
            max_position_embeddings: 8192,
            vocab_size: 49152,
            draft_vocab_size,
            aux_layers: AuxLayers::default_for_target(30),
            fc_norm: false,
            norm_output: false,
            norm_before_residual: false,
            target_name_or_path: Some("HuggingFaceTB/SmolLM2-135M-Instruct".into()),
            mla: None,
        }
    }

    /// The AQ-MedAI Kimi-K2 drafter's shape (H 7168, 64 heads of 128, I 18432, V 163840,
    /// Vd 32000, aux [1, 29, 57] output-of-layer; kimi-k25.md).
    pub fn kimi_k2_aq_medai() -> Self {
        Self {
            hidden_size: 7168,
            target_hidden_size: 7168,
            intermediate_size: 18432,
            num_attention_heads: 64,
            num_key_value_heads: 64,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope: RopeConfig { theta: 50000.0, scaling: RopeScaling::Default },
            max_position_embeddings: 262144,
            vocab_size: 163840,
            draft_vocab_size: 32000,
            aux_layers: AuxLayers { ids: vec![1, 29, 57], convention: AuxConvention::OutputOfLayer },
            fc_norm: false,
            norm_output: false,
            norm_before_residual: false,
            target_name_or_path: Some("moonshotai/Kimi-K2-Instruct".into()),
            mla: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(factor: f64) -> RopeScaling {
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None,
            mscale: Some(1.0),
            mscale_all_dim: Some(0.0),
        }
    }

    #[test]
    fn a_rope_parameter_of_zero_or_not_finite_is_a_problem() {
        let mut c = DrafterConfig::smollm2_135m(8192);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        c.rope.scaling = yarn(32.0);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            c.rope.scaling = yarn(bad);
            let p = c.problems().join("; ");
            assert!(p.contains("rope_scaling.factor") && p.contains("finite number above 0"), "{bad}: {p}");
        }
        c.rope.scaling = RopeScaling::Linear { factor: 0.0 };
        assert!(c.problems().join("; ").contains("rope_scaling.factor = 0"));
        c.rope = RopeConfig { theta: 0.0, scaling: RopeScaling::Default };
        assert!(c.problems().join("; ").contains("rope_theta = 0"));
    }

    #[test]
    fn mla_widths_are_positive_and_bounded() {
        let mut c = DrafterConfig::smollm2_135m(8192);
        let mla =
            MlaConfig { q_lora_rank: 64, kv_lora_rank: 32, qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 16 };
        c.mla = Some(mla);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        c.mla = Some(MlaConfig { qk_nope_head_dim: 0, ..mla });
        assert!(c.problems().join("; ").contains("qk_nope_head_dim 0"), "{:?}", c.problems());
        c.mla = Some(MlaConfig { v_head_dim: 1_000_000_000_000, ..mla });
        assert!(c.problems().join("; ").contains("v_head_dim = 1000000000000"), "{:?}", c.problems());
        c.mla = Some(MlaConfig { q_lora_rank: 1 << 20, ..mla });
        assert!(c.problems().join("; ").contains("q_lora_rank = 1048576"), "{:?}", c.problems());
        // Each width within its limit, together past any machine.
        c.mla = Some(MlaConfig { kv_lora_rank: 1 << 18, v_head_dim: 1 << 18, ..mla });
        c.num_attention_heads = 1 << 18;
        c.num_key_value_heads = 1 << 18;
        assert!(c.problems().join("; ").contains("past the limit of"), "{:?}", c.problems());
    }
}
