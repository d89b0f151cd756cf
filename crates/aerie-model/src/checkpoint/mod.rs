//! Checkpoint I/O: drafter directories in both dialects, target heads and embeddings, and the one
//! table of key renames (see [`keys`]).
//!
//! A drafter directory holds `config.json` plus `model.safetensors` (or shards and an index). In
//! memory it is a [`DrafterCheckpoint`] whose tensors carry canonical (SGLang, unprefixed) names
//! whatever the file used. [`load_drafter`] validates everything on the way in and
//! [`save_drafter`] on the way out (serving engines do not: a wrong key or a broken d2t only
//! shows as an accept length near 1).
//!
//! ```no_run
//! use std::path::Path;
//! use aerie_model::checkpoint::{Dialect, SaveOptions, load_drafter, save_drafter};
//!
//! let ckpt = load_drafter(Path::new("drafter"), Some(Path::new("target-model")))?;
//! let opts = SaveOptions { dialect: Dialect::Speculators, ..SaveOptions::default() };
//! save_drafter(&ckpt, Path::new("drafter-vllm"), &opts)?;
//! # Ok::<(), aerie_model::Error>(())
//! ```

pub mod config;
pub mod io;
pub mod keys;
pub mod synthetic;
pub mod target;
pub mod tensors;
pub mod validate;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use target::{TargetInfo, load_target_embedding, load_target_head, read_target_info, target_num_layers};
pub use tensors::{Dtype, HostTensor, TensorMap};

use crate::{DrafterConfig, Error, Result};

/// The two on-disk conventions for EAGLE-3 drafters (eagle3.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// SGLang/SpecForge: `LlamaForCausalLMEagle3`, `midlayer.*`, output-of-layer aux ids.
    Sglang,
    /// vLLM/speculators: `Eagle3Speculator`, `layers.0.*`, input-of-layer aux ids.
    Speculators,
}

impl Dialect {
    /// Lower-case name (`sglang`, `speculators`).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Sglang => "sglang",
            Dialect::Speculators => "speculators",
        }
    }

    /// The serving engine that reads this layout's aux ids in their own convention: SGLang for
    /// the SGLang layout (output-of-layer ids), vLLM for the speculators layout (input-of-layer).
    pub fn engine(self) -> &'static str {
        match self {
            Dialect::Sglang => "SGLang",
            Dialect::Speculators => "vLLM",
        }
    }

    /// The warning for a drafter in this layout served as it is by an engine whose own layout
    /// is `native` (which engine reads which layout is `aerie_hub::served::layout_for`), or
    /// `None` when they are the same. Neither engine converts aux ids between conventions or
    /// warns: an SGLang export served by vLLM is fed hidden states one layer off (vllm.md: τ
    /// 1.285 → 1.266 on the quickstart's drafter, silently).
    pub fn served_by_warning(self, native: Dialect, aux: &crate::AuxLayers) -> Option<String> {
        (native != self).then(|| {
            let aux_in_config = match self {
                Dialect::Sglang => aux.output_of_layer(),
                Dialect::Speculators => aux.input_of_layer(),
            };
            let (mine, theirs, shift) = match self {
                Dialect::Sglang => ("output-of-layer", "input-of-layer", "one layer earlier than it was trained on"),
                Dialect::Speculators => ("input-of-layer", "output-of-layer", "one layer later than it was trained on"),
            };
            format!(
                "this is the {} layout (aux ids {aux_in_config:?} are {mine}); {} reads them as {theirs}, so the drafter would see hidden states {shift} and accept less, with no error: export it with `aerie export --to {}` first",
                self.engine(),
                native.engine(),
                native.name()
            )
        })
    }

    /// Parse a user-facing name (`sglang`, `specforge`, `speculators`, `vllm`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sglang" | "specforge" => Some(Dialect::Sglang),
            "speculators" | "vllm" => Some(Dialect::Speculators),
            _ => None,
        }
    }
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A drafter in memory: config, canonical-named tensors, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterCheckpoint {
    /// The resolved config.
    pub config: DrafterConfig,
    /// The dialect it was read in (or is meant to be written in by default).
    pub dialect: Dialect,
    /// Dtype of the float weights (that of `fc.weight`); written as `torch_dtype`.
    pub weight_dtype: Dtype,
    /// Tensors under canonical names (see [`keys`]).
    pub tensors: TensorMap,
    /// The directory it was loaded from (empty for one built in memory).
    pub dir: PathBuf,
    /// The files it was read from, as written (`None` for one built in memory): saved back in
    /// that layout, it keeps their config spelling and tensor set ([`SourceLayout`]).
    pub source: Option<SourceLayout>,
}

/// What a drafter's files said beyond aerie's resolved config, so that a published drafter
/// (AQ-MedAI's, lightseek's, NVIDIA's) saved back in its own layout keeps its extra config keys,
/// their spelling, and its tensor set: NVIDIA's modelopt export ships `d2t` without `t2d`, which
/// aerie would otherwise derive and add. A warm start exported untrained is then the file it
/// came from (tensors, shapes, dtypes, values and config keys).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceLayout {
    /// The layout the files are in; the spelling is kept only when saving in this one.
    pub dialect: Dialect,
    /// `config.json` as read.
    pub config: serde_json::Value,
    /// Canonical names of the tensors the weight files held (before any derived `t2d` or the
    /// target's embedding were added).
    pub tensors: std::collections::BTreeSet<String>,
}

impl SourceLayout {
    /// The layout for weights aerie has trained: every key that describes how the source's weights
    /// were trained, not how they are read, says what aerie did. `mla_use_nope: true` (TorchSpec's
    /// NoPE switch, read by no engine) becomes `false`, since aerie trains with RoPE
    /// ([`config::MLA_USE_NOPE_NOTE`]); a fine-tuned drafter that kept the flag would claim a
    /// training it did not have, and `inspect --strict` would refuse aerie's own export.
    pub fn trained_by_aerie(mut self) -> Self {
        if let Some(flag) = self.config.get_mut("mla_use_nope").filter(|v| v.as_bool() == Some(true)) {
            *flag = serde_json::Value::Bool(false);
        }
        self
    }
}

impl DrafterCheckpoint {
    /// The source layout when saving in `dialect` keeps it.
    fn kept_layout(&self, dialect: Dialect) -> Option<&SourceLayout> {
        self.source.as_ref().filter(|s| s.dialect == dialect)
    }
}

/// How [`save_drafter`] writes a drafter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveOptions {
    /// Target dialect.
    pub dialect: Dialect,
    /// Float dtype to write; `None` keeps each tensor's dtype (bit-identical).
    pub dtype: Option<Dtype>,
    /// Write `embed_tokens.weight` too (serving engines take it from the target, so the default
    /// leaves it out; it is the target's and large).
    pub include_embedding: bool,
    /// Replace an existing non-empty output directory.
    pub overwrite: bool,
}

impl Default for SaveOptions {
    fn default() -> Self {
        Self { dialect: Dialect::Sglang, dtype: None, include_embedding: false, overwrite: false }
    }
}

/// A loaded drafter plus what the loader did that the user should hear about.
#[derive(Debug, Clone)]
pub struct LoadedDrafter {
    /// The checkpoint.
    pub checkpoint: DrafterCheckpoint,
    /// Defaults applied and repairs made (t2d derived from d2t, embedding taken from the
    /// target, ...).
    pub notes: Vec<String>,
    /// Whether the config gave `target_hidden_size` explicitly.
    pub target_hidden_size_explicit: bool,
}

/// Load and validate the drafter in `dir`. See [`load_drafter_with_notes`].
pub fn load_drafter(dir: &Path, target: Option<&Path>) -> Result<DrafterCheckpoint> {
    Ok(load_drafter_with_notes(dir, target)?.checkpoint)
}

/// A drafter is a directory (config.json and its weights); a file given instead, such as its
/// `config.json`, is named with the directory that holds it, and a training run's directory with
/// the checkpoint to give instead (a run holds drafters, it is not one).
pub fn check_drafter_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        if dir.join("config.json").is_file() {
            return Ok(());
        }
        return Err(Error::Config { path: dir.to_path_buf(), message: not_a_drafter_dir(dir) });
    }
    let message = match dir.parent().filter(|p| dir.is_file() && p.join("config.json").is_file()) {
        Some(parent) => format!(
            "a file, not a drafter directory: give the directory that holds config.json and the weights, `{}`",
            if parent.as_os_str().is_empty() { Path::new(".") } else { parent }.display()
        ),
        None if dir.exists() => "not a directory: a drafter is a directory holding config.json and its weights".into(),
        None => "no such directory".into(),
    };
    Err(Error::Config { path: dir.to_path_buf(), message })
}

/// Why the directory `dir`, which has no `config.json`, is not a drafter, and what to give
/// instead: one of a training run's drafters (`best/`, else its latest `checkpoint-<step>/`), or
/// the drafter a directory holds one level down (the quickstart's `drafter-sglang/`, say).
fn not_a_drafter_dir(dir: &Path) -> String {
    let sub = |name: &str| dir.join(name).join("config.json").is_file();
    let mut checkpoints: Vec<(u64, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("checkpoint-")?.parse().ok()?;
            sub(&name).then_some((step, name))
        })
        .collect();
    checkpoints.sort();
    let run = dir.join("summary.json").is_file() || !checkpoints.is_empty();
    let mut drafters: Vec<String> = Vec::new();
    if sub("best") {
        drafters.push("best".into());
    }
    if let Some((_, latest)) = checkpoints.last() {
        drafters.push(latest.clone());
    }
    if !run {
        let mut below: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| sub(n))
            .collect();
        below.sort();
        drafters.extend(below.into_iter().take(3));
    }
    let give = |what: &str| {
        let names: Vec<String> = drafters.iter().map(|d| format!("`{}`", dir.join(d).display())).collect();
        format!("{what}: give a drafter directory instead, e.g. {}", names.join(" or "))
    };
    match (run, drafters.is_empty()) {
        (true, false) => give("a training run's directory, not a drafter (it holds no config.json)"),
        (true, true) => "a training run's directory with no checkpoint yet: a drafter is a directory holding \
                         config.json and model.safetensors, which a run writes as checkpoint-<step>/"
            .into(),
        (false, false) => give("holds no config.json, so it is not a drafter"),
        (false, true) => {
            "holds no config.json: a drafter is a directory holding config.json and model.safetensors".into()
        }
    }
}

/// Load the drafter in `dir` (either dialect, single or sharded, `midlayer.*` or `layers.0.*`,
/// with or without `model.`), and validate it, reporting every problem at once.
///
/// `target` (a target model directory, or a safetensors file with its embedding) supplies
/// `embed_tokens.weight` when the drafter lacks it, and the layer count when the config lacks
/// aux ids. A `t2d` missing beside `d2t` is derived from it.
pub fn load_drafter_with_notes(dir: &Path, target: Option<&Path>) -> Result<LoadedDrafter> {
    check_drafter_dir(dir)?;
    let cfg_path = dir.join("config.json");
    let raw_config = config::read_config_value(&cfg_path)?;
    let mut parsed = config::parse_config(&raw_config, &cfg_path, None)?;
    if !parsed.aux_ids_known
        && let Some(t) = target.filter(|t| t.is_dir())
    {
        parsed = config::parse_config(&raw_config, &cfg_path, Some(target_num_layers(t)?))?;
    }
    let cfg = parsed.resolved(&cfg_path)?;
    let mut notes = parsed.notes.clone();
    let mut problems: Vec<String> = Vec::new();
    if let Some(n) = parsed.num_hidden_layers.filter(|&n| n != 1) {
        problems.push(format!("config: num_hidden_layers is {n}; an EAGLE-3 drafter has exactly 1 layer"));
    }

    let files = io::WeightFiles::open_dir(dir)?;
    let mut tensors = TensorMap::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    for (key, t) in files.load_all()? {
        let name = keys::canonical_name(&key);
        if let Some(prev) = origin.insert(name.clone(), key.clone()) {
            problems.push(format!("file keys `{prev}` and `{key}` both name `{name}`"));
        }
        tensors.insert(name, t);
    }
    let source =
        SourceLayout { dialect: parsed.dialect, config: raw_config, tensors: tensors.keys().cloned().collect() };

    if !tensors.contains_key(keys::EMBED)
        && let Some(t) = target
    {
        let embed = load_target_embedding(t)?;
        // The target's shape against the drafter's config: the validation below would blame the
        // drafter ("embed_tokens.weight has shape ..., expected ...") for a wrong target.
        if embed.shape != [cfg.vocab_size, cfg.hidden_size] {
            return Err(Error::Incompatible(format!(
                "the target {} has an embedding of {:?} (vocabulary × hidden size), but the drafter {} was made \
                 for a target of vocabulary {v} and hidden size {h} ([{v}, {h}], its config.json): give the target \
                 it was trained for, or a drafter trained for this target",
                t.display(),
                embed.shape,
                dir.display(),
                v = cfg.vocab_size,
                h = cfg.hidden_size,
            )));
        }
        tensors.insert(keys::EMBED.into(), embed);
        notes.push(format!("embed_tokens.weight taken from the target {}", t.display()));
    }
    if !tensors.contains_key(keys::T2D)
        && let Some(d2t) = tensors.get(keys::D2T).filter(|t| t.dtype == Dtype::I64)
    {
        let t2d = validate::derive_t2d(&d2t.to_i64(keys::D2T)?, cfg.vocab_size);
        tensors.insert(keys::T2D.into(), HostTensor::from_bool(vec![t2d.len()], &t2d));
        notes.push("t2d absent: derived from d2t".into());
    }

    let weight_dtype = match tensors.get(keys::FC).map(|t| t.dtype).filter(|d| d.is_float()) {
        Some(d) => d,
        None => parsed.torch_dtype.filter(|d| d.is_float()).unwrap_or(Dtype::F32),
    };
    if let Some(td) = parsed.torch_dtype
        && td != weight_dtype
    {
        notes.push(format!("config says torch_dtype {td} but the weights are {weight_dtype}"));
    }
    let checks = validate::validate(&cfg, &tensors, parsed.target_hidden_size_explicit);
    problems.extend(checks.into_iter().map(|p| p.message));
    if !problems.is_empty() {
        return Err(Error::Invalid { path: dir.to_path_buf(), problems });
    }
    Ok(LoadedDrafter {
        checkpoint: DrafterCheckpoint {
            config: cfg,
            dialect: parsed.dialect,
            weight_dtype,
            tensors,
            dir: dir.to_path_buf(),
            source: Some(source),
        },
        notes,
        target_hidden_size_explicit: parsed.target_hidden_size_explicit,
    })
}

/// The tensors [`save_drafter`] writes for `ckpt` under `opts`: file keys of the dialect, floats
/// cast to `opts.dtype`, the embedding only when asked, `t2d` derived when only `d2t` is held.
/// Exporters compare what they read back against this.
pub fn planned_tensors<'a>(
    ckpt: &'a DrafterCheckpoint,
    opts: &SaveOptions,
) -> Result<BTreeMap<String, Cow<'a, HostTensor>>> {
    let unsupported = |message: String| Error::Unsupported { path: ckpt.dir.clone(), message };
    if let Some(d) = opts.dtype.filter(|d| !d.is_float()) {
        return Err(unsupported(format!("cannot write weights as {d}: choose F32, BF16 or F16")));
    }
    if opts.include_embedding && !ckpt.tensors.contains_key(keys::EMBED) {
        return Err(unsupported(
            "the embedding was asked for but the checkpoint has none: give the target model to \
             take it from"
                .into(),
        ));
    }
    // Saved in its source's layout, a drafter whose files had no t2d gets none (the loader
    // derived it; engines read d2t only).
    let t2d_wanted = ckpt.kept_layout(opts.dialect).is_none_or(|s| s.tensors.contains(keys::T2D));
    let mut out = BTreeMap::new();
    for (name, t) in &ckpt.tensors {
        if (name == keys::EMBED && !opts.include_embedding) || (name == keys::T2D && !t2d_wanted) {
            continue;
        }
        let t = match opts.dtype {
            Some(d) if t.dtype.is_float() && t.dtype != d => Cow::Owned(t.cast_float(name, d)?),
            _ => Cow::Borrowed(t),
        };
        out.insert(keys::file_key(name, opts.dialect), t);
    }
    if t2d_wanted
        && !ckpt.tensors.contains_key(keys::T2D)
        && let Some(d2t) = ckpt.tensors.get(keys::D2T)
    {
        let t2d = validate::derive_t2d(&d2t.to_i64(keys::D2T)?, ckpt.config.vocab_size);
        let t = HostTensor::from_bool(vec![t2d.len()], &t2d);
        out.insert(keys::file_key(keys::T2D, opts.dialect), Cow::Owned(t));
    }
    Ok(out)
}

/// Validate `ckpt` and write it to the directory `out` as `config.json` + `model.safetensors`,
/// atomically (a temporary directory renamed into place). Refuses what the target engine cannot
/// run, e.g. `norm_before_residual` in the SGLang dialect.
pub fn save_drafter(ckpt: &DrafterCheckpoint, out: &Path, opts: &SaveOptions) -> Result<()> {
    let problems = validate::validate(&ckpt.config, &ckpt.tensors, true);
    if !problems.is_empty() {
        // Name the source when there is one, else the output being written.
        let path = if ckpt.dir.as_os_str().is_empty() { out.to_path_buf() } else { ckpt.dir.clone() };
        return Err(Error::Invalid { path, problems: problems.into_iter().map(|p| p.message).collect() });
    }
    let dtype = opts.dtype.unwrap_or(ckpt.weight_dtype);
    let cfg_path = out.join("config.json");
    let mut cfg_json = config::to_json(&ckpt.config, opts.dialect, dtype, &cfg_path)?;
    if let Some(source) = ckpt.kept_layout(opts.dialect) {
        cfg_json = config::keep_source_spelling(cfg_json, &source.config, &cfg_path)?;
    }
    let mut text = serde_json::to_string_pretty(&cfg_json).expect("JSON values always serialize");
    text.push('\n');
    let planned = planned_tensors(ckpt, opts)?;
    io::write_dir_atomic(out, opts.overwrite, |tmp| {
        let cfg_file = tmp.join("config.json");
        std::fs::write(&cfg_file, &text).map_err(|e| Error::io(&cfg_file, e))?;
        io::write_safetensors(&tmp.join(io::SINGLE_FILE), planned.iter().map(|(k, t)| (k.as_str(), t.as_ref())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trained_layout_says_rope_where_the_source_said_nope() {
        let layout = |config| SourceLayout { dialect: Dialect::Sglang, config, tensors: Default::default() };
        let nope = layout(serde_json::json!({"mla_use_nope": true, "bos_token_id": 1}));
        assert_eq!(nope.trained_by_aerie().config, serde_json::json!({"mla_use_nope": false, "bos_token_id": 1}));
        // Nothing else is touched, and a key the source never wrote is not added.
        let plain = serde_json::json!({"bos_token_id": 1});
        assert_eq!(layout(plain.clone()).trained_by_aerie().config, plain);
    }

    #[test]
    fn each_layout_names_its_engine_and_warns_for_the_other() {
        assert_eq!((Dialect::Sglang.engine(), Dialect::Speculators.engine()), ("SGLang", "vLLM"));
        // The same layers, named in each layout's own convention in its warning.
        let aux = crate::AuxLayers { ids: vec![1, 14, 26], convention: crate::AuxConvention::OutputOfLayer };
        assert_eq!(Dialect::Sglang.served_by_warning(Dialect::Sglang, &aux), None);
        assert_eq!(Dialect::Speculators.served_by_warning(Dialect::Speculators, &aux), None);
        let w = Dialect::Sglang.served_by_warning(Dialect::Speculators, &aux).unwrap();
        assert!(w.contains("SGLang layout") && w.contains("[1, 14, 26]") && w.contains("one layer earlier"), "{w}");
        assert!(w.contains("aerie export --to speculators"), "{w}");
        let w = Dialect::Speculators.served_by_warning(Dialect::Sglang, &aux).unwrap();
        assert!(w.contains("[2, 15, 27]") && w.contains("one layer later") && w.contains("--to sglang"), "{w}");
    }

    #[test]
    fn save_refuses_invalid_or_unwritable_checkpoints_and_writes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let mut ckpt = synthetic::random_drafter(&synthetic::tiny_config(), Dtype::BF16, 1);
        ckpt.tensors.remove(keys::LM_HEAD);
        let e = save_drafter(&ckpt, &out, &SaveOptions::default()).unwrap_err().to_string();
        assert!(e.contains("out: invalid checkpoint") && e.contains("missing tensor `lm_head.weight`"), "{e}");
        let ckpt = synthetic::random_drafter(&synthetic::tiny_config(), Dtype::BF16, 1);
        let opts = SaveOptions { dtype: Some(Dtype::I64), ..SaveOptions::default() };
        let e = save_drafter(&ckpt, &out, &opts).unwrap_err().to_string();
        assert!(e.contains("cannot write weights as I64"), "{e}");
        assert!(!out.exists());
        // A valid one round-trips through load, embedding left out by default.
        save_drafter(&ckpt, &out, &SaveOptions::default()).unwrap();
        let back = load_drafter(&out, None).unwrap();
        assert!(!back.tensors.contains_key(keys::EMBED));
        assert_eq!(back.tensors.len(), ckpt.tensors.len() - 1);
        assert_eq!((back.config, back.dialect, back.weight_dtype), (ckpt.config, Dialect::Sglang, Dtype::BF16));
    }
}
