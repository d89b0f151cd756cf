//! The config keys that name a model or drafter (`init.drafter`, `init.target_config`,
//! `target.path`, `target.head`, `target.embedding`, `select.target`). Their values may be something other than a
//! local path, a Hugging Face Hub id for one: this crate does not download, so the caller
//! resolves them and passes the local paths back as `--set` overrides, before the config is
//! validated (validation looks at those paths on disk).

use std::path::{Path, PathBuf};

/// The config keys whose values name a model or drafter.
pub const MODEL_PATH_KEYS: [&str; 6] =
    ["init.drafter", "init.target_config", "target.path", "target.head", "target.embedding", "select.target"];

/// `--set` overrides (`key`, TOML value) that replace the model-path values of the config file
/// at `path`, after the user's `overrides`, by the local paths `resolve(key, value)` returns;
/// values it returns `None` for are left to the config loader. An unreadable or invalid file
/// gives no overrides: [`super::TrainConfig::load`] reports what is wrong with it.
pub fn model_path_overrides<E>(
    path: &Path,
    overrides: &[(String, String)],
    mut resolve: impl FnMut(&str, &str) -> Result<Option<PathBuf>, E>,
) -> Result<Vec<(String, String)>, E> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(Vec::new()) };
    let Ok(table) = toml::from_str::<toml::Table>(&text) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for key in MODEL_PATH_KEYS {
        let from_set = overrides.iter().rev().find(|(k, _)| k == key).map(|(_, raw)| {
            match toml::from_str::<toml::Table>(&format!("v = {raw}")).ok().and_then(|mut t| t.remove("v")) {
                Some(toml::Value::String(s)) => s,
                _ => raw.clone(),
            }
        });
        let from_file = || {
            let (section, leaf) = key.split_once('.')?;
            table.get(section)?.get(leaf)?.as_str().map(str::to_owned)
        };
        let Some(value) = from_set.or_else(from_file) else { continue };
        let Some(local) = resolve(key, &value)? else { continue };
        out.push((key.to_owned(), toml::Value::String(local.display().to_string()).to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_set_value_wins_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "[init]\ndrafter = \"org/drafter\"\n[target]\npath = \"org/target\"\n").unwrap();
        let mut seen = Vec::new();
        let sets =
            [("target.path".to_owned(), "\"org/first\"".to_owned()), ("target.path".to_owned(), "org/last".to_owned())];
        let got = model_path_overrides::<()>(&cfg, &sets, |key: &str, value: &str| {
            seen.push((key.to_owned(), value.to_owned()));
            Ok((key == "target.path").then(|| PathBuf::from("/snap/t")))
        })
        .unwrap();
        assert_eq!(
            seen,
            [("init.drafter".to_owned(), "org/drafter".to_owned()), ("target.path".to_owned(), "org/last".to_owned())]
        );
        assert_eq!(got, [("target.path".to_owned(), "\"/snap/t\"".to_owned())]);
        // An unreadable config gives no overrides (the loader reports it).
        let none = model_path_overrides::<()>(&dir.path().join("missing.toml"), &[], |_: &str, _: &str| unreachable!());
        assert!(none.unwrap().is_empty());
    }
}
