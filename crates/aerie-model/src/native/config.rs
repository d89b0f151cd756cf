//! The target model's HF `config.json` (transformers `LlamaConfig`, `Qwen2Config`,
//! `Qwen3Config`), deserialised with HF key names and serde defaults into [`TargetConfig`], then
//! resolved into the concrete shapes and switches the forward needs ([`TargetSpec`]).
//!
//! RoPE is read from transformers-5 `rope_parameters` when present, else from the legacy
//! `rope_theta`/`rope_scaling` keys (with `rope_type` or the older `type` key), exactly as the
//! drafter config reader does (eagle3.md §1).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::config::RopeConfig;
use crate::{Error, Result};

fn default_rms_norm_eps() -> f64 {
    1e-6
}

fn default_max_position_embeddings() -> usize {
    2048
}

fn default_hidden_act() -> String {
    "silu".into()
}

/// A token id or a list of them (`eos_token_id` is a list in Llama-3 and Qwen configs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// A target's `config.json` as HF writes it. Keys the forward does not need are ignored; those it
/// needs but HF defaults are defaulted the way transformers does for `LlamaConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetConfig {
    /// `architectures`, e.g. `["LlamaForCausalLM"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
    /// `model_type`: `llama`, `qwen2` or `qwen3` (empty: taken from `architectures`).
    #[serde(default)]
    pub model_type: String,
    /// H.
    pub hidden_size: usize,
    /// I (SwiGLU width).
    pub intermediate_size: usize,
    /// N decoder layers.
    pub num_hidden_layers: usize,
    /// nH.
    pub num_attention_heads: usize,
    /// nKV; defaults to nH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// d; defaults to H / nH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// V.
    pub vocab_size: usize,
    /// RMSNorm epsilon (HF default 1e-6).
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Legacy RoPE base (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Legacy RoPE scaling object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Value>,
    /// transformers-5 RoPE object (`rope_theta`, `rope_type`, scaling keys); wins over the
    /// legacy keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Value>,
    /// Context length (the YaRN default for `original_max_position_embeddings`).
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: usize,
    /// Whether the output head is the input embedding (no `lm_head.weight` is read).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama/Qwen3: biases on q/k/v/o projections. Qwen2 always has q/k/v biases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Llama: biases in the MLP (not supported; refused when true).
    #[serde(default)]
    pub mlp_bias: bool,
    /// Activation of the MLP; only `silu` is supported.
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    /// Qwen2 sliding-window attention switch (not supported; refused when true).
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Beginning-of-sequence id(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<TokenIds>,
    /// End-of-sequence id(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<TokenIds>,
    /// Padding id(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<TokenIds>,
    /// `torch_dtype` (transformers 4) of the stored weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
}

/// Which upstream modelling file the target follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetArch {
    /// `modeling_llama.py` (Llama, SmolLM2): biases only with `attention_bias` (q/k/v/o).
    Llama,
    /// `modeling_qwen2.py`: q/k/v biases always, no o bias.
    Qwen2,
    /// `modeling_qwen3.py`: per-head RMSNorm on q and k (`q_norm`, `k_norm`) before RoPE.
    Qwen3,
}

/// A resolved target configuration: every shape and switch the forward uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetSpec {
    /// The modelling file followed.
    pub arch: TargetArch,
    /// H.
    pub hidden_size: usize,
    /// I.
    pub intermediate_size: usize,
    /// N.
    pub num_hidden_layers: usize,
    /// nH.
    pub num_attention_heads: usize,
    /// nKV.
    pub num_key_value_heads: usize,
    /// d.
    pub head_dim: usize,
    /// V.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE.
    pub rope: RopeConfig,
    /// Context length.
    pub max_position_embeddings: usize,
    /// Head tied to the embedding.
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v.
    pub qkv_bias: bool,
    /// Bias on o.
    pub o_bias: bool,
    /// Qwen3 per-head q/k RMSNorm.
    pub qk_norm: bool,
    /// Beginning-of-sequence ids (possibly empty).
    pub bos_token_ids: Vec<u32>,
    /// End-of-sequence ids (possibly empty).
    pub eos_token_ids: Vec<u32>,
}

impl TargetSpec {
    /// Grouped-query ratio nH / nKV.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

fn config_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Config { path: path.to_path_buf(), message: message.into() }
}

impl TargetSpec {
    /// The spec of the model directory `dir` as aerie's native target runs it, or the error
    /// saying why it cannot (an architecture it does not run: DeepSeek-V3, Kimi; a multimodal
    /// wrapper; a feature it lacks). Reads `config.json` only: what [`TargetModel::load`] checks
    /// first, so a command can refuse a target before it starts anything long.
    ///
    /// [`TargetModel::load`]: super::TargetModel::load
    pub fn of_dir(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        TargetConfig::read(&cfg_path)?.resolve(&cfg_path)
    }
}

impl TargetConfig {
    /// Read `dir/config.json` (or `path` itself when it is a file). A multimodal wrapper's
    /// `text_config` is NOT unwrapped: aerie's native target covers plain causal LMs.
    pub fn read(path: &Path) -> Result<Self> {
        let file = aerie_data::hf_config::config_json_path(path);
        let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
        Self::from_json_str(&text, &file)
    }

    /// Parse JSON text; `path` names the source in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| config_err(path, format!("not a target config: {e}")))
    }

    /// SmolLM2-135M-Instruct (assets.md): 30 layers, H 576, 9 heads / 3 KV of 64, I 1536,
    /// V 49152, rope theta 100000, eps 1e-5, tied head, bos 1, eos 2.
    pub fn smollm2_135m() -> Self {
        Self {
            architectures: vec!["LlamaForCausalLM".into()],
            model_type: "llama".into(),
            hidden_size: 576,
            intermediate_size: 1536,
            num_hidden_layers: 30,
            num_attention_heads: 9,
            num_key_value_heads: Some(3),
            head_dim: Some(64),
            vocab_size: 49152,
            rms_norm_eps: 1e-5,
            rope_theta: Some(100000.0),
            rope_scaling: None,
            rope_parameters: None,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: Some(false),
            mlp_bias: false,
            hidden_act: "silu".into(),
            use_sliding_window: false,
            bos_token_id: Some(TokenIds::One(1)),
            eos_token_id: Some(TokenIds::One(2)),
            pad_token_id: Some(TokenIds::One(2)),
            torch_dtype: Some("bfloat16".into()),
        }
    }

    /// The modelling file this config asks for, from `model_type` or else `architectures`.
    pub fn arch(&self, path: &Path) -> Result<TargetArch> {
        let from_arch = |name: &str| match name {
            "LlamaForCausalLM" => Some(TargetArch::Llama),
            "Qwen2ForCausalLM" => Some(TargetArch::Qwen2),
            "Qwen3ForCausalLM" => Some(TargetArch::Qwen3),
            _ => None,
        };
        let arch = match self.model_type.as_str() {
            "llama" => Some(TargetArch::Llama),
            "qwen2" => Some(TargetArch::Qwen2),
            "qwen3" => Some(TargetArch::Qwen3),
            "" => self.architectures.iter().find_map(|a| from_arch(a)),
            _ => None,
        };
        arch.ok_or_else(|| Error::Unsupported {
            path: path.to_path_buf(),
            message: format!(
                "target model_type `{}` (architectures {:?}): aerie's native target runs llama, qwen2 and qwen3",
                self.model_type, self.architectures
            ),
        })
    }

    /// Every size is bounded before anything is allocated or looped over by it
    /// (`aerie_data::limits`): a corrupt `num_hidden_layers` must not become a billion layers.
    fn check_limits(&self, path: &Path) -> Result<()> {
        use aerie_data::limits::{self, MAX_LAYERS, MAX_POSITIONS, MAX_WIDTH, WHY_LAYERS, WHY_POSITIONS, WHY_WIDTH};
        let key = |k: &str| format!("{}: {k}", path.display());
        limits::check(key("num_hidden_layers"), self.num_hidden_layers, MAX_LAYERS, WHY_LAYERS)?;
        limits::vocab(key("vocab_size"), self.vocab_size)?;
        limits::check(key("max_position_embeddings"), self.max_position_embeddings, MAX_POSITIONS, WHY_POSITIONS)?;
        let widths = [
            ("hidden_size", Some(self.hidden_size)),
            ("intermediate_size", Some(self.intermediate_size)),
            ("num_attention_heads", Some(self.num_attention_heads)),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (k, v) in widths {
            if let Some(v) = v {
                limits::check(key(k), v, MAX_WIDTH, WHY_WIDTH)?;
            }
        }
        Ok(())
    }

    /// Resolve defaults and check what the forward relies on; `path` names the file in errors.
    pub fn resolve(&self, path: &Path) -> Result<TargetSpec> {
        let arch = self.arch(path)?;
        let unsupported = |message: String| Error::Unsupported { path: path.to_path_buf(), message };
        if self.hidden_act != "silu" {
            return Err(unsupported(format!("hidden_act `{}`: only silu is supported", self.hidden_act)));
        }
        if self.mlp_bias {
            return Err(unsupported("mlp_bias: MLP biases are not supported".into()));
        }
        if self.use_sliding_window {
            return Err(unsupported("use_sliding_window: sliding-window attention is not supported".into()));
        }
        let nh = self.num_attention_heads;
        if nh == 0 || self.hidden_size == 0 || self.num_hidden_layers == 0 || self.vocab_size == 0 {
            return Err(config_err(
                path,
                "hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be > 0",
            ));
        }
        self.check_limits(path)?;
        let nkv = self.num_key_value_heads.unwrap_or(nh);
        if nkv == 0 || !nh.is_multiple_of(nkv) {
            return Err(config_err(
                path,
                format!("num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}"),
            ));
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if self.hidden_size.is_multiple_of(nh) => self.hidden_size / nh,
            None => {
                return Err(config_err(
                    path,
                    format!(
                        "no head_dim and hidden_size {} is not a multiple of num_attention_heads {nh}",
                        self.hidden_size
                    ),
                ));
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(config_err(path, format!("head_dim {head_dim} must be even and > 0 for RoPE")));
        }
        let (qkv_bias, o_bias, qk_norm) = match arch {
            TargetArch::Llama => {
                let b = self.attention_bias.unwrap_or(false);
                (b, b, false)
            }
            TargetArch::Qwen2 => (true, false, false),
            TargetArch::Qwen3 => {
                let b = self.attention_bias.unwrap_or(false);
                (b, b, true)
            }
        };
        Ok(TargetSpec {
            arch,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: nh,
            num_key_value_heads: nkv,
            head_dim,
            vocab_size: self.vocab_size,
            rms_norm_eps: self.rms_norm_eps,
            rope: self.rope(path)?,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            qkv_bias,
            o_bias,
            qk_norm,
            bos_token_ids: self.bos_token_id.as_ref().map(TokenIds::to_vec).unwrap_or_default(),
            eos_token_ids: self.eos_token_id.as_ref().map(TokenIds::to_vec).unwrap_or_default(),
        })
    }

    /// RoPE from `rope_parameters` when present, else `rope_theta`/`rope_scaling` (the
    /// checkpoint reader's rules: [`crate::checkpoint::config`]).
    pub fn rope(&self, path: &Path) -> Result<RopeConfig> {
        let mut keys = Map::new();
        if let Some(t) = self.rope_theta {
            keys.insert("rope_theta".into(), t.into());
        }
        for (k, v) in [("rope_scaling", &self.rope_scaling), ("rope_parameters", &self.rope_parameters)] {
            if let Some(v) = v {
                keys.insert(k.into(), v.clone());
            }
        }
        let rope = crate::checkpoint::config::read_rope(&Value::Object(keys), path, self.max_position_embeddings)?;
        // The one RoPE check drafters get (`RopeConfig::problems`), for the target too: a
        // `rope_theta` of 0 or a YaRN factor of 0 decodes garbage rather than failing.
        let problems = rope.problems();
        if !problems.is_empty() {
            return Err(config_err(path, format!("the target's RoPE: {}", problems.join("; "))));
        }
        Ok(rope)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::RopeScaling;

    fn p() -> &'static Path {
        Path::new("t/config.json")
    }

    fn parse(v: Value) -> Result<TargetConfig> {
        TargetConfig::from_json_str(&v.to_string(), p())
    }

    fn base() -> Value {
        json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
               "vocab_size": 100})
    }

    #[test]
    fn llama_defaults() {
        let s = parse(base()).unwrap().resolve(p()).unwrap();
        assert_eq!((s.arch, s.num_key_value_heads, s.head_dim), (TargetArch::Llama, 4, 16));
        assert_eq!(s.rms_norm_eps, 1e-6);
        assert_eq!(s.rope, RopeConfig::default());
        assert!(!s.tie_word_embeddings && !s.qkv_bias && !s.o_bias && !s.qk_norm);
        assert!(s.eos_token_ids.is_empty());
    }

    #[test]
    fn every_size_past_its_limit_is_refused_naming_key_value_and_limit() {
        for (key, value, limit) in [
            ("num_hidden_layers", json!(1_000_000_000u64), "1024"),
            ("vocab_size", json!(u64::MAX), "16777216"),
            ("hidden_size", json!(1u64 << 40), "262144"),
            ("intermediate_size", json!(1u64 << 30), "262144"),
            ("head_dim", json!(1u64 << 20), "262144"),
            ("max_position_embeddings", json!(1u64 << 40), "16777216"),
        ] {
            let mut v = base();
            v[key] = value.clone();
            let err = parse(v).unwrap().resolve(p()).unwrap_err().to_string();
            assert!(err.contains(&format!("t/config.json: {key} = {value}")) && err.contains(limit), "{err}");
        }
    }

    #[test]
    fn smollm2_preset_round_trips() {
        let c = TargetConfig::smollm2_135m();
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(parse(v).unwrap(), c);
        let s = c.resolve(p()).unwrap();
        assert_eq!((s.kv_groups(), s.head_dim, s.rope.theta), (3, 64, 100000.0));
        assert_eq!((s.bos_token_ids, s.eos_token_ids), (vec![1], vec![2]));
    }

    #[test]
    fn token_id_lists_and_nulls() {
        let mut v = base();
        v["eos_token_id"] = json!([128001, 128008, 128009]);
        v["bos_token_id"] = json!(128000);
        v["head_dim"] = Value::Null;
        v["rope_scaling"] = Value::Null;
        let s = parse(v).unwrap().resolve(p()).unwrap();
        assert_eq!(s.eos_token_ids, vec![128001, 128008, 128009]);
        assert_eq!(s.bos_token_ids, vec![128000]);
        assert_eq!(s.head_dim, 16);
    }

    #[test]
    fn qwen_variants() {
        let mut v = base();
        v["model_type"] = json!("qwen2");
        v["architectures"] = json!(["Qwen2ForCausalLM"]);
        let s = parse(v.clone()).unwrap().resolve(p()).unwrap();
        assert_eq!((s.arch, s.qkv_bias, s.o_bias, s.qk_norm), (TargetArch::Qwen2, true, false, false));
        v["model_type"] = json!("qwen3");
        v["head_dim"] = json!(32);
        v["attention_bias"] = json!(false);
        let s = parse(v.clone()).unwrap().resolve(p()).unwrap();
        assert_eq!((s.arch, s.qkv_bias, s.qk_norm, s.head_dim), (TargetArch::Qwen3, false, true, 32));
        // No model_type: taken from architectures.
        v["model_type"] = json!("");
        v["architectures"] = json!(["Qwen3ForCausalLM"]);
        assert_eq!(parse(v.clone()).unwrap().arch(p()).unwrap(), TargetArch::Qwen3);
        v["model_type"] = json!("gpt2");
        let e = parse(v).unwrap().resolve(p()).unwrap_err().to_string();
        assert!(e.contains("gpt2") && e.contains("t/config.json"), "{e}");
    }

    #[test]
    fn rope_keys_both_generations() {
        let mut v = base();
        v["rope_theta"] = json!(500000.0);
        v["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
        let r = parse(v.clone()).unwrap().rope(p()).unwrap();
        assert_eq!(r, RopeConfig { theta: 500000.0, scaling: RopeScaling::Linear { factor: 2.0 } });
        v["rope_parameters"] = json!({"rope_theta": 1e6, "rope_type": "llama3", "factor": 8.0,
                                      "original_max_position_embeddings": 8192});
        let r = parse(v.clone()).unwrap().rope(p()).unwrap();
        assert_eq!(r.theta, 1e6);
        assert!(matches!(r.scaling, RopeScaling::Llama3 { factor: 8.0, high_freq_factor: 4.0, .. }));
        v["rope_parameters"] = json!({"rope_theta": 1e6, "rope_type": "default"});
        assert_eq!(
            parse(v.clone()).unwrap().rope(p()).unwrap(),
            RopeConfig { theta: 1e6, scaling: RopeScaling::Default }
        );
        v["rope_parameters"] = json!({"rope_type": "dynamic", "factor": 2.0});
        let e = parse(v).unwrap().rope(p()).unwrap_err().to_string();
        assert!(e.contains("dynamic"), "{e}");
    }

    /// Issue 47, one value check: a target's RoPE number that is 0, negative or not finite is
    /// refused as a drafter's is, naming the key and the file.
    #[test]
    fn a_target_rope_of_zero_is_refused_naming_the_key() {
        for (rope, key) in [
            (json!({"rope_theta": 0.0}), "rope_theta"),
            (json!({"rope_theta": -1e4}), "rope_theta"),
            (
                json!({"rope_theta": 1e4, "rope_scaling": {"rope_type": "yarn", "factor": 0.0,
                       "original_max_position_embeddings": 4096}}),
                "rope_scaling.factor",
            ),
        ] {
            let mut v = base();
            for (k, x) in rope.as_object().unwrap() {
                v[k] = x.clone();
            }
            let e = parse(v).unwrap().rope(p()).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("t/config.json"), "{e}");
        }
    }

    #[test]
    fn refusals_name_the_problem() {
        for (key, val, needle) in [
            ("hidden_act", json!("gelu"), "gelu"),
            ("mlp_bias", json!(true), "mlp_bias"),
            ("num_key_value_heads", json!(3), "multiple"),
            ("head_dim", json!(7), "even"),
        ] {
            let mut v = base();
            v[key] = val;
            let e = parse(v).unwrap().resolve(p()).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("t/config.json"), "{e}");
        }
        let mut v = base();
        v.as_object_mut().unwrap().remove("vocab_size");
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains("vocab_size"), "{e}");
    }
}
