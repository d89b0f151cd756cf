//! The learning-rate schedule of the reference recipe (eagle3.md §3): linear warm-up over
//! `ceil(warmup_ratio · total)` steps, then cosine decay to 0 at the end of the run. A pure
//! function of the step, so a resumed run continues it exactly.

/// Learning rate for optimizer step `step` (0-based: the update that makes it `step + 1` steps).
///
/// Warm-up rises as `peak · (step + 1) / W` (the first update is not wasted at lr 0, unlike HF's
/// `get_cosine_schedule_with_warmup`), then `peak · ½(1 + cos(π · (step - W) / (total - W)))`.
pub fn lr_at(step: u64, total: u64, peak: f64, warmup_ratio: f64) -> f64 {
    let total = total.max(1);
    let warmup = ((warmup_ratio * total as f64).ceil() as u64).min(total);
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = (total - warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).min(1.0);
    peak * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_zero() {
        let (total, peak) = (200, 1e-4);
        // 1.5% of 200 = 3 warm-up steps.
        assert!((lr_at(0, total, peak, 0.015) - peak / 3.0).abs() < 1e-15);
        assert!((lr_at(2, total, peak, 0.015) - peak).abs() < 1e-15);
        assert!((lr_at(3, total, peak, 0.015) - peak).abs() < 1e-15);
        let mid = lr_at(3 + 197 / 2, total, peak, 0.015);
        assert!((mid - peak / 2.0).abs() < peak * 0.02, "{mid}");
        assert!(lr_at(199, total, peak, 0.015) < peak * 1e-3);
        let mut prev = f64::INFINITY;
        for s in 3..200 {
            let lr = lr_at(s, total, peak, 0.015);
            assert!(lr <= prev);
            prev = lr;
        }
        // No warm-up at all.
        assert_eq!(lr_at(0, 10, 1.0, 0.0), 1.0);
    }
}
