//! Drafters put in a serving engine's layout before the engine loads them (`eval serve`,
//! `compare --engine`): which layout each engine reads, each drafter served as it is when it is
//! already in that layout (or with `as_is`, with the warning), else exported into the work
//! directory first. Every drafter gets a name no other drafter of the run has, so exports, logs
//! and reports never collide.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aerie_engine::Engine;
use aerie_engine::launch::ServedDrafter;
use aerie_model::checkpoint::Dialect;
use aerie_model::checkpoint::config::read_config;

use crate::export::{ExportOptions, export};
use crate::{Error, Result};

/// The layout an engine reads natively: SGLang the SGLang layout (output-of-layer aux ids),
/// vLLM the speculators layout (input-of-layer).
pub fn layout_for(engine: Engine) -> Result<Dialect> {
    match engine {
        Engine::Sglang => Ok(Dialect::Sglang),
        Engine::Vllm => Ok(Dialect::Speculators),
        Engine::Openai => Err(Error::InvalidInput {
            input: engine.name().into(),
            problem: "an OpenAI-compatible server has no EAGLE-3 drafter layout: use vllm or sglang".into(),
        }),
    }
}

/// Why `engine` does not load `dialect` at all, when it does not (otherwise a layout in the other
/// convention loads and only accepts less: [`Dialect::served_by_warning`]). Tried against the real
/// SGLang 0.5.23 (crates/aerie-cli/tests/serve_sglang.rs): a speculators export as
/// `--speculative-draft-model-path` stops the server at start, because SGLang reads draft configs
/// through transformers' `AutoConfig`, which needs the top-level `model_type` the speculators
/// layout does not have (and SGLang has no `Eagle3Speculator` class to load it with). vLLM loads
/// both layouts.
pub fn refusal(dialect: Dialect, engine: Engine) -> Option<String> {
    (engine == Engine::Sglang && dialect == Dialect::Speculators).then(|| {
        "this is the speculators layout (`Eagle3Speculator`, no top-level `model_type`): SGLang 0.5.23 refuses to \
         start with it as the draft model (\"Unrecognized model ... Should have a `model_type` key in its \
         config.json\"): export it with `aerie export --to sglang` first"
            .to_string()
    })
}

/// The name of each drafter: `names[i]` when given (as many as drafters), else its directory's
/// name. Two drafters of one name (`runA/checkpoint-756` and `runB/checkpoint-756`) are refused:
/// their exports, engine logs and report rows would be one.
pub fn drafter_names(drafters: &[PathBuf], names: &[String]) -> Result<Vec<String>> {
    let bad = |problem: String| Error::InvalidInput { input: names.join(","), problem };
    if !names.is_empty() && names.len() != drafters.len() {
        return Err(bad(format!("--names has {} entries for {} drafters", names.len(), drafters.len())));
    }
    let mut seen: BTreeMap<String, &Path> = BTreeMap::new();
    let mut out = Vec::with_capacity(drafters.len());
    for (i, src) in drafters.iter().enumerate() {
        let name = names.get(i).cloned().unwrap_or_else(|| {
            src.file_name().map_or_else(|| src.display().to_string(), |n| n.to_string_lossy().into_owned())
        });
        if name.is_empty() || name.contains(['/', '\\']) {
            return Err(bad(format!("drafter name `{name}` of {} is empty or holds a path separator", src.display())));
        }
        if let Some(first) = seen.insert(name.clone(), src) {
            return Err(Error::InvalidInput {
                input: name.clone(),
                problem: format!(
                    "drafters {} and {} share the name `{name}`: give each its own with --names (their exports, logs and results would be one)",
                    first.display(),
                    src.display()
                ),
            });
        }
        out.push(name);
    }
    Ok(out)
}

/// Put each drafter in `engine`'s layout: served as is when it already is (or with `as_is`, the
/// layout then saying why it may accept less), else exported into `<workdir>/drafters/<name>-<layout>`.
pub fn served_drafters(
    engine: Engine,
    as_is: bool,
    target: &Path,
    drafters: &[PathBuf],
    names: &[String],
    workdir: &Path,
) -> Result<Vec<ServedDrafter>> {
    let names = drafter_names(drafters, names)?;
    let native = layout_for(engine)?;
    let mut out = Vec::with_capacity(drafters.len());
    for (src, name) in drafters.iter().zip(names) {
        let parsed = read_config(&src.join("config.json"), None)?;
        let dialect = parsed.dialect;
        let warning = refusal(dialect, engine).or_else(|| dialect.served_by_warning(native, &parsed.config.aux_layers));
        let (dir, layout, as_is_warning) = match warning {
            None => (src.clone(), format!("{} layout, served as is", dialect.engine()), None),
            Some(w) if as_is => (src.clone(), format!("served as is (--as-is): {w}"), Some(w)),
            Some(_) => {
                let dest = workdir.join("drafters").join(format!("{name}-{}", native.name()));
                let opts = ExportOptions { target: Some(target.to_path_buf()), overwrite: true, ..Default::default() };
                let rep = export(src, native, &dest, opts)?;
                let layout = format!(
                    "{} layout exported to {}'s ({}, aux ids {:?} {}) in {}",
                    dialect.engine(),
                    native.engine(),
                    native.name(),
                    rep.aux_layer_ids,
                    rep.aux_convention.as_str(),
                    dest.display()
                );
                (dest, layout, None)
            }
        };
        out.push(ServedDrafter { name, source: src.clone(), dir, layout, warning: as_is_warning });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SGLang refuses the speculators layout at start; every other pairing loads.
    #[test]
    fn only_sglang_refuses_a_layout_and_it_is_the_speculators_one() {
        let r = refusal(Dialect::Speculators, Engine::Sglang).unwrap();
        assert!(r.contains("refuses") && r.contains("model_type") && r.contains("--to sglang"), "{r}");
        assert_eq!(refusal(Dialect::Sglang, Engine::Sglang), None);
        assert_eq!(refusal(Dialect::Speculators, Engine::Vllm), None);
        assert_eq!(refusal(Dialect::Sglang, Engine::Vllm), None);
    }

    /// Issue 34 §2: two runs' `checkpoint-756` used to be exported into one folder, both served as
    /// the second, and `--predict` predicted both from the first.
    #[test]
    fn two_drafters_of_one_final_name_are_refused_or_named_apart() {
        let same = [PathBuf::from("runA/checkpoint-756"), PathBuf::from("runB/checkpoint-756")];
        let e = drafter_names(&same, &[]).unwrap_err().to_string();
        assert!(e.contains("runA/checkpoint-756") && e.contains("runB/checkpoint-756") && e.contains("--names"), "{e}");
        assert_eq!(drafter_names(&same, &["a".into(), "b".into()]).unwrap(), ["a", "b"]);
        assert!(drafter_names(&same, &["a".into(), "a".into()]).unwrap_err().to_string().contains("share the name"));
        assert!(drafter_names(&same, &["a".into()]).unwrap_err().to_string().contains("2 drafters"));
        assert!(drafter_names(&same, &["a".into(), "x/y".into()]).is_err());
        assert!(layout_for(Engine::Openai).is_err());
        assert_eq!(layout_for(Engine::Vllm).unwrap(), Dialect::Speculators);
    }
}
