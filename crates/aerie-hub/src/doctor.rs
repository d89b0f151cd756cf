//! The drafter as `aerie doctor` checks it against a running server ([`aerie_engine::doctor`]):
//! read from its `config.json` only (its layout, attention kind, quantization and aux layer ids
//! as written), through the one config reader of aerie-model, never from its weights: a Kimi
//! drafter is gigabytes, and none of the serving rules looks at a tensor.

use std::path::Path;

use aerie_data::shard::AuxConvention;
use aerie_engine::doctor::Drafter;
use aerie_model::checkpoint::{Dialect, config};
use serde_json::Value;

use crate::Result;

/// The drafter in `dir`, as the serving rules need it.
pub fn drafter(dir: &Path) -> Result<Drafter> {
    aerie_model::checkpoint::check_drafter_dir(dir)?;
    let path = dir.join("config.json");
    let raw = config::read_config_value(&path)?;
    let parsed = config::read_config(&path, None)?;
    let aux = &parsed.config.aux_layers;
    let (aux_convention, aux_ids) = match parsed.dialect {
        Dialect::Sglang => (AuxConvention::OutputOfLayer, aux.output_of_layer()),
        Dialect::Speculators => (AuxConvention::InputOfLayer, aux.input_of_layer()),
    };
    let str_at = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    // The layer config of the speculators layout holds what the SGLang layout writes at the top.
    let layer = raw.get("transformer_layer_config").unwrap_or(&Value::Null);
    let quantization = raw
        .get("quantization_config")
        .or_else(|| layer.get("quantization_config"))
        .filter(|q| !q.is_null())
        .map(|q| str_at(q, "quant_method").unwrap_or_else(|| "unnamed".into()));
    Ok(Drafter {
        path: dir.display().to_string(),
        architectures: parsed.architectures.clone(),
        model_type: str_at(&raw, "model_type").or_else(|| str_at(layer, "model_type")),
        mla: parsed.config.mla.is_some(),
        quantization,
        layout: parsed.dialect.name().to_string(),
        aux_ids: if parsed.aux_ids_known { aux_ids } else { Vec::new() },
        aux_convention,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_fixture_drafter_as_the_serving_rules_see_it() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2-135m-eagle3");
        let d = drafter(&dir).unwrap();
        assert_eq!(d.architectures, ["LlamaForCausalLMEagle3"]);
        assert_eq!((d.model_type.as_deref(), d.mla, d.quantization.as_deref()), (Some("llama"), false, None));
        assert_eq!(
            (d.layout.as_str(), d.aux_ids.as_slice(), d.aux_convention),
            ("sglang", &[1, 14, 26][..], AuxConvention::OutputOfLayer)
        );
    }
}
