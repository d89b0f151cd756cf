//! Export a drafter to the SGLang or the vLLM/speculators dialect (eagle3.md §5), and verify the
//! result by reading it back.
//!
//! Serving engines give no error for a drafter with a renamed key, a dropped `d2t` or aux ids in
//! the wrong convention: the only symptom is an accept length near 1. So the exporter loads and
//! validates the source, refuses what the destination engine cannot run, writes atomically, then
//! reloads the output through the same loader an import would use and compares every tensor byte
//! for byte with what it meant to write, and the config field by field.

use std::path::{Path, PathBuf};

use aerie_model::checkpoint::io::WeightFiles;
use aerie_model::checkpoint::{
    self, Dialect, DrafterCheckpoint, Dtype, SaveOptions, config, keys, load_drafter_with_notes, planned_tensors,
    save_drafter,
};
use aerie_model::{AuxConvention, DrafterConfig};
use serde::Serialize;

use crate::{Error, Result};

/// What to export besides the dialect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// The target model (directory, or a safetensors file with its embedding): supplies the
    /// embedding and the layer count when the source lacks them.
    pub target: Option<PathBuf>,
    /// Float dtype to write; `None` keeps the source's (bit-identical).
    pub dtype: Option<Dtype>,
    /// Ship `embed_tokens.weight` (engines take it from the target; default off).
    pub include_embedding: bool,
    /// Replace an existing non-empty output directory.
    pub overwrite: bool,
}

/// One tensor as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportedTensor {
    /// Key in the output file.
    pub key: String,
    /// Stored dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
}

/// What an export wrote. Returned only after the read-back check passed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExportReport {
    /// Source directory.
    pub src: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// Dialect of the source.
    pub from: Dialect,
    /// Dialect written.
    pub to: Dialect,
    /// The serving engine this output is for (SGLang or vLLM).
    pub engine: String,
    /// `torch_dtype` written.
    pub dtype: Dtype,
    /// Aux layer ids as written into the config.
    pub aux_layer_ids: Vec<usize>,
    /// Their convention (output-of-layer for SGLang, input-of-layer for speculators).
    pub aux_convention: AuxConvention,
    /// Every tensor written, sorted by key.
    pub tensors: Vec<ExportedTensor>,
    /// Total tensor bytes.
    pub bytes: u64,
    /// Whether `embed_tokens.weight` was written.
    pub embedding_included: bool,
    /// Defaults and repairs applied on load (t2d derived, embedding from the target, ...).
    pub notes: Vec<String>,
}

/// Export the drafter in `src` to `out` in dialect `to`, then verify the written directory.
///
/// Fails, naming the file and the problem, when the source does not validate, when the
/// destination cannot run the drafter (`norm_before_residual` to SGLang), when `out` is
/// non-empty without `overwrite`, or when the read-back differs from what was meant.
pub fn export(src: &Path, to: Dialect, out: &Path, opts: ExportOptions) -> Result<ExportReport> {
    // One export per output (the read-back must see this run's files), never into an input.
    let _lock = aerie_data::lock::OutputLock::beside(out)?;
    let mut inputs = vec![("the drafter", src)];
    if let Some(t) = opts.target.as_deref() {
        inputs.push(("--target", t));
    }
    aerie_data::owned::check_not_input(out, "--out", &inputs)?;
    let loaded = load_drafter_with_notes(src, opts.target.as_deref())?;
    let ckpt = &loaded.checkpoint;
    if to == Dialect::Sglang && ckpt.config.norm_before_residual {
        return Err(aerie_model::Error::Unsupported {
            path: src.join("config.json"),
            message: "this drafter uses norm_before_residual=true (the residual is \
                      hidden_norm(h)); SGLang's EAGLE-3 drafters have no such option and \
                      would run it wrongly. Export it to the speculators dialect for vLLM."
                .into(),
        }
        .into());
    }
    let save = SaveOptions {
        dialect: to,
        dtype: opts.dtype,
        include_embedding: opts.include_embedding,
        overwrite: opts.overwrite,
    };
    // speculators' loader (and vLLM) read the verifier from the config: without a name,
    // `AutoConfig.from_pretrained(None)` fails, so refuse before writing anything.
    // MLA drafters have no speculators form: their vLLM layout is the flat DeepSeek config, which
    // names no verifier (aerie-model's `checkpoint/config/mla.rs`).
    let verifier = match to {
        Dialect::Speculators if ckpt.config.mla.is_none() => {
            Some(verifier_of(src, &ckpt.config, opts.target.as_deref())?)
        }
        _ => None,
    };
    save_drafter(ckpt, out, &save)?;
    if let Some((name, architectures)) = &verifier {
        write_verifier(&out.join("config.json"), name, architectures)?;
    }
    let dtype = opts.dtype.unwrap_or(ckpt.weight_dtype);
    let tensors = verify(ckpt, out, &save, dtype, verifier.as_ref().map(|(n, _)| n.as_str()))?;
    let aux = match to {
        Dialect::Sglang => ckpt.config.aux_layers.output_of_layer(),
        Dialect::Speculators => ckpt.config.aux_layers.input_of_layer(),
    };
    let bytes = tensors.iter().map(|t| (t.shape.iter().product::<usize>() * t.dtype.size()) as u64).sum();
    Ok(ExportReport {
        src: src.to_path_buf(),
        out: out.to_path_buf(),
        from: ckpt.dialect,
        to,
        engine: to.engine().to_string(),
        dtype,
        aux_layer_ids: aux,
        aux_convention: match to {
            Dialect::Sglang => AuxConvention::OutputOfLayer,
            Dialect::Speculators => AuxConvention::InputOfLayer,
        },
        tensors,
        bytes,
        embedding_included: opts.include_embedding,
        notes: loaded.notes,
    })
}

/// The verifier a speculators export names: the `--target` when given (its hub id when it is a
/// snapshot of the Hugging Face cache, else its path; `architectures` from its config.json),
/// else the target the drafter config records (`target_name_or_path`, architectures unknown).
fn verifier_of(src: &Path, cfg: &DrafterConfig, target: Option<&Path>) -> Result<(String, Vec<String>)> {
    if let Some(t) = target {
        let info = aerie_model::checkpoint::read_target_info(t)?;
        let name = hub_id_of_snapshot(t).unwrap_or_else(|| t.display().to_string());
        return Ok((name, info.architectures));
    }
    match &cfg.target_name_or_path {
        Some(name) if !name.trim().is_empty() => Ok((name.clone(), Vec::new())),
        _ => Err(aerie_model::Error::Unsupported {
            path: src.join("config.json"),
            message: "the drafter config names no target model (no target_name_or_path / verifier \
                      name_or_path), and a speculators export must name its verifier (speculators and \
                      vLLM load it from there): pass --target DIR|HUB_ID"
                .into(),
        }
        .into()),
    }
}

/// `org/name` of a Hugging Face cache snapshot path (`…/models--org--name/snapshots/REV`).
fn hub_id_of_snapshot(path: &Path) -> Option<String> {
    let path = if path.is_file() { path.parent()? } else { path };
    let snapshots = path.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let repo = snapshots.parent()?.file_name()?.to_str()?.strip_prefix("models--")?;
    let (org, name) = repo.split_once("--")?;
    Some(format!("{org}/{name}"))
}

/// Set `speculators_config.verifier` of the written config (atomically).
fn write_verifier(path: &Path, name: &str, architectures: &[String]) -> Result<()> {
    let io = |e: std::io::Error| Error::from(aerie_model::Error::io(path, e));
    let text = std::fs::read_to_string(path).map_err(io)?;
    let mut cfg: serde_json::Value = serde_json::from_str(&text).map_err(|e| io(std::io::Error::other(e)))?;
    cfg["speculators_config"]["verifier"] = serde_json::json!({ "name_or_path": name, "architectures": architectures });
    let mut text = serde_json::to_string_pretty(&cfg).expect("JSON values always serialize");
    text.push('\n');
    Ok(aerie_data::atomic::write_bytes(path, text.as_bytes())?)
}

/// Two configs that mean the same drafter (aux ids compared in one convention).
fn config_differences(want: &DrafterConfig, got: &DrafterConfig) -> Vec<String> {
    let mut p = Vec::new();
    if want.aux_layers.output_of_layer() != got.aux_layers.output_of_layer() {
        p.push(format!(
            "aux layers read back as output of {:?}, expected {:?}",
            got.aux_layers.output_of_layer(),
            want.aux_layers.output_of_layer()
        ));
    }
    let mut got = got.clone();
    got.aux_layers = want.aux_layers.clone();
    if got != *want {
        p.push(format!("config read back as {got:?}, expected {want:?}"));
    }
    p
}

/// Read `out` back and compare it with what `save_drafter` meant to write.
fn verify(
    ckpt: &DrafterCheckpoint,
    out: &Path,
    save: &SaveOptions,
    dtype: Dtype,
    verifier: Option<&str>,
) -> Result<Vec<ExportedTensor>> {
    let planned = planned_tensors(ckpt, save)?;
    let mut problems = Vec::new();

    // 1. The file holds exactly the planned keys, with the planned dtypes and shapes.
    let headers = WeightFiles::open_dir(out)?.headers()?;
    for key in planned.keys().filter(|k| !headers.contains_key(*k)) {
        problems.push(format!("`{key}` was not written"));
    }
    for key in headers.keys().filter(|k| !planned.contains_key(*k)) {
        problems.push(format!("`{key}` was written but not meant to be"));
    }

    // 2. The config parses back, in the right dialect, to the same drafter.
    let cfg_path = out.join("config.json");
    let parsed = config::read_config(&cfg_path, None)?;
    if parsed.dialect != save.dialect {
        problems.push(format!("config reads back as the {} dialect, expected {}", parsed.dialect, save.dialect));
    }
    if parsed.torch_dtype != Some(dtype) {
        problems.push(format!("torch_dtype reads back as {:?}, expected {dtype}", parsed.torch_dtype));
    }
    if parsed.has_num_nextn_predict_layers {
        problems.push("config sets num_nextn_predict_layers".into());
    }
    let mut want = ckpt.config.clone();
    if let Some(name) = verifier {
        want.target_name_or_path = Some(name.to_owned());
    }
    problems.extend(config_differences(&want, &parsed.config));

    // 3. The loader an import would use sees every tensor bit-identical to the plan.
    let reloaded = checkpoint::load_drafter(out, None)?;
    // A `t2d` the files do not hold is the loader's derivation from `d2t` (a layout shipped
    // without it, as NVIDIA's modelopt export is, stays without it).
    let in_files = |name: &str| reloaded.source.as_ref().is_none_or(|s| s.tensors.contains(name));
    for (name, t) in reloaded.tensors.iter().filter(|(name, _)| name.as_str() != keys::T2D || in_files(name)) {
        let key = keys::file_key(name, save.dialect);
        match planned.get(&key) {
            Some(want) if want.as_ref() == t => {}
            Some(want) if want.dtype != t.dtype || want.shape != t.shape => problems.push(format!(
                "`{key}` reads back as {} {:?}, expected {} {:?}",
                t.dtype, t.shape, want.dtype, want.shape
            )),
            Some(_) => problems.push(format!("`{key}` reads back with different bytes")),
            None => problems.push(format!("`{key}` (canonical `{name}`) reads back but was not planned")),
        }
    }
    if !problems.is_empty() {
        return Err(Error::Verify { path: out.to_path_buf(), problems });
    }
    Ok(headers.into_iter().map(|(key, h)| ExportedTensor { key, dtype: h.dtype, shape: h.shape }).collect())
}
