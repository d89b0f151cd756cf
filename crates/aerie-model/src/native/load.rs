//! Loading a [`TargetModel`] from an HF model directory (`config.json` plus `model.safetensors`
//! or a sharded `model.safetensors.index.json`), under transformers' `modeling_llama.py` key names
//! (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, ..., `model.norm.weight`,
//! `lm_head.weight`). Files may hold f32, bf16 or f16; weights are widened on the host and held
//! in the dtype asked for.
//!
//! Every header is checked before any data is read, and every problem is reported at once: a
//! missing key, a shape that disagrees with `config.json`, or a tensor the config does not
//! account for (e.g. q/k/v biases in a checkpoint whose config says `llama`: ignoring them would
//! give a silently wrong model). Layers are then loaded one at a time to bound host memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};

use super::config::{TargetConfig, TargetSpec};
use super::llama::{Embedding, Projection, TargetAttention, TargetBody, TargetLayer, TargetModel};
use crate::checkpoint::io::{TensorHeader, WeightFiles};
use crate::checkpoint::validate::check_finite;
use crate::checkpoint::{HostTensor, TensorMap};
use crate::layers::{Linear, Mlp, RmsNorm};
use crate::{Error, Result};

/// File key of the embedding.
pub const EMBED_KEY: &str = "model.embed_tokens.weight";
/// File key of the final norm.
pub const NORM_KEY: &str = "model.norm.weight";
/// File key of the untied head.
pub const LM_HEAD_KEY: &str = "lm_head.weight";

/// The HF file keys of decoder layer `i` with their expected shapes, in forward order.
pub fn layer_tensors(spec: &TargetSpec, i: usize) -> Vec<(String, Vec<usize>)> {
    let (h, im, d) = (spec.hidden_size, spec.intermediate_size, spec.head_dim);
    let (q, kv) = (spec.num_attention_heads * d, spec.num_key_value_heads * d);
    let p = |name: &str| format!("model.layers.{i}.{name}");
    let mut out = vec![(p("input_layernorm.weight"), vec![h])];
    for (name, rows, cols, bias) in [
        ("q_proj", q, h, spec.qkv_bias),
        ("k_proj", kv, h, spec.qkv_bias),
        ("v_proj", kv, h, spec.qkv_bias),
        ("o_proj", h, q, spec.o_bias),
    ] {
        out.push((p(&format!("self_attn.{name}.weight")), vec![rows, cols]));
        if bias {
            out.push((p(&format!("self_attn.{name}.bias")), vec![rows]));
        }
    }
    if spec.qk_norm {
        out.push((p("self_attn.q_norm.weight"), vec![d]));
        out.push((p("self_attn.k_norm.weight"), vec![d]));
    }
    out.push((p("post_attention_layernorm.weight"), vec![h]));
    out.push((p("mlp.gate_proj.weight"), vec![im, h]));
    out.push((p("mlp.up_proj.weight"), vec![im, h]));
    out.push((p("mlp.down_proj.weight"), vec![h, im]));
    out
}

/// Every HF file key the model reads, with its expected shape.
pub fn expected_tensors(spec: &TargetSpec) -> Vec<(String, Vec<usize>)> {
    let mut out = vec![(EMBED_KEY.to_string(), vec![spec.vocab_size, spec.hidden_size])];
    for i in 0..spec.num_hidden_layers {
        out.extend(layer_tensors(spec, i));
    }
    out.push((NORM_KEY.to_string(), vec![spec.hidden_size]));
    if !spec.tie_word_embeddings {
        out.push((LM_HEAD_KEY.to_string(), vec![spec.vocab_size, spec.hidden_size]));
    }
    out
}

/// Every disagreement between the checkpoint's headers and what `spec` needs, one line each.
pub fn check_headers(spec: &TargetSpec, headers: &BTreeMap<String, TensorHeader>) -> Vec<String> {
    let mut problems = Vec::new();
    let expected = expected_tensors(spec);
    for (key, shape) in &expected {
        match headers.get(key) {
            None if key == LM_HEAD_KEY => problems.push(format!(
                "missing tensor `{key}` (config.json says tie_word_embeddings is false; set it to true if the \
                 head is the embedding)"
            )),
            None => problems.push(format!("missing tensor `{key}`")),
            Some(hd) if !hd.dtype.is_float() => {
                problems.push(format!("`{key}` in {} is {}, expected a float tensor", hd.file.display(), hd.dtype))
            }
            Some(hd) if &hd.shape != shape => problems.push(format!(
                "`{key}` in {} has shape {:?}, config.json implies {shape:?}",
                hd.file.display(),
                hd.shape
            )),
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(k, _)| k.as_str()).collect();
    for (key, hd) in headers {
        let ours = key.starts_with("model.") || key.starts_with("lm_head.");
        let harmless = key.ends_with("rotary_emb.inv_freq") || (spec.tie_word_embeddings && key == LM_HEAD_KEY);
        if ours && !harmless && !known.contains(key.as_str()) {
            problems.push(format!(
                "unexpected tensor `{key}` in {}: config.json ({:?}, {} layers) does not use it",
                hd.file.display(),
                spec.arch,
                spec.num_hidden_layers
            ));
        }
    }
    problems
}

/// A linear weight `[out, in]` for the forward, stored `[in, out]` ([`Linear::into_row_major`]):
/// its shape is HF's `[out, in]` (what [`Linear`] expects) while `Linear::forward`'s
/// `w.transpose()` hands the matmul a contiguous row-major `[in, out]` operand. burn-flex's gemm runs that layout 15–35%
/// faster than the strided one (measured on this workload: [128, 576] × [576, 1536] 3.9 ms
/// against 6.1 ms; the decode matvec 0.64 ms against 1.05 ms).
fn linear_weight<B: Backend>(
    key: &str,
    t: &HostTensor,
    out: usize,
    inp: usize,
    device: &B::Device,
    dtype: DType,
) -> Result<Tensor<B, 2>> {
    if t.shape != [out, inp] {
        return Err(Error::Shape(format!("`{key}` has shape {:?}, expected {:?}", t.shape, [out, inp])));
    }
    let x = Tensor::<B, 2>::from_data(TensorData::new(t.to_f32(key)?, [out, inp]), device);
    let x = if dtype == DType::F32 { x } else { x.cast(dtype) };
    Ok(Linear::new(x).into_row_major().weight.val())
}

/// Builds modules from one batch of fetched tensors.
struct Builder<'a, B: Backend> {
    tensors: TensorMap,
    device: &'a B::Device,
    dtype: DType,
    eps: f64,
}

impl<B: Backend> Builder<'_, B> {
    fn take<const D: usize>(&mut self, key: &str, shape: [usize; D]) -> Result<Tensor<B, D>> {
        let t = self.tensors.remove(key).ok_or_else(|| Error::Shape(format!("tensor `{key}` was not loaded")))?;
        crate::drafter::host_to_tensor(key, &t, shape, self.device, self.dtype)
    }

    fn linear(&mut self, key: &str, out: usize, inp: usize) -> Result<Tensor<B, 2>> {
        let t = self.tensors.remove(key).ok_or_else(|| Error::Shape(format!("tensor `{key}` was not loaded")))?;
        linear_weight(key, &t, out, inp, self.device, self.dtype)
    }

    fn norm(&mut self, key: &str, n: usize) -> Result<RmsNorm<B>> {
        Ok(RmsNorm::new(self.take(key, [n])?, self.eps))
    }

    fn proj(&mut self, prefix: &str, rows: usize, cols: usize, bias: bool) -> Result<Projection<B>> {
        use burn::module::Param;
        let weight = Param::from_tensor(self.linear(&format!("{prefix}.weight"), rows, cols)?);
        let bias = if bias { Some(Param::from_tensor(self.take(&format!("{prefix}.bias"), [rows])?)) } else { None };
        Ok(Projection { weight, bias })
    }

    fn layer(&mut self, spec: &TargetSpec, i: usize) -> Result<TargetLayer<B>> {
        let (h, im, d) = (spec.hidden_size, spec.intermediate_size, spec.head_dim);
        let (nh, nkv) = (spec.num_attention_heads, spec.num_key_value_heads);
        let p = |name: &str| format!("model.layers.{i}.{name}");
        let (q_norm, k_norm) = if spec.qk_norm {
            (Some(self.norm(&p("self_attn.q_norm.weight"), d)?), Some(self.norm(&p("self_attn.k_norm.weight"), d)?))
        } else {
            (None, None)
        };
        Ok(TargetLayer {
            input_layernorm: self.norm(&p("input_layernorm.weight"), h)?,
            self_attn: TargetAttention {
                q_proj: self.proj(&p("self_attn.q_proj"), nh * d, h, spec.qkv_bias)?,
                k_proj: self.proj(&p("self_attn.k_proj"), nkv * d, h, spec.qkv_bias)?,
                v_proj: self.proj(&p("self_attn.v_proj"), nkv * d, h, spec.qkv_bias)?,
                o_proj: self.proj(&p("self_attn.o_proj"), h, nh * d, spec.o_bias)?,
                q_norm,
                k_norm,
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: d,
            },
            post_attention_layernorm: self.norm(&p("post_attention_layernorm.weight"), h)?,
            mlp: Mlp {
                gate_proj: Linear::new(self.linear(&p("mlp.gate_proj.weight"), im, h)?),
                up_proj: Linear::new(self.linear(&p("mlp.up_proj.weight"), im, h)?),
                down_proj: Linear::new(self.linear(&p("mlp.down_proj.weight"), h, im)?),
            },
        })
    }
}

/// `tensors` when every one is finite (the check drafters get, [`check_finite`]): a NaN weight
/// of the target makes NaN hidden states that a capture would store as training data.
fn finite(source: &Path, tensors: TensorMap) -> Result<TensorMap> {
    let problems: Vec<String> = tensors.iter().filter_map(|(k, t)| check_finite(k, t)).map(|p| p.message).collect();
    if problems.is_empty() { Ok(tensors) } else { Err(Error::Invalid { path: source.to_path_buf(), problems }) }
}

/// Build the model from checked headers, fetching tensors a layer at a time.
fn build<B: Backend>(
    spec: TargetSpec,
    mut fetch: impl FnMut(&[&str]) -> Result<TensorMap>,
    device: &B::Device,
    dtype: DType,
) -> Result<TargetModel<B>> {
    let (h, v) = (spec.hidden_size, spec.vocab_size);
    let mut batch = |keys: &[String]| -> Result<Builder<'_, B>> {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        Ok(Builder { tensors: fetch(&refs)?, device, dtype, eps: spec.rms_norm_eps })
    };
    let mut top = vec![EMBED_KEY.to_string(), NORM_KEY.to_string()];
    if !spec.tie_word_embeddings {
        top.push(LM_HEAD_KEY.to_string());
    }
    let mut b = batch(&top)?;
    // A tied head gets its own copy in the matmul layout: multiplying by the embedding's
    // transposed view makes burn-flex copy the whole [V, H] matrix on every call (SmolLM2's
    // decode step: 541 ms against 45 ms for the head alone).
    let tied = if spec.tie_word_embeddings { b.tensors.get(EMBED_KEY).cloned() } else { None };
    let embed = b.take(EMBED_KEY, [v, h])?;
    let norm = b.norm(NORM_KEY, h)?;
    let head = match tied {
        Some(t) => linear_weight(EMBED_KEY, &t, v, h, device, dtype)?,
        None => b.linear(LM_HEAD_KEY, v, h)?,
    };
    let lm_head = Some(Linear::new(head));
    let mut layers = Vec::with_capacity(spec.num_hidden_layers);
    for i in 0..spec.num_hidden_layers {
        let keys: Vec<String> = layer_tensors(&spec, i).into_iter().map(|(k, _)| k).collect();
        layers.push(batch(&keys)?.layer(&spec, i)?);
    }
    Ok(TargetModel {
        model: TargetBody { embed_tokens: Embedding { weight: burn::module::Param::from_tensor(embed) }, layers, norm },
        lm_head,
        spec,
    })
}

impl<B: Backend> TargetModel<B> {
    /// Load the HF model directory `dir` with f32 weights.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, DType::F32)
    }

    /// Load the HF model directory `dir`, holding the weights as `dtype` (activations follow the
    /// weights; norms, softmax and attention reduce in f32).
    pub fn load_as(dir: &Path, device: &B::Device, dtype: DType) -> Result<Self> {
        let spec = TargetSpec::of_dir(dir)?;
        let files = WeightFiles::open_dir(dir)?;
        let problems = check_headers(&spec, &files.headers()?);
        if !problems.is_empty() {
            return Err(Error::Invalid { path: files.source().to_path_buf(), problems });
        }
        let source = files.source().to_path_buf();
        build(spec, |keys| finite(&source, files.load(keys)?), device, dtype)
    }

    /// Build from tensors held in memory under HF file keys (tests, benchmarks, converters).
    pub fn from_tensors(config: &TargetConfig, tensors: &TensorMap, device: &B::Device, dtype: DType) -> Result<Self> {
        let origin = PathBuf::from("<in-memory tensors>");
        let spec = config.resolve(&origin)?;
        let headers: BTreeMap<String, TensorHeader> = tensors
            .iter()
            .map(|(k, t)| (k.clone(), TensorHeader { dtype: t.dtype, shape: t.shape.clone(), file: origin.clone() }))
            .collect();
        let problems = check_headers(&spec, &headers);
        if !problems.is_empty() {
            return Err(Error::Invalid { path: origin, problems });
        }
        let fetch = |keys: &[&str]| {
            finite(&origin, keys.iter().filter_map(|&k| Some((k.to_string(), tensors.get(k)?.clone()))).collect())
        };
        build(spec, fetch, device, dtype)
    }
}
