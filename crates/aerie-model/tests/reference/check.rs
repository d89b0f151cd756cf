//! Comparisons the reference's checks share: closeness in f64 relative to the magnitudes, and
//! the TTT sums field by field.

#![allow(clippy::needless_range_loop)]

use aerie_model::DrafterConfig;
use aerie_model::checkpoint::TensorMap;

use super::*;

/// `a` and `b` within `tol` relative to the larger magnitude (absolute near zero).
pub fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

pub fn assert_close(a: f64, b: f64, tol: f64, what: &str) {
    assert!(close(a, b, tol), "{what}: {a} vs {b} (tol {tol})");
}

pub fn assert_vec_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for i in 0..a.len() {
        assert!(close(a[i], b[i], tol), "{what}[{i}]: {} vs {} (tol {tol})", a[i], b[i]);
    }
}

pub fn assert_ttt_close(a: &RefTtt, b: &RefTtt, tol: f64, what: &str) {
    assert_vec_close(&a.ce_sum, &b.ce_sum, tol, &format!("{what} ce_sum"));
    assert_vec_close(&a.correct, &b.correct, tol, &format!("{what} correct"));
    assert_vec_close(&a.m_count, &b.m_count, tol, &format!("{what} m_count"));
    assert_vec_close(&a.pm_count, &b.pm_count, tol, &format!("{what} pm_count"));
    assert_vec_close(&a.alpha_sum, &b.alpha_sum, tol, &format!("{what} alpha_sum"));
    for k in 0..a.logits_per_step.len() {
        for t in 0..a.logits_per_step[k].len() {
            assert_vec_close(
                &a.logits_per_step[k][t],
                &b.logits_per_step[k][t],
                tol,
                &format!("{what} logits[{k}][{t}]"),
            );
            assert_vec_close(
                &a.hidden_per_step[k][t],
                &b.hidden_per_step[k][t],
                tol,
                &format!("{what} hidden[{k}][{t}]"),
            );
        }
    }
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub fn rand_vec(rng: &mut SplitMix64, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.centered(1.0)).collect()
}

pub fn run(cfg: &DrafterConfig, w: &TensorMap, s: &RefSequence, k: usize) -> RefTtt {
    ref_ttt(cfg, w, &s.ids, &s.loss_mask, &s.aux, &s.teacher_logits, k)
}

pub fn mat_of(w: &TensorMap, key: &str) -> (Vec<usize>, Vec<f32>) {
    let t = &w[key];
    (t.shape.clone(), t.to_f32(key).unwrap())
}
