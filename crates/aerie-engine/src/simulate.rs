//! Acceptance fixed by the engine: the verify cycle measured at a chosen τ with any drafter, the
//! drafter's quality taken out (issue 46 §1). SGLang has the switch; vLLM has none.

/// SGLang's environment for simulated acceptance (`srt/speculative/spec_utils.py`, read once at
/// import): every verify pass reports an accept length drawn around `len` (`match-expected`: the
/// floor or the ceiling, weighted so the mean is `len`), whatever the drafter drafted; so the
/// cycle is measured at a chosen τ with any drafter. SGLang only; vLLM has no such switch.
pub fn sglang_simulated_acceptance(len: f64) -> Vec<(String, String)> {
    vec![
        ("SGLANG_SIMULATE_ACC_LEN".into(), len.to_string()),
        ("SGLANG_SIMULATE_ACC_METHOD".into(), "match-expected".into()),
    ]
}
