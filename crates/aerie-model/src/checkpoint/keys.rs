//! The one table of checkpoint key renames (style guide, "one home for key maps").
//!
//! Inside aerie every drafter tensor has a *canonical* name: SGLang/SpecForge naming without any
//! prefix (`fc.weight`, `midlayer.self_attn.q_proj.weight`, `d2t`; eagle3.md §1). Files name the
//! same tensors differently per dialect: vLLM/speculators call the decoder layer `layers.0.*`,
//! and some trainers wrap everything in HF's `model.` prefix. SGLang silently skips keys it does
//! not know and leaves the weight random, so the loader and the exporter must agree exactly: both
//! go through [`canonical_name`] and [`file_key`], and nothing else in aerie renames keys.
//!
//! The same goes for the keys under which a *target* model keeps its embedding and head
//! ([`TARGET_EMBED_KEYS`], [`TARGET_HEAD_KEYS`]).

use super::Dialect;

/// The token embedding `[V, H]` (the target's, frozen).
pub const EMBED: &str = "embed_tokens.weight";
/// The fusion layer `[H, A*Ht]`.
pub const FC: &str = "fc.weight";
/// The final RMSNorm `[H]`.
pub const NORM: &str = "norm.weight";
/// The draft head `[Vd, H]`.
pub const LM_HEAD: &str = "lm_head.weight";
/// Draft→target id offsets, int64 `[Vd]`.
pub const D2T: &str = "d2t";
/// Target-id membership mask, bool `[V]`.
pub const T2D: &str = "t2d";

/// The decoder layer's weights, canonical names, in forward order.
pub const MIDLAYER: [&str; 10] = [
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
];

/// The multi-latent attention's weights (`Eagle3DeepseekV2ForCausalLM`), canonical names, in
/// forward order; they replace the four `q/k/v/o_proj` of [`MIDLAYER`] (SGLang fuses `q_a_proj`
/// and `kv_a_proj_with_mqa` on load, vLLM into `fused_qkv_a_proj`; files keep them apart).
pub const MLA_ATTENTION: [&str; 7] = [
    "midlayer.self_attn.q_a_proj.weight",
    "midlayer.self_attn.q_a_layernorm.weight",
    "midlayer.self_attn.q_b_proj.weight",
    "midlayer.self_attn.kv_a_proj_with_mqa.weight",
    "midlayer.self_attn.kv_a_layernorm.weight",
    "midlayer.self_attn.kv_b_proj.weight",
    "midlayer.self_attn.o_proj.weight",
];

/// Canonical name of the EAGLE-3.1 per-feature norm on aux feature `i` (`[Ht]`).
pub fn fc_norm(i: usize) -> String {
    format!("fc_norm.{i}.weight")
}

/// One rename rule: tensors whose canonical name starts with `canonical` are written with that
/// prefix replaced by the dialect's, and any of the `read` prefixes is accepted when loading.
struct Rename {
    canonical: &'static str,
    sglang: &'static str,
    speculators: &'static str,
    read: &'static [&'static str],
}

/// THE table. Rows are tried in order; the first row with a matching prefix wins.
const RENAMES: &[Rename] = &[
    // The single decoder layer. SGLang, SpecForge and the EAGLE repo call it `midlayer` (every
    // SGLang version accepts it; only recent ones accept `layers.0`). vLLM/speculators write
    // `layers.0`. HF-style trainers may add `model.` in front of either.
    Rename {
        canonical: "midlayer.",
        sglang: "midlayer.",
        speculators: "layers.0.",
        read: &["midlayer.", "layers.0.", "model.midlayer.", "model.layers.0."],
    },
    // Everything else (`embed_tokens`, `fc`, `fc_norm.{i}`, `norm`, `lm_head`, `d2t`, `t2d`)
    // keeps its name in both dialects. A `model.` prefix is accepted on read (d2t/t2d/lm_head
    // never carry it in practice) and never written.
    Rename { canonical: "", sglang: "", speculators: "", read: &["model.", ""] },
];

/// Where a target model directory keeps its input embedding `[V, Ht]`, tried in order: plain HF
/// causal LMs, then multimodal wrappers such as Kimi-K2.5 (`language_model.*`) and the
/// transformers-5 layout, then a bare file written by aerie or a trainer.
pub const TARGET_EMBED_KEYS: &[&str] = &[
    "model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "embed_tokens.weight",
];

/// Where a target model keeps its output head `[V, Ht]`, tried in order (tied models have none
/// and use the embedding instead).
pub const TARGET_HEAD_KEYS: &[&str] = &["lm_head.weight", "language_model.lm_head.weight"];

/// The canonical name for a key found in a checkpoint file of either dialect. Keys that are not
/// part of a drafter come back with only the prefix rules applied, so validation can report
/// them as unexpected.
pub fn canonical_name(file_key: &str) -> String {
    for rule in RENAMES {
        for prefix in rule.read {
            if let Some(rest) = file_key.strip_prefix(prefix) {
                return format!("{}{rest}", rule.canonical);
            }
        }
    }
    file_key.to_string()
}

/// The key under which `dialect` stores the tensor with canonical name `canonical`.
pub fn file_key(canonical: &str, dialect: Dialect) -> String {
    for rule in RENAMES {
        if let Some(rest) = canonical.strip_prefix(rule.canonical) {
            let prefix = match dialect {
                Dialect::Sglang => rule.sglang,
                Dialect::Speculators => rule.speculators,
            };
            return format!("{prefix}{rest}");
        }
    }
    canonical.to_string()
}

/// Every canonical name a drafter with `num_aux` aux features may hold (required or optional).
pub fn all_canonical(num_aux: usize, fc_norm_on: bool) -> Vec<String> {
    let mut v = vec![EMBED.to_string(), FC.to_string()];
    if fc_norm_on {
        v.extend((0..num_aux).map(fc_norm));
    }
    v.extend(MIDLAYER.iter().map(|s| s.to_string()));
    v.extend([NORM, LM_HEAD, D2T, T2D].iter().map(|s| s.to_string()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_canonical_name_in_both_dialects() {
        for name in all_canonical(3, true) {
            for d in [Dialect::Sglang, Dialect::Speculators] {
                let key = file_key(&name, d);
                assert_eq!(canonical_name(&key), name, "{d:?} {key}");
                assert!(!key.starts_with("model."), "{key}");
            }
        }
    }

    #[test]
    fn dialect_spellings() {
        let q = "midlayer.self_attn.q_proj.weight";
        assert_eq!(file_key(q, Dialect::Sglang), q);
        assert_eq!(file_key(q, Dialect::Speculators), "layers.0.self_attn.q_proj.weight");
        assert_eq!(file_key(D2T, Dialect::Speculators), "d2t");
        assert_eq!(file_key("fc_norm.2.weight", Dialect::Speculators), "fc_norm.2.weight");
    }

    #[test]
    fn accepted_read_spellings() {
        let want = "midlayer.mlp.down_proj.weight";
        for k in [
            "midlayer.mlp.down_proj.weight",
            "layers.0.mlp.down_proj.weight",
            "model.midlayer.mlp.down_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
        ] {
            assert_eq!(canonical_name(k), want, "{k}");
        }
        assert_eq!(canonical_name("model.fc.weight"), FC);
        assert_eq!(canonical_name("model.embed_tokens.weight"), EMBED);
        assert_eq!(canonical_name("model.lm_head.weight"), LM_HEAD);
        assert_eq!(canonical_name("model.d2t"), D2T);
        // Not a drafter key: kept (minus the prefix) so validation can name it.
        assert_eq!(canonical_name("layers.1.mlp.up_proj.weight"), "layers.1.mlp.up_proj.weight");
        assert_eq!(canonical_name("model.layers.1.x"), "layers.1.x");
    }
}
