//! The clock of a decoding run: wall time of every kind of forward (plain steps T_d, verify
//! passes T_v(n), drafter forwards T_s, whole cycles), and the costs file `aerie project` reads,
//! made from them.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::cost::{Costs, Provenance, VerifyCost};
use aerie_model::drafter::shape::DraftShape;

/// Wall time of one kind of forward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timer {
    /// Calls timed.
    pub calls: u64,
    /// Seconds in total.
    pub seconds: f64,
}

impl Timer {
    pub(super) fn add(&mut self, since: Instant) {
        self.calls += 1;
        self.seconds += since.elapsed().as_secs_f64();
    }

    fn merge(&mut self, o: &Timer) {
        self.calls += o.calls;
        self.seconds += o.seconds;
    }

    /// Mean milliseconds per call (`None` before any call).
    pub fn mean_ms(&self) -> Option<f64> {
        (self.calls > 0).then(|| 1e3 * self.seconds / self.calls as f64)
    }
}

/// Every timed forward of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DecodeTimings {
    /// Plain decoding: prompt prefills.
    pub plain_prefill: Timer,
    /// Plain decoding: one-token target forwards (T_d).
    pub plain_step: Timer,
    /// Speculative decoding: prompt prefills (target prefill + drafter extend over the prompt).
    pub spec_prefill: Timer,
    /// Drafter extends over accepted positions, one per cycle.
    pub extend: Timer,
    /// Drafter steps (R branches at once for a tree).
    pub draft_step: Timer,
    /// Target verify passes by verified tokens n (T_v(n)).
    pub verify: BTreeMap<usize, Timer>,
    /// Whole cycles: draft, verify, accept, cache updates (the drafter's next extend included).
    pub cycle: Timer,
}

impl DecodeTimings {
    /// Accumulate another run's timings.
    pub fn merge(&mut self, o: &DecodeTimings) {
        self.plain_prefill.merge(&o.plain_prefill);
        self.plain_step.merge(&o.plain_step);
        self.spec_prefill.merge(&o.spec_prefill);
        self.extend.merge(&o.extend);
        self.draft_step.merge(&o.draft_step);
        for (n, t) in &o.verify {
            self.verify.entry(*n).or_default().merge(t);
        }
        self.cycle.merge(&o.cycle);
    }

    /// T_s: mean drafter forward (extends and steps together: a k-draft cycle runs one extend
    /// and k − 1 steps, so k·T_s is its drafting time).
    pub fn t_s_ms(&self) -> Option<f64> {
        let calls = self.extend.calls + self.draft_step.calls;
        (calls > 0).then(|| 1e3 * (self.extend.seconds + self.draft_step.seconds) / calls as f64)
    }

    /// The measured costs as a costs file: T_d, T_s, the T_v(n) table and the per-cycle overhead
    /// (mean cycle − depth·T_s − mean T_v, what the formula does not otherwise see: host-side
    /// acceptance, cache bookkeeping). `None` when plain or speculative decoding did not run.
    pub fn costs(&self, name: &str, shape: &DraftShape, measured_where: &str, when: &str) -> Option<Costs> {
        let t_d = self.plain_step.mean_ms()?;
        let t_s = self.t_s_ms()?;
        let cycle = self.cycle.mean_ms()?;
        let verify_total: Timer = self.verify.values().fold(Timer::default(), |mut a, t| {
            a.merge(t);
            a
        });
        let t_v_mean = verify_total.mean_ms()?;
        let overhead = (cycle - shape.depth() as f64 * t_s - t_v_mean).max(0.0);
        let table = self.verify.iter().filter_map(|(n, t)| Some((n.to_string(), t.mean_ms()?))).collect();
        Some(Costs {
            name: name.to_owned(),
            t_d_ms: t_d,
            t_s_ms: Some(t_s),
            overhead_ms: overhead,
            t_v: Some(VerifyCost { a_ms: None, b_ms: None, table }),
            cycle_ms: BTreeMap::new(),
            provenance: Provenance {
                measured_where: measured_where.to_owned(),
                when: when.to_owned(),
                by: "aerie eval decode".into(),
                measured: vec!["t_d_ms".into(), "t_s_ms".into(), "t_v.table".into()],
                derived: vec!["overhead_ms (= the mean measured cycle − depth·t_s − t_v)".into()],
                assumed: Vec::new(),
                notes: format!(
                    "means over {} plain decode steps, {} drafter forwards, {} verify passes, {} cycles ({}, depth {}); overhead = cycle - depth*t_s - t_v",
                    self.plain_step.calls,
                    self.extend.calls + self.draft_step.calls,
                    verify_total.calls,
                    self.cycle.calls,
                    match shape {
                        DraftShape::Chain { .. } => "chain",
                        DraftShape::Tree { .. } => "tree",
                    },
                    shape.depth()
                ),
            },
            surface: Vec::new(),
        })
    }
}
