//! The config fingerprint: the keys that change a run's result (data, init, objective, optimiser,
//! seed; [`super::keys::KeyDoc::affects_result`]), flattened to `dotted.key → JSON value` and
//! hashed. A resume compares fingerprints and refuses a config whose result-affecting keys
//! differ, listing them; bookkeeping keys (`output_dir`, `log_every`, `save_every`, eval
//! settings...) may change freely.

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::TrainConfig;
use super::keys;

/// Flattened result-affecting keys.
pub type Fingerprint = BTreeMap<String, Value>;

fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// The result-affecting keys of `cfg`, with the values they have (absent options are absent).
pub fn fingerprint(cfg: &TrainConfig) -> Fingerprint {
    let value = serde_json::to_value(cfg).expect("a TrainConfig always serialises to JSON");
    let mut all = BTreeMap::new();
    flatten("", &value, &mut all);
    all.into_iter().filter(|(k, _)| keys::find(k).is_none_or(|d| d.affects_result)).collect()
}

/// sha256 (hex) of the fingerprint's canonical JSON.
pub fn hash(fp: &Fingerprint) -> String {
    let text = serde_json::to_string(fp).expect("JSON values always serialise");
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// One line per key whose value differs: `key: run has A, config has B`.
pub fn diff(run: &Fingerprint, now: &Fingerprint) -> Vec<String> {
    let show = |v: Option<&Value>| v.map_or("(unset)".to_string(), Value::to_string);
    let mut keys: Vec<&String> = run.keys().chain(now.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| run.get(*k) != now.get(*k))
        .map(|k| format!("{k}: the run has {}, this config has {}", show(run.get(k)), show(now.get(k))))
        .collect()
}
