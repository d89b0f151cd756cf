//! aerie's one pseudo-random generator, splitmix64 (Steele, Lea, Flood 2014): fresh drafter
//! weights, synthetic checkpoints, the training data order and sampled drafting all draw from it.
//! It is tiny, portable and fully determined by one `u64` of state, which is all a bit-identical
//! resume or a reproducible sampled decode needs. Each way of turning the 64 bits into a number
//! is a method of its own, because the streams already written (checkpoints, data orders) depend
//! on exactly that conversion.

/// splitmix64; the state is public so a run can store and restore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits (inverse-CDF sampling, acceptance tests).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in (0, 1), never 0: the 53-bit grid shifted by half a step, so `ln` is finite.
    pub fn open_uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Normal N(0, std²) by Box–Muller (one cosine branch), as fresh weights are drawn.
    pub fn normal(&mut self, std: f64) -> f32 {
        let (u, v) = (self.open_uniform(), self.open_uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos() * std) as f32
    }

    /// Uniform in [-1, 1) with 24 random bits, for small synthetic weights.
    pub fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform in `0..n` (n > 0), by rejection-free multiply-shift (bias < n / 2^64).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix;

    #[test]
    fn splitmix64_reference_values() {
        // The first outputs of splitmix64 seeded 0 (the reference C implementation's stream).
        let mut r = SplitMix(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn conversions_stay_in_range() {
        let mut r = SplitMix(42);
        for _ in 0..1000 {
            let u = r.uniform();
            assert!((0.0..1.0).contains(&u));
            let o = r.open_uniform();
            assert!(o > 0.0 && o < 1.0);
            let s = r.signed_unit();
            assert!((-1.0..1.0).contains(&s));
            assert!(r.below(7) < 7);
        }
    }
}
