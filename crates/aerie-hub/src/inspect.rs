//! Inspect a drafter directory: what it holds and what is wrong with it, without holding its
//! weights (a Kimi drafter is gigabytes): headers and `d2t`/`t2d` are read, and each float
//! tensor once, one at a time, for the finiteness check every loader makes
//! (`validate::check_finite`: one check, so `inspect --strict` never passes what loaders refuse).
//!
//! The lints target the failures serving engines do not report (eagle3.md §2, §4, §5): a reduced
//! vocab without `d2t`, aux ids outside the target, a hidden-size mismatch hidden by a missing
//! `target_hidden_size`, `num_nextn_predict_layers` (SGLang builds an MTP head), a wrong
//! architecture string, missing or unknown weight keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aerie_model::checkpoint::config::{self, MLA_ARCHITECTURE, ParsedConfig, SGLANG_ARCHITECTURE};
use aerie_model::checkpoint::io::WeightFiles;
use aerie_model::checkpoint::validate::{self, D2tStats, Expected, TensorMeta};
use aerie_model::checkpoint::{Dialect, Dtype, TargetInfo, keys, read_target_info};
use aerie_model::{AuxConvention, DrafterConfig, RopeConfig, RopeScaling};
use serde::Serialize;

use crate::Result;

pub use crate::severity::Severity;

/// One lint result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// Stable kebab-case code, for scripts (`reduced-vocab-without-d2t`, `missing-key`, ...).
    pub code: String,
    /// What is wrong and, where possible, what to do.
    pub message: String,
}

/// One stored tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorReport {
    /// Canonical name.
    pub name: String,
    /// Key in the file.
    pub file_key: String,
    /// Stored dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element count.
    pub params: u64,
    /// Whether training updates it (everything but the embedding, `d2t`, `t2d`).
    pub trainable: bool,
}

/// Where the embedding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingSource {
    /// Shipped in the checkpoint.
    Checkpoint,
    /// Not shipped; the given target holds it.
    Target,
    /// Not shipped and no target given (engines take it from the served target).
    Absent,
}

/// Where the parameter counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CountSource {
    /// The stored tensor headers.
    Weights,
    /// The config's shapes (the directory holds no weights).
    Config,
}

/// Aux layers in both conventions (eagle3.md §2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuxReport {
    /// Whether the ids are known (from the config, or defaulted from the target's layer count).
    pub known: bool,
    /// The convention the config's ids are written in.
    pub convention_in_config: AuxConvention,
    /// "Output of layer i" ids (SGLang `eagle_config`, SpecForge).
    pub output_of_layer: Vec<usize>,
    /// "Input of layer i" ids (vLLM, speculators).
    pub input_of_layer: Vec<usize>,
    /// The target's decoder layer count, when a target config was given.
    pub target_num_layers: Option<usize>,
}

/// Vocabulary and draft map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VocabReport {
    /// V (target vocab).
    pub vocab_size: usize,
    /// Vd (draft vocab).
    pub draft_vocab_size: usize,
    /// Whether `d2t` is stored.
    pub has_d2t: bool,
    /// Whether `t2d` is stored.
    pub has_t2d: bool,
    /// Offsets and mapped id range, when `d2t` is stored and readable.
    pub d2t: Option<D2tStats>,
}

/// Everything `inspect` found out; `Serialize` for `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InspectReport {
    /// The inspected directory.
    pub dir: PathBuf,
    /// Config dialect.
    pub dialect: Dialect,
    /// The serving engine that reads this layout's aux ids in their own convention.
    pub engine: String,
    /// `architectures` as written.
    pub architectures: Vec<String>,
    /// The published drafters' trainer whose layout this is (SpecForge, TorchSpec, modelopt),
    /// recognised by the keys it writes (`published.rs`).
    pub published_layout: Option<String>,
    /// The resolved config (aux ids empty when unknown).
    pub config: DrafterConfig,
    /// `torch_dtype` in the config.
    pub config_dtype: Option<Dtype>,
    /// The safetensors files (empty for a config-only directory).
    pub weight_files: Vec<PathBuf>,
    /// Dtype of `fc.weight`, when stored.
    pub weight_dtype: Option<Dtype>,
    /// Stored tensors, by canonical name.
    pub tensors: Vec<TensorReport>,
    /// Every tensor the config implies, with its shape.
    pub expected: Vec<Expected>,
    /// Trainable parameters (all but embedding, d2t, t2d).
    pub trainable_params: u64,
    /// Frozen parameters: the V x H embedding, shipped or not.
    pub frozen_params: u64,
    /// Whether the counts come from the weights or (config-only) from the config.
    pub params_from: CountSource,
    /// Where the embedding comes from.
    pub embedding: EmbeddingSource,
    /// Vocab and d2t.
    pub vocab: VocabReport,
    /// Aux layers, both conventions.
    pub aux: AuxReport,
    /// RoPE.
    pub rope: RopeConfig,
    /// Facts that are not problems (defaults applied, t2d derivable, ...).
    pub notes: Vec<String>,
    /// Lint results, errors first.
    pub findings: Vec<Finding>,
}

impl InspectReport {
    /// Number of error findings.
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }

    /// Number of warning findings.
    pub fn warnings(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Warning).count()
    }

    /// What serving this layout with `engine` as it is does: an error when that engine refuses
    /// the layout at start (a speculators export given to SGLang, [`crate::served::refusal`]), a
    /// warning when it loads it but reads its aux ids in the other convention (an SGLang export
    /// given to vLLM).
    pub fn served_by(&mut self, engine: aerie_engine::Engine) {
        let Ok(native) = crate::served::layout_for(engine) else { return };
        if let Some(e) = crate::served::refusal(self.dialect, engine) {
            self.findings.insert(0, Finding { severity: Severity::Error, code: "layout-engine".into(), message: e });
        } else if let Some(w) = self.dialect.served_by_warning(native, &self.config.aux_layers) {
            self.findings.push(Finding { severity: Severity::Warning, code: "layout-engine".into(), message: w });
        }
    }

    /// Process exit code for the CLI: 0 clean, 2 with errors; warnings count as errors only
    /// under `strict`.
    pub fn exit_code(&self, strict: bool) -> i32 {
        if self.errors() > 0 || (strict && self.warnings() > 0) { 2 } else { 0 }
    }
}

struct Lints(Vec<Finding>);

impl Lints {
    fn error(&mut self, code: &str, message: impl Into<String>) {
        self.0.push(Finding { severity: Severity::Error, code: code.into(), message: message.into() });
    }
    fn warn(&mut self, code: &str, message: impl Into<String>) {
        self.0.push(Finding { severity: Severity::Warning, code: code.into(), message: message.into() });
    }
}

/// Inspect the drafter in `dir`; `target` (a model directory, or a safetensors file with its
/// embedding) enables the checks against the target. Reads the config, the tensor headers and
/// `d2t`/`t2d` only. Errors only when a file cannot be read at all (the config, the target's
/// config, a safetensors header); every problem with the contents becomes a [`Finding`].
pub fn inspect(dir: &Path, target: Option<&Path>) -> Result<InspectReport> {
    aerie_model::checkpoint::check_drafter_dir(dir)?;
    let cfg_path = dir.join("config.json");
    let target_info = match target {
        Some(t) if t.is_dir() && t.join("config.json").is_file() => Some(read_target_info(t)?),
        _ => None,
    };
    let target_layers = target_info.as_ref().and_then(|t| t.num_hidden_layers);
    let parsed = config::read_config(&cfg_path, target_layers)?;
    let cfg = parsed.config.clone();
    let mut lints = Lints(Vec::new());
    let mut notes = parsed.notes.clone();
    lint_config(&parsed, &mut lints);
    let raw = config::read_config_value(&cfg_path)?;
    for (severity, code, message) in crate::published::lint(&raw) {
        lints.0.push(Finding { severity, code: code.into(), message });
    }
    if let Some(info) = &target_info {
        lint_target(&parsed, info, &mut lints);
    }

    // Headers, under canonical names.
    let files = WeightFiles::find(dir)?;
    let mut tensors = Vec::new();
    let mut metas: BTreeMap<String, TensorMeta> = BTreeMap::new();
    let mut file_keys: BTreeMap<String, String> = BTreeMap::new();
    if let Some(files) = &files {
        for (key, h) in files.headers()? {
            let name = keys::canonical_name(&key);
            if let Some(prev) = file_keys.insert(name.clone(), key.clone()) {
                lints.error("duplicate-key", format!("file keys `{prev}` and `{key}` both name `{name}`"));
            }
            let trainable = ![keys::EMBED, keys::D2T, keys::T2D].contains(&name.as_str());
            tensors.push(TensorReport {
                name: name.clone(),
                file_key: key,
                dtype: h.dtype,
                shape: h.shape.clone(),
                params: h.numel() as u64,
                trainable,
            });
            metas.insert(name, TensorMeta { dtype: h.dtype, shape: h.shape });
        }
    } else {
        lints.error(
            "no-weights",
            format!("{} holds a config but no model.safetensors or model.safetensors.index.json", dir.display()),
        );
    }
    for p in validate::check_layout(&cfg, &metas, parsed.target_hidden_size_explicit) {
        lints.error(p.code, p.message);
    }
    let mut floats: Vec<Dtype> = Vec::new();
    for t in tensors.iter().filter(|t| t.dtype.is_float()) {
        if !floats.contains(&t.dtype) {
            floats.push(t.dtype);
        }
    }
    if floats.len() > 1 {
        lints.warn("mixed-dtypes", format!("float weights come in several dtypes: {floats:?}"));
    }
    let weight_dtype = metas.get(keys::FC).map(|m| m.dtype);
    if let (Some(w), Some(c)) = (weight_dtype, parsed.torch_dtype)
        && w != c
    {
        lints.warn("torch-dtype-mismatch", format!("config says torch_dtype {c} but fc.weight is {w}"));
    }

    // Float values: the loaders' own check, a tensor at a time.
    if let Some(files) = &files {
        for (name, key) in &file_keys {
            if !metas.get(name).is_some_and(|m| m.dtype.is_float()) {
                continue;
            }
            if let Some(t) = files.load(&[key.as_str()])?.get(key)
                && let Some(p) = validate::check_finite(name, t)
            {
                lints.error(p.code, p.message);
            }
        }
    }

    // d2t / t2d values.
    let vocab = inspect_vocab(&cfg, files.as_ref(), &file_keys, &metas, &mut lints, &mut notes)?;

    let embedding = if metas.contains_key(keys::EMBED) {
        EmbeddingSource::Checkpoint
    } else if target.is_some_and(|t| target_has_embedding(t).unwrap_or(false)) {
        EmbeddingSource::Target
    } else {
        if let Some(t) = target {
            lints.error("no-target-embedding", format!("the target {} holds no input embedding", t.display()));
        }
        EmbeddingSource::Absent
    };

    let expected = validate::expected_tensors(&cfg);
    let (trainable_params, params_from) = if files.is_some() {
        (tensors.iter().filter(|t| t.trainable).map(|t| t.params).sum(), CountSource::Weights)
    } else {
        let sum = expected
            .iter()
            .filter(|e| e.required && e.kind == validate::ElemKind::Float)
            .map(|e| e.shape.iter().product::<usize>() as u64)
            .sum();
        (sum, CountSource::Config)
    };
    let aux = AuxReport {
        known: parsed.aux_ids_known,
        convention_in_config: match parsed.dialect {
            Dialect::Sglang => AuxConvention::OutputOfLayer,
            Dialect::Speculators => AuxConvention::InputOfLayer,
        },
        output_of_layer: cfg.aux_layers.output_of_layer(),
        input_of_layer: cfg.aux_layers.input_of_layer(),
        target_num_layers: target_layers,
    };
    let mut findings = lints.0;
    findings.sort_by_key(|f| f.severity);
    Ok(InspectReport {
        dir: dir.to_path_buf(),
        dialect: parsed.dialect,
        engine: parsed.dialect.engine().to_string(),
        architectures: parsed.architectures.clone(),
        published_layout: crate::published::recognise(&raw).map(str::to_string),
        config_dtype: parsed.torch_dtype,
        weight_files: files.map(|f| f.files()).unwrap_or_default(),
        weight_dtype,
        tensors,
        expected,
        trainable_params,
        frozen_params: (cfg.vocab_size * cfg.hidden_size) as u64,
        params_from,
        embedding,
        vocab,
        aux,
        rope: cfg.rope.clone(),
        notes,
        findings,
        config: cfg,
    })
}

/// Whether a target (directory or file) holds an embedding, from its index or header.
fn target_has_embedding(target: &Path) -> aerie_model::Result<bool> {
    let files = if target.is_dir() {
        match WeightFiles::find(target)? {
            Some(f) => f,
            None => return Ok(false),
        }
    } else {
        WeightFiles::open_file(target)
    };
    for key in keys::TARGET_EMBED_KEYS {
        if files.contains(key)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Lints on the config alone.
fn lint_config(parsed: &ParsedConfig, lints: &mut Lints) {
    let cfg = &parsed.config;
    for p in cfg.problems() {
        if parsed.aux_ids_known || !p.contains("aux") {
            lints.error("config", p);
        }
    }
    if !parsed.aux_ids_known {
        lints.warn(
            "aux-ids-unknown",
            "the config lists no aux layer ids; engines fall back to the target's default \
             (output of layers [1, N/2-1, N-4]); give the target to resolve them",
        );
    } else if cfg.aux_layers.ids.windows(2).any(|w| w[0] >= w[1]) {
        lints.warn(
            "aux-ids-not-ascending",
            format!(
                "aux layer ids {:?} are not strictly ascending (features are concatenated low to high)",
                cfg.aux_layers.ids
            ),
        );
    }
    if cfg.mla.is_some() && !matches!(cfg.rope.scaling, RopeScaling::Default | RopeScaling::Yarn { .. }) {
        lints.error(
            "mla-rope-scaling",
            format!(
                "an MLA drafter with {:?} RoPE scaling: vLLM serves any rope_scaling of an MLA drafter as \
                 DeepSeek YaRN, so it would rotate differently from training",
                cfg.rope.scaling
            ),
        );
    }
    if parsed.has_num_nextn_predict_layers {
        lints.error(
            "num-nextn-predict-layers",
            "the config sets num_nextn_predict_layers: SGLang would treat the drafter as an MTP head; remove the key",
        );
    }
    if let Some(n) = parsed.num_hidden_layers.filter(|&n| n != 1) {
        lints.error("num-hidden-layers", format!("num_hidden_layers is {n}; an EAGLE-3 drafter has exactly 1"));
    }
    if !parsed.draft_vocab_size_explicit {
        lints.warn(
            "no-draft-vocab-size",
            "the config has no draft_vocab_size: SGLang then replaces the drafter's lm_head by the target's",
        );
    }
    match parsed.dialect {
        Dialect::Sglang => {
            let want = if cfg.mla.is_some() { MLA_ARCHITECTURE } else { SGLANG_ARCHITECTURE };
            if parsed.architectures.first().map(String::as_str) != Some(want) {
                lints.error(
                    "architecture",
                    format!(
                        "architectures is {:?}; SGLang runs this drafter's layout only as [\"{want}\"]",
                        parsed.architectures
                    ),
                );
            }
            if cfg.norm_before_residual {
                lints.error(
                    "norm-before-residual-sglang",
                    "norm_before_residual=true in an SGLang config: SGLang cannot run it; export to speculators",
                );
            }
            if parsed.use_aux_hidden_state == Some(false) {
                lints.error(
                    "aux-hidden-state-off",
                    "eagle_config.use_aux_hidden_state is false: SGLang would not feed the aux features to fc",
                );
            }
        }
        Dialect::Speculators => {
            if !parsed.norm_before_residual_explicit {
                lints.warn(
                    "norm-before-residual-implicit",
                    "norm_before_residual is absent and vLLM assumes true; SpecForge/SGLang-trained \
                     drafters need false: write it explicitly",
                );
            }
        }
    }
}

/// Lints against the target's config.
fn lint_target(parsed: &ParsedConfig, info: &TargetInfo, lints: &mut Lints) {
    let cfg = &parsed.config;
    if let Some(n) = info.num_hidden_layers
        && parsed.aux_ids_known
    {
        let bad: Vec<usize> = match cfg.aux_layers.convention {
            AuxConvention::OutputOfLayer => cfg.aux_layers.ids.iter().copied().filter(|&i| i >= n).collect(),
            AuxConvention::InputOfLayer => cfg.aux_layers.ids.iter().copied().filter(|&i| i > n).collect(),
        };
        if !bad.is_empty() {
            lints.error(
                "aux-ids-out-of-range",
                format!(
                    "aux layer ids {bad:?} ({:?} convention) lie outside the target's {n} layers",
                    cfg.aux_layers.convention
                ),
            );
        }
    }
    if let Some(v) = info.vocab_size
        && v != cfg.vocab_size
    {
        lints
            .error("vocab-mismatch", format!("the drafter's vocab_size is {} but the target's is {v}", cfg.vocab_size));
    }
    if let Some(h) = info.hidden_size
        && h != cfg.target_hidden_size
    {
        lints.error(
            "target-hidden-mismatch",
            format!(
                "the drafter expects target_hidden_size {} but the target's hidden_size is {h}",
                cfg.target_hidden_size
            ),
        );
    }
    if let Some(m) = info.max_position_embeddings
        && cfg.max_position_embeddings < m
    {
        lints.warn(
            "max-position-below-target",
            format!(
                "max_position_embeddings {} is below the target's {m}: engines may cap the context",
                cfg.max_position_embeddings
            ),
        );
    }
}

/// Read `d2t`/`t2d` (only these) and check the vocab map.
fn inspect_vocab(
    cfg: &DrafterConfig,
    files: Option<&WeightFiles>,
    file_keys: &BTreeMap<String, String>,
    metas: &BTreeMap<String, TensorMeta>,
    lints: &mut Lints,
    notes: &mut Vec<String>,
) -> Result<VocabReport> {
    let (v, vd) = (cfg.vocab_size, cfg.draft_vocab_size);
    let ok =
        |name: &str, dtype: Dtype, len: usize| metas.get(name).is_some_and(|m| m.dtype == dtype && m.shape == [len]);
    let mut d2t = None;
    let mut t2d = None;
    if let Some(files) = files {
        let mut want = Vec::new();
        if ok(keys::D2T, Dtype::I64, vd) {
            want.push(file_keys[keys::D2T].as_str());
        }
        if ok(keys::T2D, Dtype::Bool, v) {
            want.push(file_keys[keys::T2D].as_str());
        }
        let loaded = files.load(&want)?;
        if let Some(t) = file_keys.get(keys::D2T).and_then(|k| loaded.get(k)) {
            d2t = Some(t.to_i64(keys::D2T)?);
        }
        if let Some(t) = file_keys.get(keys::T2D).and_then(|k| loaded.get(k)) {
            t2d = Some(t.data.iter().map(|&b| b != 0).collect::<Vec<bool>>());
        }
    }
    for p in validate::check_vocab_map(v, vd, d2t.as_deref(), t2d.as_deref()) {
        lints.error(p.code, p.message);
    }
    if metas.contains_key(keys::D2T) && !metas.contains_key(keys::T2D) {
        notes.push("t2d absent: SGLang ignores it; aerie derives it from d2t on load".into());
    }
    Ok(VocabReport {
        vocab_size: v,
        draft_vocab_size: vd,
        has_d2t: metas.contains_key(keys::D2T),
        has_t2d: metas.contains_key(keys::T2D),
        d2t: d2t.as_deref().and_then(validate::d2t_stats),
    })
}
