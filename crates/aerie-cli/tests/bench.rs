//! `aerie bench ttt`: one tiny step per precision, checking the JSON report a script reads.

mod common;
use common::{aerie, ok_json};

#[test]
fn bench_ttt_reports_each_precision() {
    let mut tokens_per_s = Vec::new();
    for precision in ["f32", "bf16"] {
        let args = [
            "bench",
            "ttt",
            "--seq-len",
            "16",
            "--ttt-length",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--precision",
            precision,
            "--json",
        ];
        let rep = ok_json(aerie(&args));
        assert_eq!(rep["precision"], precision);
        assert_eq!(rep["shape"], "smollm2-135m");
        assert_eq!((rep["seq_len"].as_u64(), rep["ttt_length"].as_u64()), (Some(16), Some(2)));
        assert_eq!(rep["backward"], true);
        assert_eq!(rep["step_seconds"].as_array().map(Vec::len), Some(1));
        // fwd+bwd = 3 × the forward's matmul FLOPs, whatever the dtype.
        assert!(rep["flops_per_token"].as_f64().unwrap() > 3.0 * 2.0 * 135e6 * 0.1);
        tokens_per_s.push(rep["tokens_per_second"].as_f64().unwrap());
    }
    assert!(tokens_per_s.iter().all(|t| t.is_finite() && *t > 0.0), "{tokens_per_s:?}");
}
