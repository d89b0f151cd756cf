//! `aerie doctor`'s rules against recorded bodies: SGLang 0.5.23's own `/server_info` as it
//! resolves real command lines (`tests/fixtures/doctor/README.md` says how each was made), and vLLM
//! command lines as `ps` shows them. Each rule fires on its failure, stays quiet on the correct
//! configuration, and says what it could not check.

use std::path::PathBuf;

use aerie_data::shard::AuxConvention;
use aerie_engine::Engine;
use aerie_engine::doctor::{Diagnosis, Drafter, Options, ServerConfig, Severity, diagnose, rules, sglang, vllm};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// SGLang's configuration from a recorded `/server_info` and `/model_info`.
fn sglang_server(server_info: &str, model_info: &str) -> ServerConfig {
    sglang_from(fixture(server_info), model_info)
}

fn sglang_from(info: Value, model_info: &str) -> ServerConfig {
    let mut cfg = ServerConfig::empty(Engine::Sglang, "http://127.0.0.1:30000");
    sglang::apply_server_info(&mut cfg, &info);
    sglang::apply_model_info(&mut cfg, &fixture(model_info));
    cfg
}

fn drafter(path: &str, mla: bool, model_type: &str, aux_ids: &[usize]) -> Drafter {
    Drafter {
        path: path.into(),
        architectures: vec![if mla { "Eagle3DeepseekV2ForCausalLM" } else { "LlamaForCausalLMEagle3" }.into()],
        model_type: Some(model_type.into()),
        mla,
        quantization: None,
        layout: "sglang".into(),
        aux_ids: aux_ids.to_vec(),
        aux_convention: AuxConvention::OutputOfLayer,
    }
}

/// The quickstart's fixture drafter, as SGLang serves it in the fixtures.
fn smollm_drafter() -> Drafter {
    drafter("/drafters/smollm2-135m-eagle3", false, "llama", &[1, 14, 26])
}

/// lightseek's kimi-k2.5-eagle3-mla, as the K2.5 fixture serves it.
fn k25_mla_drafter() -> Drafter {
    drafter("/drafters/kimi-k2.5-eagle3-mla", true, "kimi_k2", &[1, 29, 57])
}

fn rules_of(d: &Diagnosis, severity: Severity) -> Vec<&'static str> {
    d.findings.iter().filter(|f| f.severity == severity).map(|f| f.rule).collect()
}

fn run(server: ServerConfig, drafter: Option<Drafter>) -> Diagnosis {
    diagnose(server, drafter, Options::default())
}

#[test]
fn eagle_with_an_eagle3_drafter_is_an_error_with_the_fix_and_its_report() {
    let d = run(sglang_server("sglang-cpu-eagle.server_info.json", "llama.model_info.json"), Some(smollm_drafter()));
    assert_eq!(rules_of(&d, Severity::Error), [rules::EAGLE_NOT_EAGLE3], "{:#?}", d.findings);
    let f = &d.findings[0];
    assert!(f.what.contains("--speculative-algorithm EAGLE ") && f.what.contains("1.00"), "{}", f.what);
    assert_eq!(f.fix, "restart the server with --speculative-algorithm EAGLE3");
    assert!(f.source.contains("sgl-project/sglang#21272"));
    assert_eq!(d.exit_code(), 2);
    // Without the drafter, the server's own accept length of exactly 1.00 is the evidence.
    let d = run(sglang_server("sglang-cpu-eagle.server_info.json", "llama.model_info.json"), None);
    assert_eq!(rules_of(&d, Severity::Error), [rules::EAGLE_NOT_EAGLE3]);
    // The same server with EAGLE3 passes.
    let d = run(sglang_server("sglang-cpu-eagle3.server_info.json", "llama.model_info.json"), Some(smollm_drafter()));
    assert!(rules_of(&d, Severity::Error).is_empty(), "{:#?}", d.findings);
}

#[test]
fn the_correct_configuration_passes_clean() {
    let d = run(sglang_server("sglang-gpu-eagle3.server_info.json", "llama.model_info.json"), Some(smollm_drafter()));
    assert!(d.findings.iter().all(|f| f.severity == Severity::Info), "{:#?}", d.findings);
    assert_eq!(rules_of(&d, Severity::Info), [rules::ACCEPT_LENGTH_CUMULATIVE]);
    assert!(
        d.not_checked.iter().all(|n| n.rule == rules::DRAFT_ATTENTION_BACKEND) || d.not_checked.is_empty(),
        "{:#?}",
        d.not_checked
    );
    assert!(d.server.unread.is_empty(), "{:#?}", d.server.unread);
    assert_eq!(d.exit_code(), 0);
    // What was read, in SGLang's own words.
    let s = &d.server;
    assert_eq!(
        (s.version.as_deref(), s.algorithm.as_deref(), s.num_steps, s.eagle_topk),
        (Some("0.5.23"), Some("EAGLE3"), Some(2), Some(1))
    );
    assert_eq!((s.cuda_graph_disabled, s.cuda_graph_max_bs, s.max_running_requests), (Some(false), Some(64), Some(64)));
    // On the CPU (how aerie's tests serve SGLang) the only other word is that graphs do not exist there.
    let d = run(sglang_server("sglang-cpu-eagle3.server_info.json", "llama.model_info.json"), Some(smollm_drafter()));
    assert_eq!(rules_of(&d, Severity::Info), [rules::VERIFY_CUDA_GRAPH, rules::ACCEPT_LENGTH_CUMULATIVE]);
    assert_eq!(d.exit_code(), 0);
}

#[test]
fn an_inherited_quantization_and_a_small_graph_batch_are_flagged() {
    let server = sglang_server("sglang-gpu-fp8-graphs16.server_info.json", "llama.model_info.json");
    let d = run(server.clone(), Some(smollm_drafter()));
    assert_eq!(
        rules_of(&d, Severity::Warning),
        [rules::DRAFT_QUANTIZATION, rules::VERIFY_CUDA_GRAPH],
        "{:#?}",
        d.findings
    );
    let quant = &d.findings[0];
    assert!(
        quant.what.contains("quantization fp8") && quant.fix.contains("--speculative-draft-model-quantization unquant")
    );
    assert!(quant.source.contains("sgl-project/sglang#28196"));
    let graphs = &d.findings[1];
    assert!(graphs.what.contains("up to 16 requests") && graphs.what.contains("needs 64"), "{}", graphs.what);
    assert!(graphs.fix.contains("--cuda-graph-max-bs-decode to 64"), "{}", graphs.fix);
    assert_eq!(d.exit_code(), 0, "warnings do not fail");
    // Measured at a concurrency the graphs cover, the verify is graphed.
    let d = diagnose(server.clone(), Some(smollm_drafter()), Options { concurrency: Some(8) });
    assert_eq!(rules_of(&d, Severity::Warning), [rules::DRAFT_QUANTIZATION]);
    // A drafter quantized on its own keeps its quantization: nothing inherited to flag.
    let quantized = Drafter { quantization: Some("fp8".into()), ..smollm_drafter() };
    assert!(!rules_of(&run(server, Some(quantized)), Severity::Warning).contains(&rules::DRAFT_QUANTIZATION));
    // CUDA graphs off altogether.
    let mut off = fixture("sglang-gpu-eagle3.server_info.json");
    off["disable_cuda_graph"] = true.into();
    let d = run(sglang_from(off, "llama.model_info.json"), Some(smollm_drafter()));
    assert_eq!(rules_of(&d, Severity::Warning), [rules::VERIFY_CUDA_GRAPH]);
    assert!(d.findings[0].fix.contains("remove --disable-cuda-graph"));
}

#[test]
fn the_k25_node_mla_drafter_backend_and_aux_convention() {
    let k25 = || sglang_server("sglang-gpu-k25-mla.server_info.json", "kimi-k25.model_info.json");
    // lightseek's MLA drafter inherits the target's trtllm_mla.
    let d = run(k25(), Some(k25_mla_drafter()));
    assert_eq!(rules_of(&d, Severity::Warning), [rules::DRAFT_ATTENTION_BACKEND], "{:#?}", d.findings);
    assert!(
        d.findings[0].what.contains("trtllm_mla")
            && d.findings[0].fix.contains("--speculative-draft-attention-backend")
    );
    assert_eq!(d.exit_code(), 0);
    // Set explicitly, nothing to say.
    let mut explicit = fixture("sglang-gpu-k25-mla.server_info.json");
    explicit["speculative_draft_attention_backend"] = "flashinfer".into();
    let d = run(sglang_from(explicit, "kimi-k25.model_info.json"), Some(k25_mla_drafter()));
    assert!(rules_of(&d, Severity::Warning).is_empty(), "{:#?}", d.findings);
    // A Llama-attention drafter (AQ-MedAI's shape) on the MLA-only backend: SGLang refuses it.
    let aq = drafter("/drafters/kimi-k2.5-eagle3-mla", false, "llama", &[1, 29, 57]);
    let d = run(k25(), Some(aq));
    assert_eq!(rules_of(&d, Severity::Error), [rules::DRAFT_ATTENTION_BACKEND]);
    assert!(d.findings[0].source.contains("sgl-project/sglang#20298"));
    // Output-of-layer ids whose first is not 1: the DeepSeek family reads them one layer early.
    let moved = drafter("/drafters/kimi-k2.5-eagle3-mla", true, "kimi_k2", &[2, 29, 57]);
    let d = run(k25(), Some(moved.clone()));
    assert_eq!(rules_of(&d, Severity::Error), [rules::AUX_CONVENTION], "{:#?}", d.findings);
    let f = &d.findings[0];
    assert!(f.what.contains("[1, 28, 56]") && f.fix.contains("[3, 30, 58]"), "{}\n{}", f.what, f.fix);
    assert!(f.source.contains("sgl-project/sglang#25454"));
    // The same ids on a Llama target are read as written.
    let d = run(sglang_server("sglang-gpu-eagle3.server_info.json", "llama.model_info.json"), Some(moved));
    assert!(!rules_of(&d, Severity::Error).contains(&rules::AUX_CONVENTION));
    // A speculators export given to SGLang.
    let spec = Drafter {
        layout: "speculators".into(),
        aux_ids: vec![2, 30, 58],
        aux_convention: AuxConvention::InputOfLayer,
        ..k25_mla_drafter()
    };
    assert_eq!(rules_of(&run(k25(), Some(spec)), Severity::Error), [rules::AUX_CONVENTION]);
}

#[test]
fn vllm_from_its_command_line() {
    let server = |cmd: &str| {
        let mut cfg = ServerConfig::empty(Engine::Vllm, "http://127.0.0.1:8000");
        cfg.version = Some("0.32.0".into());
        let argv: Vec<String> = cmd.split(' ').map(str::to_owned).collect();
        vllm::apply_command_line(&mut cfg, &argv);
        cfg
    };
    let good = r#"vllm serve /models/Kimi-K2.5 --tensor-parallel-size 8 --speculative-config {"method":"eagle3","model":"/drafters/kimi-k2.5-eagle3-mla","num_speculative_tokens":3} --max-num-seqs 32 --max-cudagraph-capture-size 128"#;
    let speculators = Drafter {
        layout: "speculators".into(),
        aux_ids: vec![2, 30, 58],
        aux_convention: AuxConvention::InputOfLayer,
        ..k25_mla_drafter()
    };
    // The kimi_k2 MLA drafter: vLLM 0.32's MLA list for EAGLE drafters lacks kimi_k2.
    let d = run(server(good), Some(speculators.clone()));
    assert_eq!(rules_of(&d, Severity::Warning), [rules::VLLM_KIMI_K2_MLA], "{:#?}", d.findings);
    assert!(d.findings[0].what.contains("0.32.0") && d.findings[0].source.contains("vllm-project/vllm#45764"));
    // A Llama speculators drafter there: clean (32 requests × 4 tokens = 128 captured).
    let llama = Drafter { mla: false, model_type: Some("llama".into()), ..speculators.clone() };
    let d = run(server(good), Some(llama.clone()));
    assert!(d.findings.is_empty(), "{:#?}", d.findings);
    // The SGLang export served by vLLM: ids read one layer early.
    let d = run(server(good), Some(drafter("/d", false, "llama", &[1, 29, 57])));
    assert_eq!(rules_of(&d, Severity::Warning), [rules::AUX_CONVENTION]);
    assert!(d.findings[0].fix.contains("[2, 30, 58]"));
    // 64 requests × 4 tokens exceed the 128 captured; eager mode; method eagle.
    let d = run(server(&good.replace("--max-num-seqs 32", "--max-num-seqs 64")), Some(llama.clone()));
    assert_eq!(rules_of(&d, Severity::Warning), [rules::VERIFY_CUDA_GRAPH]);
    assert!(d.findings[0].what.contains("128 tokens") && d.findings[0].what.contains("needs 256"));
    let d = run(server(&format!("{good} --enforce-eager")), Some(llama.clone()));
    assert_eq!(rules_of(&d, Severity::Warning), [rules::VERIFY_CUDA_GRAPH]);
    let d = run(server(&good.replace("eagle3", "eagle")), Some(llama));
    assert_eq!(rules_of(&d, Severity::Error), [rules::EAGLE_NOT_EAGLE3]);
}

#[test]
fn what_could_not_be_read_is_said_never_passed() {
    // A server that tells nothing: every rule that needs a value says which.
    let d = run(sglang_from(serde_json::json!({}), "llama.model_info.json"), None);
    assert!(d.findings.is_empty());
    let unchecked: Vec<&str> = d.not_checked.iter().map(|n| n.rule).collect();
    for rule in [
        rules::EAGLE_NOT_EAGLE3,
        rules::DRAFT_ATTENTION_BACKEND,
        rules::DRAFT_QUANTIZATION,
        rules::AUX_CONVENTION,
        rules::VERIFY_CUDA_GRAPH,
    ] {
        assert!(unchecked.contains(&rule), "{rule} missing from {unchecked:?}");
    }
    assert!(d.server.unread.iter().any(|u| u.what.contains("speculative_algorithm")), "{:#?}", d.server.unread);
    // Without the drafter, the drafter rules say they need it.
    let d = run(sglang_server("sglang-gpu-eagle3.server_info.json", "llama.model_info.json"), None);
    let aux = d.not_checked.iter().find(|n| n.rule == rules::AUX_CONVENTION).expect("aux rule not checked");
    assert!(aux.why.contains("--drafter"), "{}", aux.why);
    // The JSON report carries all of it.
    let json = serde_json::to_value(&d).unwrap();
    assert!(json["not_checked"].as_array().unwrap().len() >= 2 && json["server"]["engine"] == "sglang");
}
