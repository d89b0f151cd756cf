//! [`import_gguf`]: a llama-architecture GGUF file → an HF `LlamaForCausalLM` directory
//! (`config.json`, `generation_config.json`, `model.safetensors` in float32, `tokenizer.json`,
//! `tokenizer_config.json`).
//!
//! Everything that can be checked before writing is: architecture, hyperparameters, tokenizer,
//! every tensor's name, type and shape. The directory is then written into a temporary sibling
//! of the output and renamed into place once it has been read back (safetensors header,
//! tokenizer loaded with the `tokenizers` crate), so an interrupted or failed import leaves no
//! half-written output. Tensors are dequantised one at a time while `model.safetensors` is
//! streamed, so peak memory is one float32 tensor, not the model.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::Serialize;

use super::config::{LlamaHparams, SpecialIds, config_json, generation_config_json};
use super::dequant::{self, DequantError, SUPPORTED};
use super::names::{RowOrder, hf_name, unpermute_rows};
use super::reader::{GgufFile, TensorInfo};
use super::tokenizer::GgufVocab;
use crate::error::{Error, Result};

/// Options of [`import_gguf`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ImportOptions {
    /// Replace an existing output directory (only once the new one is complete).
    pub force: bool,
}

/// What [`import_gguf`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    /// The GGUF file read.
    pub source: PathBuf,
    /// The directory written.
    pub out: PathBuf,
    /// GGUF version of the source.
    pub gguf_version: u32,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// The recovered hyperparameters.
    pub hparams: LlamaHparams,
    /// `lm_head` shares `embed_tokens` (no `output.weight` in the file).
    pub tie_word_embeddings: bool,
    /// Tensors written.
    pub tensors: usize,
    /// Parameters written.
    pub parameters: u64,
    /// Source tensors per ggml type.
    pub source_types: BTreeMap<String, usize>,
    /// Tokens in `tokenizer.json`.
    pub tokenizer_vocab: usize,
    /// `tokenizer.ggml.pre`, mapped to an HF pre-tokenizer.
    pub pre_tokenizer: String,
    /// Files in the output directory.
    pub files: Vec<String>,
}

/// One source tensor, resolved to its HF name, shape and row order.
struct Planned<'a> {
    info: &'a TensorInfo,
    hf: String,
    shape: Vec<usize>,
    order: RowOrder,
    heads: usize,
}

/// The files an import writes: `--force` replaces a directory holding these only.
const IMPORT_FILES: [&str; 5] =
    ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];

/// `--force` replaces a previous import, recognised by its files (an empty directory too), and
/// never a directory holding the input: anything else in `out` is not aerie's to delete.
fn check_replaceable(file: &Path, out: &Path) -> Result<()> {
    let refuse = |why: String| Error::ImportOutputForeign { path: out.to_path_buf(), why };
    if !out.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    if let (Ok(f), Ok(o)) = (file.canonicalize(), out.canonicalize())
        && f.starts_with(&o)
    {
        return Err(refuse(format!("it holds the input {}", file.display())));
    }
    for entry in fs::read_dir(out).map_err(io(out))? {
        let name = entry.map_err(io(out))?.file_name();
        let name = name.to_string_lossy();
        if !IMPORT_FILES.contains(&name.as_ref()) {
            return Err(refuse(format!("it holds `{name}`, which no import writes")));
        }
    }
    Ok(())
}

/// Convert the llama-architecture GGUF `file` into an HF directory at `out`.
pub fn import_gguf(file: &Path, out: &Path, opts: ImportOptions) -> Result<ImportReport> {
    // One import into `out` at a time; the lock is beside `out`, which is replaced whole.
    let _lock = aerie_data::lock::OutputLock::beside(out)?;
    if out.exists() {
        if !opts.force {
            return Err(Error::ImportOutputExists { path: out.to_path_buf() });
        }
        check_replaceable(file, out)?;
    }
    let gguf = GgufFile::open(file)?;
    let vocab = GgufVocab::from_gguf(&gguf)?;
    let embed = gguf
        .tensor("token_embd.weight")
        .ok_or_else(|| gguf.format_error("tensor `token_embd.weight` is missing".into()))?;
    let h = LlamaHparams::from_gguf(&gguf, embed.hf_shape()[0])?;
    if vocab.tokens.len() > h.vocab_size {
        return Err(gguf.format_error(format!(
            "{} tokens but only {} embedding rows",
            vocab.tokens.len(),
            h.vocab_size
        )));
    }
    let plan = plan_tensors(&gguf, &h)?;
    let tied = gguf.tensor("output.weight").is_none();
    let attention_bias = plan.iter().any(|p| p.hf.ends_with("_proj.bias"));
    let ids = SpecialIds {
        bos: vocab.bos,
        eos: vocab.eos,
        eot: gguf
            .get_u64("tokenizer.ggml.eot_token_id")?
            .map(|v| v as u32)
            .filter(|&v| (v as usize) < vocab.tokens.len()),
        pad: vocab.pad,
    };

    // Write everything into a temporary sibling, read it back, then rename it into place.
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(io(&parent))?;
    let tmp = tempfile::Builder::new().prefix(".aerie-import-").tempdir_in(&parent).map_err(io(&parent))?;
    let dir = tmp.path();
    // The model's name is where it will live (a GGUF names no Hub repository): drafters trained
    // on it record it as their target (`target_name_or_path`), which a speculators export needs
    // as its verifier, and transformers' AutoConfig loads a local path.
    let mut config = config_json(&h, &ids, tied, attention_bias);
    let abs = std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf());
    config["_name_or_path"] = abs.display().to_string().into();
    write_json(&dir.join("config.json"), &config)?;
    write_json(&dir.join("generation_config.json"), &generation_config_json(&ids))?;
    write_json(&dir.join("tokenizer.json"), &vocab.tokenizer_json())?;
    write_json(&dir.join("tokenizer_config.json"), &vocab.tokenizer_config_json(Some(h.max_position_embeddings)))?;
    write_safetensors(&gguf, &plan, &dir.join("model.safetensors"))?;
    verify_safetensors(&dir.join("model.safetensors"), &plan)?;
    verify_tokenizer(&dir.join("tokenizer.json"), &vocab)?;
    for f in IMPORT_FILES {
        File::open(dir.join(f)).and_then(|f| f.sync_all()).map_err(io(&dir.join(f)))?;
    }
    // Replaces an existing `out` (the caller checked `force`) only once the new one is complete.
    aerie_data::atomic::replace_dir(tmp.path(), out).map_err(io(out))?;

    let mut source_types = BTreeMap::new();
    for p in &plan {
        *source_types.entry(p.info.ggml_type.to_string()).or_insert(0) += 1;
    }
    Ok(ImportReport {
        source: file.to_path_buf(),
        out: out.to_path_buf(),
        gguf_version: gguf.version(),
        name: gguf.get_str("general.name")?.map(str::to_string),
        tie_word_embeddings: tied,
        tensors: plan.len(),
        parameters: plan.iter().map(|p| p.info.n_elements()).sum(),
        source_types,
        tokenizer_vocab: vocab.tokens.len(),
        pre_tokenizer: vocab.pre_name.clone(),
        files: IMPORT_FILES.iter().map(|f| f.to_string()).collect(),
        hparams: h,
    })
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::ImportIo { path: path.to_path_buf(), source }
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| io(path)(e.into()))?;
    text.push('\n');
    fs::write(path, text).map_err(io(path))
}

/// The HF shape a tensor must have, from its HF name.
fn expected_shape(hf: &str, h: &LlamaHparams) -> Option<Vec<usize>> {
    let (hs, is, v) = (h.hidden_size, h.intermediate_size, h.vocab_size);
    let (q, kv) = (h.num_attention_heads * h.head_dim, h.num_key_value_heads * h.head_dim);
    let shape = match hf {
        "model.embed_tokens.weight" | "lm_head.weight" => vec![v, hs],
        "model.norm.weight" => vec![hs],
        _ => {
            let rest = hf.strip_prefix("model.layers.")?;
            let (layer, suffix) = rest.split_once('.')?;
            if layer.parse::<usize>().ok()? >= h.num_hidden_layers {
                return None;
            }
            match suffix {
                "input_layernorm.weight" | "post_attention_layernorm.weight" | "self_attn.o_proj.bias" => vec![hs],
                "self_attn.q_proj.weight" => vec![q, hs],
                "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![kv, hs],
                "self_attn.o_proj.weight" => vec![hs, q],
                "self_attn.q_proj.bias" => vec![q],
                "self_attn.k_proj.bias" | "self_attn.v_proj.bias" => vec![kv],
                "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![is, hs],
                "mlp.down_proj.weight" => vec![hs, is],
                _ => return None,
            }
        }
    };
    Some(shape)
}

/// Resolve every tensor (name, supported type, shape) and check that none is missing.
fn plan_tensors<'a>(g: &'a GgufFile, h: &LlamaHparams) -> Result<Vec<Planned<'a>>> {
    let unsupported = |problem: String| Error::GgufUnsupported { path: g.path().to_path_buf(), problem };
    let mut plan = Vec::with_capacity(g.tensors().len());
    for info in g.tensors() {
        if info.name == "rope_freqs.weight" {
            return Err(unsupported(
                "tensor `rope_freqs.weight` (Llama 3 RoPE scaling): GGUF keeps the per-frequency factors but \
                 not the rope_scaling parameters HF needs"
                    .into(),
            ));
        }
        let (hf, order) = hf_name(&info.name)
            .ok_or_else(|| unsupported(format!("tensor `{}` has no LlamaForCausalLM equivalent", info.name)))?;
        if !dequant::is_supported(info.ggml_type) {
            return Err(Error::GgufTensorType {
                path: g.path().to_path_buf(),
                tensor: info.name.clone(),
                ggml_type: info.ggml_type.to_string(),
                supported: SUPPORTED.join(", "),
            });
        }
        let shape = info.hf_shape();
        let want = expected_shape(&hf, h).ok_or_else(|| {
            unsupported(format!("tensor `{}` is beyond the {} layers", info.name, h.num_hidden_layers))
        })?;
        if shape != want {
            return Err(g.format_error(format!(
                "tensor `{}` ({hf}) has HF shape {shape:?}, but the metadata implies {want:?}",
                info.name
            )));
        }
        let heads = match order {
            RowOrder::PermutedQ => h.num_attention_heads,
            RowOrder::PermutedK => h.num_key_value_heads,
            RowOrder::Keep => 1,
        };
        if order != RowOrder::Keep && !shape[0].is_multiple_of(2 * heads) {
            return Err(g.format_error(format!(
                "tensor `{}`: {} rows do not split into {heads} heads of rotary pairs",
                info.name, shape[0]
            )));
        }
        plan.push(Planned { info, hf, shape, order, heads });
    }
    let have: BTreeSet<&str> = plan.iter().map(|p| p.hf.as_str()).collect();
    let mut required = vec!["model.embed_tokens.weight".to_string(), "model.norm.weight".to_string()];
    for l in 0..h.num_hidden_layers {
        for s in [
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ] {
            required.push(format!("model.layers.{l}.{s}"));
        }
    }
    let missing: Vec<String> = required
        .into_iter()
        .filter(|r| !have.contains(r.as_str()))
        .map(|r| super::names::gguf_name(&r).unwrap_or(r))
        .collect();
    if !missing.is_empty() {
        return Err(g.format_error(format!("missing tensors: {}", missing.join(", "))));
    }
    Ok(plan)
}

/// A tensor's values as float32, in the GGUF (llama.cpp) row order.
pub fn tensor_to_f32(g: &GgufFile, info: &TensorInfo) -> Result<Vec<f32>> {
    let bytes = g.tensor_data(info)?;
    let mut out = vec![0f32; info.n_elements() as usize];
    dequant::dequantize(info.ggml_type, bytes, &mut out).map_err(|e| match e {
        DequantError::Length { expected, got } => {
            g.format_error(format!("tensor `{}`: {got} bytes where {expected} were expected", info.name))
        }
        _ => Error::GgufTensorType {
            path: g.path().to_path_buf(),
            tensor: info.name.clone(),
            ggml_type: info.ggml_type.to_string(),
            supported: SUPPORTED.join(", "),
        },
    })?;
    Ok(out)
}

/// A planned tensor as a lazily materialised safetensors view: `data()` dequantises (and undoes
/// the Q/K permutation) when the writer reaches it, so only one tensor is in memory at a time.
/// `View::data` cannot fail, so a failure is parked in `failure` and reported after writing.
struct LazyTensor<'a> {
    gguf: &'a GgufFile,
    planned: &'a Planned<'a>,
    failure: &'a RefCell<Option<Error>>,
}

impl LazyTensor<'_> {
    fn materialize(&self) -> Result<Vec<u8>> {
        let p = self.planned;
        let mut values = tensor_to_f32(self.gguf, p.info)?;
        if p.order != RowOrder::Keep {
            let rows = p.shape[0];
            let cols = p.shape.get(1).copied().unwrap_or(1);
            values = unpermute_rows(&values, rows, cols, p.heads).map_err(|e| {
                self.gguf.format_error(format!(
                    "tensor `{}`: cannot split {} rows into {} heads",
                    p.info.name, e.rows, e.n_head
                ))
            })?;
        }
        Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.planned.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self.materialize() {
            Ok(bytes) => Cow::Owned(bytes),
            Err(e) => {
                self.failure.borrow_mut().get_or_insert(e);
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.planned.info.n_elements() as usize * 4
    }
}

fn write_safetensors(g: &GgufFile, plan: &[Planned<'_>], path: &Path) -> Result<()> {
    let failure = RefCell::new(None);
    let views = plan.iter().map(|p| (p.hf.clone(), LazyTensor { gguf: g, planned: p, failure: &failure }));
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(views, Some(meta), path)
        .map_err(|e| Error::ImportIo { path: path.to_path_buf(), source: std::io::Error::other(e.to_string()) })?;
    match failure.into_inner() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn verify_safetensors(path: &Path, plan: &[Planned<'_>]) -> Result<()> {
    let file = File::open(path).map_err(io(path))?;
    // SAFETY: a read-only map of the file this function just wrote into a private directory.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
    let verify = |problems: Vec<String>| Error::ImportVerify { path: path.to_path_buf(), problems };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| verify(vec![e.to_string()]))?;
    let mut problems = Vec::new();
    if st.len() != plan.len() {
        problems.push(format!("{} tensors written, {} planned", st.len(), plan.len()));
    }
    for p in plan {
        match st.tensor(&p.hf) {
            Ok(t) if t.dtype() == Dtype::F32 && t.shape() == p.shape.as_slice() => {}
            Ok(t) => problems.push(format!("{}: {:?} {:?}, expected F32 {:?}", p.hf, t.dtype(), t.shape(), p.shape)),
            Err(e) => problems.push(format!("{}: {e}", p.hf)),
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(verify(problems)) }
}

/// Load the written `tokenizer.json` with the `tokenizers` crate: the vocabulary size must match,
/// every added token must encode to its own single id, and a probe must round-trip.
fn verify_tokenizer(path: &Path, vocab: &GgufVocab) -> Result<()> {
    let verify = |problems: Vec<String>| Error::ImportVerify { path: path.to_path_buf(), problems };
    let tok = tokenizers::Tokenizer::from_file(path).map_err(|e| verify(vec![format!("does not load: {e}")]))?;
    let mut problems = Vec::new();
    if tok.get_vocab_size(true) != vocab.tokens.len() {
        problems.push(format!("{} tokens loaded, {} written", tok.get_vocab_size(true), vocab.tokens.len()));
    }
    for t in &vocab.added {
        match tok.encode(t.content.as_str(), false) {
            Ok(enc) if enc.get_ids() == [t.id] => {}
            Ok(enc) => problems.push(format!("`{}` encodes to {:?}, not [{}]", t.content, enc.get_ids(), t.id)),
            Err(e) => problems.push(format!("`{}`: {e}", t.content)),
        }
    }
    let probe = "Hello, world! 1234 + 5.6e7 = x\n\tünïcödé 日本語 🦙  spaces  ";
    match tok.encode(probe, false).and_then(|enc| tok.decode(enc.get_ids(), false)) {
        Ok(back) if back == probe => {}
        Ok(back) => problems.push(format!("{probe:?} decodes back as {back:?}")),
        Err(e) => problems.push(format!("probe text: {e}")),
    }
    if problems.is_empty() { Ok(()) } else { Err(verify(problems)) }
}
