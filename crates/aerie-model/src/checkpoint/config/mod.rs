//! `config.json` in both drafter dialects (eagle3.md §1, §2, §5): parse either into
//! [`DrafterConfig`], write either back.
//!
//! - SGLang/SpecForge: a flat Llama config with `architectures: ["LlamaForCausalLMEagle3"]`,
//!   `draft_vocab_size`, `target_hidden_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`
//!   in the OUTPUT-of-layer convention.
//! - speculators/vLLM: `speculators_model_type: "eagle3"` with a nested `transformer_layer_config`
//!   and top-level `eagle_aux_hidden_state_layer_ids` in the INPUT-of-layer convention.
//!
//! RoPE is read from the legacy `rope_theta`/`rope_scaling` keys and from transformers-5
//! `rope_parameters`; the legacy keys are always written, since the engines (SGLang, vLLM,
//! speculators' converter) read only those, with a source's `rope_parameters` kept beside them
//! (`spelling.rs`).
//! Parsing is lenient about what a report can still describe (unknown aux ids, a wrong
//! architecture): [`ParsedConfig`] records those so `inspect` can lint them and the loader can
//! refuse them.

use std::path::Path;

use serde_json::{Map, Value, json};

mod fields;
mod mla;
mod rope;
mod spelling;

use self::fields::Obj;
pub use self::mla::MLA_ARCHITECTURE;
use self::rope::{parse_rope, rope_scaling_json};
pub use self::spelling::keep_source_spelling;
use super::Dialect;
use super::tensors::Dtype;
use crate::config::{AuxConvention, AuxLayers, DrafterConfig};
use crate::{Error, Result};

/// The architecture string SGLang dispatches EAGLE-3 drafters on.
pub const SGLANG_ARCHITECTURE: &str = "LlamaForCausalLMEagle3";
/// The architecture string speculators writes for EAGLE-3 drafters.
pub const SPECULATORS_ARCHITECTURE: &str = "Eagle3Speculator";
/// `speculative_tokens` written into speculators configs: a chain of 3 drafts, the SGLang
/// setting of eagle3.md §5 (aerie's [`DrafterConfig`] does not carry it).
pub const DEFAULT_SPECULATIVE_TOKENS: usize = 3;

/// What `mla_use_nope: true` in an MLA drafter's config means for aerie (a parse note, so
/// `inspect`, `train` and `export` all say it; `inspect` also warns, code `mla-use-nope`).
pub const MLA_USE_NOPE_NOTE: &str = "mla_use_nope is true, which aerie does not implement: NoPE attention (no \
    rotary positions, what the key selects in Kimi-Linear's MLA) is not what aerie trains or evaluates. aerie, \
    like SGLang's Eagle3DeepseekV2ForCausalLM and vLLM's deepseek_eagle3 (neither reads the key), rotates the \
    qk_rope_head_dim part of every query and key with RoPE, which is how the published kimi-k2.5-eagle3-mla is \
    served; a drafter trained without RoPE would be served wrongly by both engines";

/// A parsed `config.json`: the resolved config plus what the file did or did not say, which
/// `inspect` lints and the loader enforces.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedConfig {
    /// Which dialect the file is written in.
    pub dialect: Dialect,
    /// The resolved config. When [`ParsedConfig::aux_ids_known`] is false its aux id list is
    /// empty.
    pub config: DrafterConfig,
    /// Whether the aux layer ids are known (given in the file, or defaulted from the target's
    /// layer count).
    pub aux_ids_known: bool,
    /// `torch_dtype` (or transformers-5 `dtype`) when present and understood.
    pub torch_dtype: Option<Dtype>,
    /// `architectures`, as written.
    pub architectures: Vec<String>,
    /// Whether `target_hidden_size` was given (otherwise it defaults to `hidden_size`).
    pub target_hidden_size_explicit: bool,
    /// Whether `draft_vocab_size` was given (without it SGLang replaces lm_head by the target's).
    pub draft_vocab_size_explicit: bool,
    /// Whether the file sets `num_nextn_predict_layers` (SGLang then builds an MTP head).
    pub has_num_nextn_predict_layers: bool,
    /// `num_hidden_layers` as written (a drafter has exactly 1).
    pub num_hidden_layers: Option<usize>,
    /// Whether `norm_before_residual` was given (speculators configs without it are read as
    /// true, as vLLM does).
    pub norm_before_residual_explicit: bool,
    /// `eagle_config.use_aux_hidden_state` as written (SGLang dialect).
    pub use_aux_hidden_state: Option<bool>,
    /// `speculative_tokens` of the first proposal method (speculators dialect).
    pub speculative_tokens: Option<usize>,
    /// Defaults that were applied and other facts worth telling the user.
    pub notes: Vec<String>,
}

impl ParsedConfig {
    /// The config, or an error naming `path` when the aux layer ids are unknown (the loader
    /// cannot build a drafter that consumes unknown target layers).
    pub fn resolved(&self, path: &Path) -> Result<DrafterConfig> {
        if !self.aux_ids_known {
            return Err(config_err(
                path,
                "the config lists no aux layer ids (eagle_config.eagle_aux_hidden_state_layer_ids) \
                 and their default [1, N/2-1, N-4] needs the target's layer count N: give the \
                 target model directory",
            ));
        }
        Ok(self.config.clone())
    }
}

fn config_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Config { path: path.to_path_buf(), message: message.into() }
}

/// The RoPE settings of any `config.json` object (a drafter's, or a target's text config):
/// `rope_parameters` (transformers 5) when present, else the legacy `rope_theta`/`rope_scaling`.
/// One reader, so the drafter and the native target can never disagree on a file's RoPE.
pub(crate) fn read_rope(value: &Value, path: &Path, max_position_embeddings: usize) -> Result<crate::RopeConfig> {
    parse_rope(&Obj::new(path, value, "")?, max_position_embeddings)
}

/// Read and parse `path` (a `config.json`). `target_layers` is the target's decoder layer count,
/// used only to default missing aux ids.
pub fn read_config(path: &Path, target_layers: Option<usize>) -> Result<ParsedConfig> {
    parse_config(&read_config_value(path)?, path, target_layers)
}

/// `path` (a `config.json`) as a JSON value, unparsed.
pub fn read_config_value(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| config_err(path, format!("not valid JSON: {e}")))
}

/// Which dialect a parsed `config.json` object is written in (for MLA drafters, which have no
/// speculators form, [`Dialect::Speculators`] names aerie's vLLM layout; see `config/mla.rs`).
pub fn detect_dialect(value: &Value) -> Dialect {
    if mla::is_mla(value) {
        return mla::mla_dialect(value);
    }
    let spec_arch = value
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(SPECULATORS_ARCHITECTURE)));
    if value.get("speculators_model_type").is_some() || spec_arch { Dialect::Speculators } else { Dialect::Sglang }
}

/// Parse a `config.json` object of either dialect.
pub fn parse_config(value: &Value, path: &Path, target_layers: Option<usize>) -> Result<ParsedConfig> {
    let top = Obj::new(path, value, "")?;
    let dialect = detect_dialect(value);
    let is_mla = mla::is_mla(value);
    let mut notes = Vec::new();
    if dialect == Dialect::Speculators && !is_mla {
        match top.str("speculators_model_type")? {
            Some("eagle3") | None => {}
            Some(other) => {
                return Err(Error::Unsupported {
                    path: path.to_path_buf(),
                    message: format!("speculators_model_type `{other}`: aerie reads `eagle3` only"),
                });
            }
        }
    }
    // The Llama part: top level (SGLang) or nested (speculators).
    let llama = match dialect {
        Dialect::Sglang => Obj::new(path, value, "")?,
        Dialect::Speculators if is_mla => Obj::new(path, value, "")?,
        Dialect::Speculators => top
            .child("transformer_layer_config", "transformer_layer_config.")?
            .ok_or_else(|| config_err(path, "speculators config lacks `transformer_layer_config`"))?,
    };

    let hidden_size = llama.req_usize("hidden_size")?;
    let num_attention_heads = llama.req_usize("num_attention_heads")?;
    if num_attention_heads == 0 {
        return Err(config_err(path, "num_attention_heads is 0"));
    }
    // MLA gives every head its own keys, whatever the file says.
    let num_key_value_heads = match is_mla {
        true => num_attention_heads,
        false => llama.usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
    };
    let mla = if is_mla { Some(mla::parse_mla(&llama)?) } else { None };
    let head_dim = match (llama.usize("head_dim")?, mla) {
        (_, Some(m)) => m.qk_rope_head_dim,
        (Some(d), None) => d,
        (None, None) if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
        (None, None) => {
            return Err(config_err(
                path,
                format!(
                    "no head_dim and hidden_size {hidden_size} is not a multiple of \
                     num_attention_heads {num_attention_heads}"
                ),
            ));
        }
    };
    let max_position_embeddings = match llama.usize("max_position_embeddings")? {
        Some(m) => m,
        None => {
            notes.push("max_position_embeddings absent: using the Llama default 2048".into());
            2048
        }
    };
    let rms_norm_eps = match llama.f64("rms_norm_eps")? {
        Some(e) => e,
        None => {
            notes.push("rms_norm_eps absent: using the Llama default 1e-6".into());
            1e-6
        }
    };
    let vocab_size = llama.req_usize("vocab_size")?;
    let rope = parse_rope(&llama, max_position_embeddings)?;
    let num_hidden_layers = llama.usize("num_hidden_layers")?;

    let draft_vocab = top.usize("draft_vocab_size")?;
    let target_hidden = top.usize("target_hidden_size")?;
    let fc_norm = top.bool("fc_norm")?.unwrap_or(false);
    let nbr_explicit = top.get("norm_before_residual").is_some();
    let norm_output = top.bool("norm_output")?.unwrap_or(false);

    let (aux_ids, convention, norm_before_residual, use_aux, spec_tokens, target_name) = match dialect {
        Dialect::Sglang => {
            let eagle = top.child("eagle_config", "eagle_config.")?;
            let ids = match &eagle {
                Some(e) => e.ids("eagle_aux_hidden_state_layer_ids")?,
                None => None,
            };
            let use_aux = match &eagle {
                Some(e) => e.bool("use_aux_hidden_state")?,
                None => None,
            };
            let nbr = top.bool("norm_before_residual")?.unwrap_or(false);
            let name = top.str("target_name_or_path")?.map(str::to_string);
            (ids, AuxConvention::OutputOfLayer, nbr, use_aux, None, name)
        }
        Dialect::Speculators => {
            let ids = top.ids("eagle_aux_hidden_state_layer_ids")?;
            let nbr = match top.bool("norm_before_residual")? {
                Some(b) => b,
                // vLLM's MLA drafter defaults it to false (`getattr(.., False)`).
                None if is_mla => false,
                None => {
                    notes.push("norm_before_residual absent: vLLM assumes true, so aerie reads it as true".into());
                    true
                }
            };
            let spec = top.child("speculators_config", "speculators_config.")?;
            let mut tokens = None;
            let mut name = None;
            if let Some(spec) = spec {
                if let Some(methods) = spec.get("proposal_methods").and_then(Value::as_array)
                    && let Some(first) = methods.first()
                {
                    let m = Obj::new(path, first, "speculators_config.proposal_methods[0].")?;
                    tokens = m.usize("speculative_tokens")?;
                }
                if let Some(verifier) = spec.child("verifier", "speculators_config.verifier.")? {
                    name = verifier.str("name_or_path")?.map(str::to_string);
                }
            }
            if name.is_none() {
                name = top.str("target_name_or_path")?.map(str::to_string);
            }
            (ids, AuxConvention::InputOfLayer, nbr, None, tokens, name)
        }
    };

    let (aux_layers, aux_ids_known) = match (aux_ids, target_layers) {
        (Some(ids), _) => (AuxLayers { ids, convention }, true),
        (None, Some(n)) => {
            let d = AuxLayers::default_for_target(n);
            notes.push(format!(
                "aux layer ids absent: using the default for a {n}-layer target, output of layers \
                 {:?}",
                d.ids
            ));
            (d, true)
        }
        (None, None) => (AuxLayers { ids: Vec::new(), convention }, false),
    };

    let torch_dtype = match top.str("torch_dtype")?.or(top.str("dtype")?) {
        Some(s) => match Dtype::parse(s) {
            Some(d) => Some(d),
            None => {
                notes.push(format!("torch_dtype `{s}` not understood; ignored"));
                None
            }
        },
        None => None,
    };
    let architectures = top
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();

    // TorchSpec's MLA drafters write `mla_use_nope`; no engine that serves them reads it.
    if is_mla && llama.bool("mla_use_nope")? == Some(true) {
        notes.push(MLA_USE_NOPE_NOTE.into());
    }
    if draft_vocab.is_none() {
        notes.push(format!(
            "draft_vocab_size absent: taken as vocab_size {vocab_size} (SGLang then uses the \
             target's lm_head instead of the drafter's)"
        ));
    }
    let config = DrafterConfig {
        hidden_size,
        target_hidden_size: target_hidden.unwrap_or(hidden_size),
        intermediate_size: llama.req_usize("intermediate_size")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps,
        rope,
        max_position_embeddings,
        vocab_size,
        draft_vocab_size: draft_vocab.unwrap_or(vocab_size),
        aux_layers,
        fc_norm,
        norm_output,
        norm_before_residual,
        target_name_or_path: target_name,
        mla,
    };
    Ok(ParsedConfig {
        dialect,
        config,
        aux_ids_known,
        torch_dtype,
        architectures,
        target_hidden_size_explicit: target_hidden.is_some(),
        draft_vocab_size_explicit: draft_vocab.is_some(),
        has_num_nextn_predict_layers: value.get("num_nextn_predict_layers").is_some()
            || llama.map.contains_key("num_nextn_predict_layers"),
        num_hidden_layers,
        norm_before_residual_explicit: nbr_explicit,
        use_aux_hidden_state: use_aux,
        speculative_tokens: spec_tokens,
        notes,
    })
}

/// The Llama keys both dialects share (top level in SGLang, `transformer_layer_config` in
/// speculators).
fn llama_keys(cfg: &DrafterConfig, dtype: Dtype) -> Map<String, Value> {
    let v = json!({
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "rope_theta": cfg.rope.theta,
        "rope_scaling": rope_scaling_json(&cfg.rope.scaling),
        "attention_bias": false,
        "mlp_bias": false,
        "tie_word_embeddings": false,
        "torch_dtype": dtype.torch_name(),
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!("json! object"),
    }
}

/// The `config.json` object for `cfg` in `dialect`, with `torch_dtype` = `dtype`.
///
/// Refuses (rather than writing a config that serves wrongly): `norm_before_residual` to SGLang,
/// which has no such option; aux ids that SGLang's output-of-layer convention cannot express
/// (input of layer 0); an empty aux id list.
pub fn to_json(cfg: &DrafterConfig, dialect: Dialect, dtype: Dtype, path: &Path) -> Result<Value> {
    let refuse = |message: String| Error::Unsupported { path: path.to_path_buf(), message };
    if cfg.aux_layers.ids.is_empty() {
        return Err(refuse("cannot write a config without aux layer ids".into()));
    }
    if let Some(m) = &cfg.mla {
        return mla::mla_json(cfg, m, dialect, dtype, path);
    }
    let mut m = Map::new();
    match dialect {
        Dialect::Sglang => {
            if cfg.norm_before_residual {
                return Err(refuse(
                    "the drafter uses norm_before_residual=true, which SGLang's \
                     LlamaForCausalLMEagle3 cannot run (it would serve with a wrong residual); \
                     export it to the speculators dialect for vLLM instead"
                        .into(),
                ));
            }
            if cfg.aux_layers.convention == AuxConvention::InputOfLayer && cfg.aux_layers.ids.contains(&0) {
                return Err(refuse(
                    "aux id 0 in the input-of-layer convention (the embedding output) has no \
                     output-of-layer equivalent, so SGLang cannot capture it"
                        .into(),
                ));
            }
            m.insert("architectures".into(), json!([SGLANG_ARCHITECTURE]));
            m.insert("model_type".into(), json!("llama"));
            m.extend(llama_keys(cfg, dtype));
            m.insert("draft_vocab_size".into(), json!(cfg.draft_vocab_size));
            m.insert("target_hidden_size".into(), json!(cfg.target_hidden_size));
            m.insert(
                "eagle_config".into(),
                json!({
                    "eagle_aux_hidden_state_layer_ids": cfg.aux_layers.output_of_layer(),
                    "use_aux_hidden_state": true,
                }),
            );
            m.insert("norm_before_residual".into(), json!(false));
            m.insert("fc_norm".into(), json!(cfg.fc_norm));
            m.insert("norm_output".into(), json!(cfg.norm_output));
            if let Some(name) = &cfg.target_name_or_path {
                m.insert("target_name_or_path".into(), json!(name));
            }
        }
        Dialect::Speculators => {
            let mut layer = Map::new();
            layer.insert("architectures".into(), json!(["LlamaForCausalLM"]));
            layer.insert("model_type".into(), json!("llama"));
            layer.extend(llama_keys(cfg, dtype));
            m.insert("architectures".into(), json!([SPECULATORS_ARCHITECTURE]));
            m.insert("speculators_model_type".into(), json!("eagle3"));
            m.insert("transformer_layer_config".into(), Value::Object(layer));
            m.insert("draft_vocab_size".into(), json!(cfg.draft_vocab_size));
            m.insert("target_hidden_size".into(), json!(cfg.target_hidden_size));
            m.insert("norm_before_residual".into(), json!(cfg.norm_before_residual));
            m.insert("fc_norm".into(), json!(cfg.fc_norm));
            m.insert("norm_output".into(), json!(cfg.norm_output));
            m.insert("eagle_aux_hidden_state_layer_ids".into(), json!(cfg.aux_layers.input_of_layer()));
            m.insert("torch_dtype".into(), json!(dtype.torch_name()));
            m.insert(
                "speculators_config".into(),
                json!({
                    "algorithm": "eagle3",
                    "proposal_methods": [{
                        "proposal_type": "greedy",
                        "speculative_tokens": DEFAULT_SPECULATIVE_TOKENS,
                        "verifier_accept_k": 1,
                        "accept_tolerance": 0.0,
                    }],
                    "default_proposal_method": "greedy",
                    "verifier": {
                        "name_or_path": cfg.target_name_or_path,
                        "architectures": [],
                    },
                }),
            );
        }
    }
    Ok(Value::Object(m))
}

/// Write `config.json` for `cfg` at `path` (pretty-printed, trailing newline).
pub fn write_config(path: &Path, cfg: &DrafterConfig, dialect: Dialect, dtype: Dtype) -> Result<()> {
    let value = to_json(cfg, dialect, dtype, path)?;
    let mut text = serde_json::to_string_pretty(&value).expect("JSON values always serialize");
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("test/config.json")
    }

    fn same_meaning(a: &DrafterConfig, b: &DrafterConfig) {
        assert_eq!(a.aux_layers.output_of_layer(), b.aux_layers.output_of_layer());
        let mut b = b.clone();
        b.aux_layers = a.aux_layers.clone();
        assert_eq!(*a, b);
    }

    #[test]
    fn kimi_round_trips_in_both_dialects() {
        let cfg = DrafterConfig::kimi_k2_aq_medai();
        for d in [Dialect::Sglang, Dialect::Speculators] {
            let v = to_json(&cfg, d, Dtype::BF16, p()).unwrap();
            let parsed = parse_config(&v, p(), None).unwrap();
            assert_eq!(parsed.dialect, d);
            assert_eq!(parsed.torch_dtype, Some(Dtype::BF16));
            assert!(parsed.target_hidden_size_explicit && parsed.aux_ids_known);
            assert!(!parsed.has_num_nextn_predict_layers);
            same_meaning(&cfg, &parsed.config);
        }
        let v = to_json(&cfg, Dialect::Sglang, Dtype::BF16, p()).unwrap();
        assert_eq!(v["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json!([1, 29, 57]));
        assert_eq!(v["architectures"], json!(["LlamaForCausalLMEagle3"]));
        assert_eq!(v["tie_word_embeddings"], json!(false));
        let v = to_json(&cfg, Dialect::Speculators, Dtype::BF16, p()).unwrap();
        assert_eq!(v["eagle_aux_hidden_state_layer_ids"], json!([2, 30, 58]));
        assert_eq!(v["norm_before_residual"], json!(false));
        assert_eq!(v["transformer_layer_config"]["vocab_size"], json!(163840));
        assert_eq!(v["speculators_config"]["verifier"]["name_or_path"], json!("moonshotai/Kimi-K2-Instruct"));
    }

    #[test]
    fn sglang_defaults_and_unknown_aux_ids() {
        let v = json!({
            "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64,
            "intermediate_size": 96, "num_attention_heads": 4, "vocab_size": 512,
            "draft_vocab_size": 64,
        });
        let parsed = parse_config(&v, p(), None).unwrap();
        assert!(!parsed.aux_ids_known);
        assert_eq!(parsed.config.head_dim, 16);
        assert_eq!(parsed.config.num_key_value_heads, 4);
        assert_eq!(parsed.config.target_hidden_size, 64);
        assert!(!parsed.config.norm_before_residual && !parsed.target_hidden_size_explicit);
        let e = parsed.resolved(p()).unwrap_err().to_string();
        assert!(e.contains("test/config.json") && e.contains("target"), "{e}");
        // With the target's layer count the default [1, N/2-1, N-4] applies.
        let parsed = parse_config(&v, p(), Some(61)).unwrap();
        assert_eq!(parsed.config.aux_layers.output_of_layer(), vec![1, 29, 57]);
    }

    #[test]
    fn speculators_absent_norm_before_residual_reads_true() {
        let mut v = to_json(&DrafterConfig::smollm2_135m(64), Dialect::Speculators, Dtype::F32, p()).unwrap();
        v.as_object_mut().unwrap().remove("norm_before_residual");
        let parsed = parse_config(&v, p(), None).unwrap();
        assert!(parsed.config.norm_before_residual);
        assert!(parsed.notes.iter().any(|n| n.contains("vLLM assumes true")));
    }

    #[test]
    fn refuses_configs_sglang_cannot_run() {
        let mut cfg = DrafterConfig::smollm2_135m(64);
        cfg.norm_before_residual = true;
        let e = to_json(&cfg, Dialect::Sglang, Dtype::F32, p()).unwrap_err().to_string();
        assert!(e.contains("norm_before_residual"), "{e}");
        assert!(to_json(&cfg, Dialect::Speculators, Dtype::F32, p()).is_ok());
    }

    #[test]
    fn type_errors_name_file_and_key() {
        let v = json!({"hidden_size": "big", "num_attention_heads": 4, "vocab_size": 5});
        let e = parse_config(&v, p(), None).unwrap_err().to_string();
        assert!(e.contains("test/config.json") && e.contains("`hidden_size`"), "{e}");
        let v = json!({"speculators_model_type": "eagle3", "hidden_size": 4});
        let e = parse_config(&v, p(), None).unwrap_err().to_string();
        assert!(e.contains("transformer_layer_config"), "{e}");
    }
}
