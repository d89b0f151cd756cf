//! The sampler of regenerated answers: seeded temperature / top-p sampling whose random stream
//! depends only on (seed, record position, turn), so a resumed run draws exactly what an
//! uninterrupted one draws.

use aerie_model::rng::SplitMix;
use serde::Serialize;

use crate::{Error, Result};

/// How answers are drawn: greedy at temperature 0, else seeded temperature / top-p sampling.
/// One value serves the options, each turn's job and the report (flattened there, so the
/// report's `temperature`, `top_p` and `seed` keys stay where they were).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sampling {
    /// 0 = greedy; otherwise softmax temperature.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 = no nucleus cut. Ignored when greedy.
    pub top_p: f32,
    /// The run's `--seed`; with the record position and turn it seeds the turn's stream
    /// ([`Rng::for_turn`]; servers get [`turn_seed`]).
    pub seed: u64,
}

impl Default for Sampling {
    /// Greedy.
    fn default() -> Self {
        Self { temperature: 0.0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// Whether every token is the argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The settings the output depends on: a greedy run ignores top-p and the seed, so they
    /// read as 1 and 0 (a resumed greedy run may name other values and still match).
    pub(super) fn effective(self) -> Self {
        if self.is_greedy() { Self { top_p: 1.0, seed: 0, ..self } } else { self }
    }

    pub(super) fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::Invalid(format!("temperature {} must be a finite number >= 0", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Invalid(format!("top-p {} must be in (0, 1]", self.top_p)));
        }
        Ok(())
    }
}

/// The sampling stream of one (seed, record, turn): aerie's splitmix64, seeded from the three.
pub(super) struct Rng(SplitMix);

impl Rng {
    pub(super) fn for_turn(seed: u64, source_index: u64, turn: u64) -> Self {
        Rng(SplitMix(stream_state(seed, source_index, turn)))
    }
}

/// The splitmix64 state of the (seed, record, turn) stream.
fn stream_state(seed: u64, source_index: u64, turn: u64) -> u64 {
    let a = SplitMix(seed).next_u64() ^ source_index.wrapping_mul(0xD1B5_4A32_D192_ED03);
    SplitMix(a).next_u64() ^ turn.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7)
}

/// The seed a serving engine gets for one (seed, record, turn): the stream's first draw, cut to
/// 31 bits because servers parse seeds as (signed) 32-bit integers (llama.cpp's `seed` is a
/// uint32, SGLang's `sampling_seed` an int64 hashed on the GPU). A resumed run sends the same.
pub(super) fn turn_seed(seed: u64, source_index: u64, turn: u64) -> u64 {
    SplitMix(stream_state(seed, source_index, turn)).next_u64() & 0x7fff_ffff
}

/// Draw a token from `logits` at `temperature` with nucleus `top_p`, in f64 on the host.
/// Deterministic for a given stream: ties in the nucleus sort go to the lower id.
pub(super) fn sample(logits: &[f32], temperature: f32, top_p: f32, rng: &mut Rng) -> u32 {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = temperature as f64;
    let weight = |l: f32| if l.is_nan() { 0.0 } else { ((l as f64 - max) / t).exp() };
    let mut cand: Vec<(f64, u32)> = logits.iter().enumerate().map(|(i, &l)| (weight(l), i as u32)).collect();
    if top_p < 1.0 {
        cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let total: f64 = cand.iter().map(|c| c.0).sum();
        let mut cum = 0.0;
        let mut keep = cand.len();
        for (i, c) in cand.iter().enumerate() {
            cum += c.0;
            if cum >= top_p as f64 * total {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    let total: f64 = cand.iter().map(|c| c.0).sum();
    let u = rng.0.uniform() * total;
    let mut cum = 0.0;
    for &(w, id) in &cand {
        cum += w;
        if u < cum {
            return id;
        }
    }
    cand.iter().rev().find(|c| c.0 > 0.0).map_or(cand[0].1, |c| c.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_deterministic_and_respects_top_p() {
        let logits = [0.0f32, 1.0, 2.0, 3.0, -1.0];
        let draw = |seed, idx, turn, top_p| {
            let mut r = Rng::for_turn(seed, idx, turn);
            (0..50).map(|_| sample(&logits, 1.0, top_p, &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 3, 1, 1.0), draw(7, 3, 1, 1.0));
        assert_ne!(draw(7, 3, 1, 1.0), draw(7, 4, 1, 1.0));
        assert_ne!(draw(7, 3, 1, 1.0), draw(7, 3, 2, 1.0));
        // Nucleus 0.5: token 3 alone holds e^3 / Σ ≈ 0.64 of the mass.
        assert!(draw(1, 0, 0, 0.5).iter().all(|&t| t == 3));
        // Nucleus 0.9 keeps tokens 3 and 2 (0.64 + 0.24) and then 1.
        assert!(draw(1, 0, 0, 0.9).iter().all(|&t| (1..=3).contains(&t)));
        // A low temperature is nearly greedy.
        let mut r = Rng::for_turn(0, 0, 0);
        assert!((0..50).all(|_| sample(&logits, 0.01, 1.0, &mut r) == 3));
    }

    #[test]
    fn sampling_settings_outside_their_range_are_refused() {
        let ok = |temperature, top_p| Sampling { temperature, top_p, seed: 0 }.validate().is_ok();
        assert!(Sampling::default().is_greedy() && ok(0.0, 1.0));
        assert!(ok(0.7, 0.9) && ok(2.0, 1e-3));
        assert!(!ok(-0.1, 1.0) && !ok(f32::NAN, 1.0) && !ok(f32::INFINITY, 1.0));
        assert!(!ok(0.7, 0.0) && !ok(0.7, 1.5) && !ok(0.7, f32::NAN));
        let err = Sampling { temperature: 0.5, top_p: 0.0, seed: 0 }.validate().unwrap_err().to_string();
        assert!(err.contains("top-p 0"), "{err}");
    }
}
