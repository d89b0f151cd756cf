//! The doctor's rules: each a pure function of what the server said ([`ServerConfig`]), the
//! drafter ([`Drafter`], when known) and the [`Options`], returning its findings, or `Err` with
//! what it needed and did not have (listed as not checked, never passed silently). A rule that
//! does not apply to the engine returns no finding.
//!
//! Every finding names the public report it comes from (`source`); the SGLang files named are
//! those of SGLang 0.5.23 (`python/requirements-sglang.txt`), the vLLM ones vLLM 0.32.0's.

use aerie_data::shard::AuxConvention;

use super::{Drafter, Finding, Knob, Options, ServerConfig, Severity};
use crate::Engine;

/// A rule: findings, or why it could not check.
pub type Rule = fn(&ServerConfig, Option<&Drafter>, Options) -> Result<Vec<Finding>, String>;

/// Every rule, by id, in the order they are reported.
pub const ALL: [(&str, Rule); 8] = [
    (EAGLE_NOT_EAGLE3, eagle_not_eagle3),
    (DRAFT_ATTENTION_BACKEND, draft_attention_backend),
    (DRAFT_QUANTIZATION, draft_quantization),
    (VLLM_KIMI_K2_MLA, vllm_kimi_k2_mla),
    (AUX_CONVENTION, aux_convention),
    (VERIFY_CUDA_GRAPH, verify_cuda_graph),
    (ACCEPT_LENGTH_CUMULATIVE, accept_length_cumulative),
    (SERVED_DRAFTER, served_drafter),
];

/// `--speculative-algorithm EAGLE` with an EAGLE-3 drafter.
pub const EAGLE_NOT_EAGLE3: &str = "eagle-not-eagle3";
/// The drafter runs the target's attention backend.
pub const DRAFT_ATTENTION_BACKEND: &str = "draft-attention-backend";
/// An unquantized drafter given the target's quantization.
pub const DRAFT_QUANTIZATION: &str = "draft-quantization-inherited";
/// vLLM does not recognise a `kimi_k2` EAGLE drafter as MLA.
pub const VLLM_KIMI_K2_MLA: &str = "vllm-kimi-k2-mla-drafter";
/// The engine reads the aux layer ids in the other convention.
pub const AUX_CONVENTION: &str = "aux-ids-convention";
/// The verify pass runs without CUDA graphs.
pub const VERIFY_CUDA_GRAPH: &str = "verify-not-cuda-graphed";
/// SGLang's `avg_spec_accept_length` covers the server's whole life.
pub const ACCEPT_LENGTH_CUMULATIVE: &str = "accept-length-cumulative";
/// The drafter checked is not the one the server serves.
pub const SERVED_DRAFTER: &str = "served-drafter";

/// Attention backends of SGLang that run MLA models only (`layers/attention/attention_registry.py`
/// refuses the others for a non-MLA model).
const MLA_ONLY_BACKENDS: [&str; 4] = ["trtllm_mla", "cutedsl_mla", "flashmla", "cutlass_mla"];

fn finding(rule: &'static str, severity: Severity, what: String, fix: String, source: &'static str) -> Finding {
    Finding { rule, severity, what, fix, source }
}

fn not_speculating(s: &ServerConfig) -> bool {
    s.speculating == Some(false)
}

fn needs_drafter(d: Option<&Drafter>) -> Result<&Drafter, String> {
    d.ok_or_else(|| {
        "needs the drafter's config: give --drafter DIR (the server's own drafter is read only when its path is \
         a directory on this machine)"
            .to_string()
    })
}

/// Whether the drafter is an EAGLE-3 one (aerie reads only EAGLE-3 layouts; the architecture or
/// the aux ids say so).
fn is_eagle3(d: &Drafter) -> bool {
    d.architectures.iter().any(|a| a.contains("Eagle3")) || !d.aux_ids.is_empty()
}

/// Whether the target is of SGLang's DeepSeek-V2 family (DeepSeek-V3, Kimi-K2/K2.5).
fn deepseek_family(s: &ServerConfig) -> bool {
    s.target_architectures.iter().any(|a| a.starts_with("Deepseek") || a.starts_with("KimiK2"))
}

/// `--speculative-algorithm EAGLE` where the drafter is EAGLE-3: SGLang then captures no aux
/// hidden states, the drafter's `fc` gets one hidden state where it expects three and is
/// skipped, and the accept length is 1.00 with no warning.
pub fn eagle_not_eagle3(s: &ServerConfig, d: Option<&Drafter>, _: Options) -> Result<Vec<Finding>, String> {
    if not_speculating(s) {
        return Ok(Vec::new());
    }
    let algorithm = s.algorithm.as_deref().ok_or("the speculative algorithm was not read")?;
    let wrong = match s.engine {
        Engine::Sglang => algorithm == "EAGLE",
        Engine::Vllm => algorithm == "eagle",
        Engine::Openai => false,
    };
    if !wrong {
        return Ok(Vec::new());
    }
    let flat = !s.avg_spec_accept_length.is_empty() && s.avg_spec_accept_length.iter().all(|a| (a - 1.0).abs() < 1e-6);
    let (severity, whose) = match d {
        Some(d) if is_eagle3(d) => (Severity::Error, format!("the drafter {} is EAGLE-3", d.path)),
        Some(_) => return Ok(Vec::new()),
        None if flat => (Severity::Error, "the server's accept length is exactly 1.00".to_string()),
        None => (Severity::Warning, "give --drafter to confirm the drafter is EAGLE-3".to_string()),
    };
    let (flag, want, capture) = match s.engine {
        Engine::Vllm => (
            "\"method\" of --speculative-config",
            "\"eagle3\"",
            "vLLM asks the target for aux hidden states only under eagle3, v1/worker/gpu_model_runner.py",
        ),
        _ => (
            "--speculative-algorithm",
            "EAGLE3",
            "SGLang enables the capture only for EAGLE3, model_runner_components/spec_aux_hidden_state.py",
        ),
    };
    Ok(vec![finding(
        EAGLE_NOT_EAGLE3,
        severity,
        format!(
            "the server runs {flag} {algorithm} and {whose}: the target then captures no aux hidden states \
             ({capture}), the drafter's fc never sees the three layers it was trained on, and every draft is rejected: accept \
             length 1.00, no error, no warning"
        ),
        format!("restart the server with {flag} {want}"),
        "sgl-project/sglang#21272 (Kimi-K2.5 with lightseekorg/kimi-k2.5-eagle3 under EAGLE: accept_len 1.00, slower than no speculation)",
    )])
}

/// The drafter without a backend of its own runs the target's attention backends.
pub fn draft_attention_backend(s: &ServerConfig, d: Option<&Drafter>, _: Options) -> Result<Vec<Finding>, String> {
    if s.engine != Engine::Sglang {
        return Err("checked for SGLang only (vLLM's draft backend is not readable without its configuration)".into());
    }
    if not_speculating(s) {
        return Ok(Vec::new());
    }
    match &s.draft_attention_backend {
        Knob::Unknown => return Err("speculative_draft_attention_backend was not read".into()),
        Knob::Explicit(_) => return Ok(Vec::new()),
        Knob::Inherited(_) => {}
    }
    let d = needs_drafter(d)?;
    let backends = s.target_backends();
    if backends.is_empty() {
        return Err("the target's attention backend was not read".into());
    }
    let list = backends.join(" / ");
    if d.mla {
        return Ok(vec![finding(
            DRAFT_ATTENTION_BACKEND,
            Severity::Warning,
            format!(
                "the MLA drafter has no attention backend of its own (speculative_draft_attention_backend unset): its \
                 draft decode and draft extend steps run the target's MLA backend {list} \
                 (speculative/draft_utils.py), whose EAGLE draft paths differ by backend (topk > 1 is refused on \
                 trtllm_mla and cutedsl_mla, cutedsl_mla's draft extend falls back to trtllm_mla)"
            ),
            "set --speculative-draft-attention-backend explicitly to a backend that runs the MLA drafter at your \
             --speculative-eagle-topk, and check the engine's τ against aerie's prediction (`aerie eval serve \
             --predict-from SHARDS`)"
                .into(),
            "sgl-project/sglang#14843 (a draft backend separate from the target's MLA one), sgl-project/sglang#29706 (EAGLE limits of the MLA backends)",
        )]);
    }
    let mla_only: Vec<&str> = backends.iter().copied().filter(|b| MLA_ONLY_BACKENDS.contains(b)).collect();
    if mla_only.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![finding(
        DRAFT_ATTENTION_BACKEND,
        Severity::Error,
        format!(
            "the drafter's attention is Llama's (not MLA) and it inherits the target's MLA-only backend {}: SGLang \
             refuses it (\"{} backend can only be used with MLA models\", layers/attention/attention_registry.py)",
            mla_only.join(", "),
            mla_only[0]
        ),
        "add --speculative-draft-attention-backend flashinfer (or fa3, triton)".into(),
        "sgl-project/sglang#20298 (Kimi-K2.5 + EAGLE-3 on B200: trtllm_mla inherited by the Llama drafter)",
    )])
}

/// An unquantized drafter given the target's `--quantization`.
pub fn draft_quantization(s: &ServerConfig, d: Option<&Drafter>, _: Options) -> Result<Vec<Finding>, String> {
    if s.engine != Engine::Sglang || not_speculating(s) {
        // vLLM 0.32 gives an EAGLE drafter the target's quantization only for MTP and DSpark
        // (config/speculative.py): nothing to inherit.
        return Ok(Vec::new());
    }
    let inherited = match &s.draft_quantization {
        Knob::Unknown => return Err("speculative_draft_model_quantization was not read".into()),
        Knob::Inherited(Some(q)) => q.clone(),
        Knob::Inherited(None) | Knob::Explicit(_) => return Ok(Vec::new()),
    };
    let d = needs_drafter(d)?;
    if d.quantization.is_some() {
        return Ok(Vec::new());
    }
    Ok(vec![finding(
        DRAFT_QUANTIZATION,
        Severity::Warning,
        format!(
            "the drafter {} is unquantized but runs with the target's quantization {inherited}: SGLang copies \
             --quantization onto the draft when --speculative-draft-model-quantization is not given \
             (arg_groups/serving_hook.py), so the drafter is loaded as {inherited} (quantized online, or its load \
             fails), not as it was trained and measured",
            d.path
        ),
        "add --speculative-draft-model-quantization unquant".into(),
        "sgl-project/sglang#28196 (unquantized EAGLE-3/MTP draft inheriting the target's quantization)",
    )])
}

/// A `kimi_k2` MLA drafter in a vLLM whose MLA detection for EAGLE drafters lacks `kimi_k2`.
pub fn vllm_kimi_k2_mla(s: &ServerConfig, d: Option<&Drafter>, _: Options) -> Result<Vec<Finding>, String> {
    if s.engine != Engine::Vllm || not_speculating(s) {
        return Ok(Vec::new());
    }
    let d = needs_drafter(d)?;
    if !(d.mla && d.model_type.as_deref() == Some("kimi_k2")) {
        return Ok(Vec::new());
    }
    let version = s.version.as_deref().unwrap_or("of unknown version");
    Ok(vec![finding(
        VLLM_KIMI_K2_MLA,
        Severity::Warning,
        format!(
            "the MLA drafter {} says model_type kimi_k2, which vLLM ({version}) does not list where it decides \
             whether an EAGLE drafter is MLA: is_deepseek_mla's EAGLE branch \
             (transformers_utils/model_arch_config_convertor.py) lists axk1, deepseek_v2, deepseek_v3, deepseek_v32 \
             and deepseek_mtp in 0.32.0, and no release is known to add kimi_k2; vLLM may then size and run the \
             drafter's KV cache as standard attention (on vLLM's CPU build aerie's kimi_k2 MLA export served \
             correctly, crates/aerie-cli/tests/kimi_job.rs)",
            d.path
        ),
        "serve it with a vLLM that has vllm-project/vllm#45764 (kimi_k2 in that list), or add kimi_k2 to it; do \
         not rename the drafter's model_type to deepseek_v3 (vLLM then builds DeepSeek's MTP head, \
         config/speculative.py)"
            .into(),
        "vllm-project/vllm#45760 and vllm-project/vllm#45764 (lightseekorg/kimi-k2.6-eagle3-mla not recognised as MLA)",
    )])
}

/// The engine reads the drafter's aux layer ids in the other convention than they are written in.
pub fn aux_convention(s: &ServerConfig, d: Option<&Drafter>, _: Options) -> Result<Vec<Finding>, String> {
    if not_speculating(s) || s.engine == Engine::Openai {
        return Ok(Vec::new());
    }
    let d = needs_drafter(d)?;
    if d.aux_ids.is_empty() {
        return Err(format!("the drafter {} lists no aux layer ids (the engine uses its defaults)", d.path));
    }
    let ids = &d.aux_ids;
    let plus_one: Vec<usize> = ids.iter().map(|i| i + 1).collect();
    let minus_one: Vec<usize> = ids.iter().map(|i| i.saturating_sub(1)).collect();
    let source = "sgl-project/sglang#25454 (the two conventions; kimi-k2.5-eagle3-mla lost ~0.10 accept length read in the other one)";
    match (s.engine, d.aux_convention) {
        (Engine::Sglang, AuxConvention::InputOfLayer) => Ok(vec![finding(
            AUX_CONVENTION,
            Severity::Error,
            format!(
                "the drafter {} is in the {} layout (top-level input-of-layer ids {ids:?}): SGLang reads aux ids only \
                 from eagle_config (model_runner_components/spec_aux_hidden_state.py) and does not load this layout",
                d.path, d.layout
            ),
            "serve SGLang the SGLang export (`aerie export DIR --to sglang`)".into(),
            source,
        )]),
        (Engine::Sglang, AuxConvention::OutputOfLayer) => {
            if ids[0] == 1 {
                return Ok(Vec::new());
            }
            if s.target_architectures.is_empty() {
                return Err(format!(
                    "the target's architectures were not read, and SGLang's DeepSeek-V2 family reads ids {ids:?} \
                     (first id not 1) in the other convention than its Llama family"
                ));
            }
            if !deepseek_family(s) {
                return Ok(Vec::new());
            }
            Ok(vec![finding(
                AUX_CONVENTION,
                Severity::Error,
                format!(
                    "the drafter {} writes output-of-layer ids {ids:?}; SGLang's DeepSeek-V2 family ({}) adds 1 only \
                     when the first id is 1 (models/deepseek_v2.py set_eagle3_layers_to_capture), so it reads these \
                     as input-of-layer: the outputs of layers {minus_one:?}, one layer earlier than trained",
                    d.path,
                    s.target_architectures.join(", ")
                ),
                format!(
                    "for this SGLang and target write eagle_config ids {plus_one:?} (the same layers in its \
                     input-of-layer reading), or train on aux layers whose first is 1 (K2.5: [1, 29, 57])"
                ),
                source,
            )])
        }
        (Engine::Vllm, AuxConvention::OutputOfLayer) => Ok(vec![finding(
            AUX_CONVENTION,
            Severity::Warning,
            format!(
                "the drafter {} is in the {} layout with output-of-layer ids {ids:?}; vLLM reads \
                 eagle_aux_hidden_state_layer_ids as input-of-layer whatever the layout, so it feeds the outputs of \
                 layers {minus_one:?}, one layer earlier than trained (measured: τ 1.285 → 1.266, docs/serving.md)",
                d.path, d.layout
            ),
            format!(
                "serve vLLM the speculators export (`aerie export DIR --to speculators`: ids {plus_one:?}), as `aerie \
                 eval serve --engine vllm` does"
            ),
            source,
        )]),
        _ => Ok(Vec::new()),
    }
}

/// The verify pass runs without CUDA graphs: graphs off, or batches above the captured size.
pub fn verify_cuda_graph(s: &ServerConfig, _: Option<&Drafter>, o: Options) -> Result<Vec<Finding>, String> {
    if not_speculating(s) || s.engine == Engine::Openai {
        return Ok(Vec::new());
    }
    let source = "the K2.5 node (aerie's user): verify in extend mode without CUDA graphs, 29-30 ms cycles against 12.1 ms plain steps; vllm-project/vllm#27325 (verify batches above the captured sizes run eagerly)";
    if s.device.as_deref() == Some("cpu") {
        return Ok(vec![finding(
            VERIFY_CUDA_GRAPH,
            Severity::Info,
            "the server runs on the CPU: no CUDA graphs, every verify pass runs eagerly, and its cycle costs say \
             nothing about a GPU node"
                .into(),
            "measure the node's costs on the node (`aerie measure`, `aerie eval serve --costs-out`)".into(),
            source,
        )]);
    }
    let (flag_off, flag_size) = match s.engine {
        Engine::Vllm => ("--enforce-eager (or cudagraph_mode NONE)", "--max-cudagraph-capture-size"),
        _ => ("--disable-cuda-graph (or --disable-decode-cuda-graph)", "--cuda-graph-max-bs-decode"),
    };
    match s.cuda_graph_disabled {
        None => return Err("whether CUDA graphs are on was not read".into()),
        Some(true) => {
            return Ok(vec![finding(
                VERIFY_CUDA_GRAPH,
                Severity::Warning,
                format!(
                    "CUDA graphs are off ({flag_off}): every verify pass (k + 1 tokens per request) runs eagerly, \
                     which can cost several plain decode steps and make any drafter slower than none"
                ),
                format!("remove {flag_off}"),
                source,
            )]);
        }
        Some(false) => {}
    }
    let max = s.cuda_graph_max_bs.ok_or("the CUDA-graph batch limit was not read")?;
    let load = o
        .concurrency
        .or(s.max_running_requests)
        .ok_or("neither --concurrency nor the server's batch limit is known")?;
    let whose = if o.concurrency.is_some() { "the concurrency given" } else { "the server's max_running_requests" };
    let (need, unit) = if s.cuda_graph_counts_tokens {
        let k = s.num_steps.ok_or("the number of draft tokens was not read")?;
        (load * (k + 1), "tokens")
    } else {
        (load, "requests")
    };
    if need <= max {
        return Ok(Vec::new());
    }
    Ok(vec![finding(
        VERIFY_CUDA_GRAPH,
        Severity::Warning,
        format!(
            "the decode CUDA graphs (which the verify pass replays) were captured up to {max} {unit}, and {whose} \
             needs {need}: every verify of a larger batch runs eagerly"
        ),
        format!("raise {flag_size} to {need}, or cap the batch at {max} {unit}"),
        source,
    )])
}

/// SGLang's `avg_spec_accept_length` is an average over the server's whole life.
pub fn accept_length_cumulative(s: &ServerConfig, _: Option<&Drafter>, _: Options) -> Result<Vec<Finding>, String> {
    if s.engine != Engine::Sglang || s.avg_spec_accept_length.is_empty() {
        return Ok(Vec::new());
    }
    let values: Vec<String> = s.avg_spec_accept_length.iter().map(|a| format!("{a:.4}")).collect();
    Ok(vec![finding(
        ACCEPT_LENGTH_CUMULATIVE,
        Severity::Info,
        format!(
            "avg_spec_accept_length {} is spec_total_num_accept_tokens / spec_total_num_forward_ct since the server \
             started (managers/scheduler_components/internal_state.py): every request it ever served, warm-up and \
             other clients included, and it counts each answer's first token (made by the prefill, not by a cycle)",
            values.join(", ")
        ),
        "take τ from `aerie measure --server URL` (per-response counts over its own requests only, differences \
         never totals)"
            .into(),
        "SGLang 0.5.23 source: managers/scheduler_components/internal_state.py (_average_accept_length), metrics_reporter.py",
    )])
}

/// The drafter checked is not the one the server loaded.
pub fn served_drafter(s: &ServerConfig, d: Option<&Drafter>, _: Options) -> Result<Vec<Finding>, String> {
    let (Some(d), Some(served)) = (d, s.draft_model_path.as_deref()) else { return Ok(Vec::new()) };
    let same = |a: &str, b: &str| {
        let canon = |p: &str| std::fs::canonicalize(p).ok();
        a == b || matches!((canon(a), canon(b)), (Some(x), Some(y)) if x == y)
    };
    if same(&d.path, served) {
        return Ok(Vec::new());
    }
    Ok(vec![finding(
        SERVED_DRAFTER,
        Severity::Info,
        format!("the drafter checked ({}) is not the path the server loaded ({served})", d.path),
        "give --drafter the directory the server serves, or check this one before serving it".into(),
        "the server's own configuration",
    )])
}
