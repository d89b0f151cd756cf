//! RoPE keys of `config.json` (eagle3.md §1): read transformers-5 `rope_parameters` or the legacy
//! `rope_theta`/`rope_scaling` (with `rope_type` or the older `type` key); write only the legacy
//! keys, which older SGLang and vLLM read.

use serde_json::{Value, json};

use super::config_err;
use super::fields::Obj;
use crate::config::{RopeConfig, RopeScaling};
use crate::{Error, Result};

/// RoPE from `rope_parameters` (transformers 5) when present, else `rope_theta`/`rope_scaling`.
pub(super) fn parse_rope(llama: &Obj<'_>, max_pos: usize) -> Result<RopeConfig> {
    let params = llama.child("rope_parameters", "rope_parameters.")?;
    let legacy = llama.child("rope_scaling", "rope_scaling.")?;
    let theta = match params.as_ref().map(|p| p.f64("rope_theta")).transpose()?.flatten() {
        Some(t) => t,
        None => llama.f64("rope_theta")?.unwrap_or(10000.0),
    };
    let Some(s) = params.or(legacy) else {
        return Ok(RopeConfig { theta, scaling: RopeScaling::Default });
    };
    let kind = s.str("rope_type")?.or(s.str("type")?).unwrap_or("default");
    let factor = |s: &Obj<'_>| {
        s.f64("factor")?
            .ok_or_else(|| config_err(s.path, format!("`{}factor` is required for rope type {kind}", s.ctx)))
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor(&s)? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor(&s)?,
            low_freq_factor: s.f64("low_freq_factor")?.unwrap_or(1.0),
            high_freq_factor: s.f64("high_freq_factor")?.unwrap_or(4.0),
            original_max_position_embeddings: s.req_usize("original_max_position_embeddings")?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor(&s)?,
            original_max_position_embeddings: s.usize("original_max_position_embeddings")?.unwrap_or(max_pos),
            beta_fast: s.f64("beta_fast")?.unwrap_or(32.0),
            beta_slow: s.f64("beta_slow")?.unwrap_or(1.0),
            attention_factor: s.f64("attention_factor")?,
            mscale: s.f64("mscale")?,
            mscale_all_dim: s.f64("mscale_all_dim")?,
        },
        other => {
            return Err(Error::Unsupported {
                path: s.path.to_path_buf(),
                message: format!("rope type `{other}`: aerie supports default, linear, llama3 and yarn"),
            });
        }
    };
    Ok(RopeConfig { theta, scaling })
}

/// The legacy `rope_scaling` value for `scaling` (`null` for plain RoPE). Both `rope_type` and
/// the older `type` key are written, since engines of different ages read one or the other.
pub(super) fn rope_scaling_json(scaling: &RopeScaling) -> Value {
    let mut m = match scaling {
        RopeScaling::Default => return Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "type": "linear", "factor": factor}),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => json!({
            "rope_type": "llama3", "type": "llama3", "factor": factor,
            "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
        RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, .. } => json!({
            "rope_type": "yarn", "type": "yarn", "factor": factor,
            "original_max_position_embeddings": original_max_position_embeddings,
            "beta_fast": beta_fast, "beta_slow": beta_slow,
        }),
    };
    if let RopeScaling::Yarn { attention_factor, mscale, mscale_all_dim, .. } = scaling {
        let obj = m.as_object_mut().expect("json! object");
        for (k, v) in [("attention_factor", attention_factor), ("mscale", mscale), ("mscale_all_dim", mscale_all_dim)] {
            if let Some(v) = v {
                obj.insert(k.into(), json!(v));
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::super::{Dialect, parse_config, to_json};
    use crate::DrafterConfig;
    use crate::checkpoint::Dtype;
    use crate::config::{RopeConfig, RopeScaling};

    fn p() -> &'static Path {
        Path::new("test/config.json")
    }

    #[test]
    fn rope_variants_round_trip() {
        let mut cfg = DrafterConfig::smollm2_135m(8192);
        for scaling in [
            RopeScaling::Linear { factor: 2.0 },
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
                mscale: Some(1.0),
                mscale_all_dim: None,
            },
        ] {
            cfg.rope.scaling = scaling;
            let v = to_json(&cfg, Dialect::Sglang, Dtype::F32, p()).unwrap();
            assert_eq!(parse_config(&v, p(), None).unwrap().config, cfg);
        }
    }

    #[test]
    fn rope_parameters_and_legacy_type_key() {
        let mut v = to_json(&DrafterConfig::smollm2_135m(64), Dialect::Sglang, Dtype::F32, p()).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("rope_scaling");
        o.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                   "original_max_position_embeddings": 8192}),
        );
        let c = parse_config(&v, p(), None).unwrap().config;
        assert_eq!(c.rope.theta, 500000.0);
        assert!(matches!(
            c.rope.scaling,
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, .. }
        ));
        let o = v.as_object_mut().unwrap();
        o.remove("rope_parameters");
        o.insert("rope_theta".into(), json!(1e6));
        o.insert("rope_scaling".into(), json!({"type": "linear", "factor": 2.0}));
        let c = parse_config(&v, p(), None).unwrap().config;
        assert_eq!(c.rope, RopeConfig { theta: 1e6, scaling: RopeScaling::Linear { factor: 2.0 } });
        v["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0});
        let e = parse_config(&v, p(), None).unwrap_err().to_string();
        assert!(e.contains("test/config.json") && e.contains("dynamic"), "{e}");
    }
}
