//! The cost surface (issue 46 §1): speculation's price is not one number. A verify cycle and a
//! plain decode step both change with the batch the engine runs (concurrency) and the length of
//! the context it attends over, and the drafter's k changes the verify pass; so the break-even τ
//! (cycle / T_d, eagle3.md §7) is a surface over k × concurrency × context, and the one measured
//! point a user starts from (a 29 ms cycle at 2 steps, batch 1, against a 12.1 ms step) is one
//! cell of it.
//!
//! A costs file stores the surface as points, one per (concurrency, context): T_d measured
//! without speculation there, and per k the measured cycle, τ and speedup where a drafter ran
//! ([`SurfacePoint`]); flattened, each (k, concurrency, context) is a [`SurfaceCell`] with its
//! break-even τ derived. A point measured with the engine's acceptance fixed (SGLang's
//! `SGLANG_SIMULATE_ACC_LEN`) says so (`simulated_accept_length`): its cycle is the engine's cost
//! at that τ, apart from any drafter's quality.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The prompt length a point was measured at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Context {
    /// The prompts as the prompt file gives them (MT-Bench: tens of tokens).
    #[default]
    Short,
    /// Each prompt behind a long passage ([`crate::prompts::long_context`]): the decode and
    /// verify passes attend over thousands of tokens.
    Long,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Context::Short => "short",
            Context::Long => "long",
        })
    }
}

impl FromStr for Context {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "short" => Ok(Context::Short),
            "long" => Ok(Context::Long),
            other => Err(format!("context `{other}`: give short or long")),
        }
    }
}

/// One (concurrency, context) of the surface, as a costs file stores it (`[[surface]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurfacePoint {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Prompt length.
    pub context: Context,
    /// The accept length the engine was told to simulate (SGLang's `SGLANG_SIMULATE_ACC_LEN`)
    /// while the cycles were measured; absent when the drafter's own acceptance ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_accept_length: Option<f64>,
    /// T_d here, ms: the plain decode step.
    pub t_d_ms: f64,
    /// Measured cycle of a k-draft chain here, `{k = ms}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cycle_ms: BTreeMap<String, f64>,
    /// Measured τ at k, `{k = τ}` (bonus token counted).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tau: BTreeMap<String, f64>,
    /// Measured speedup at k (speculative decode rate over the plain one), `{k = S}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub speedup: BTreeMap<String, f64>,
}

/// One (k, concurrency, context) of the surface, flattened for reports and pictures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SurfaceCell {
    /// Draft steps.
    pub k: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Prompt length.
    pub context: Context,
    /// The simulated accept length, where the engine fixed acceptance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_accept_length: Option<f64>,
    /// T_d, ms (measured).
    pub t_d_ms: f64,
    /// One draft+verify cycle, ms (measured).
    pub cycle_ms: f64,
    /// cycle / T_d (derived): the τ at which this cell pays.
    pub break_even_tau: f64,
    /// τ measured here, where a drafter ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau: Option<f64>,
    /// Speedup measured here, where a drafter ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<f64>,
}

impl SurfacePoint {
    /// A point with T_d alone (a plain run); cycles are added per k.
    pub fn plain(concurrency: usize, context: Context, t_d_ms: f64) -> Self {
        Self {
            concurrency,
            context,
            simulated_accept_length: None,
            t_d_ms,
            cycle_ms: BTreeMap::new(),
            tau: BTreeMap::new(),
            speedup: BTreeMap::new(),
        }
    }

    /// Whether this point is the one at (`concurrency`, `context`) with the same simulation.
    pub fn same_place(&self, concurrency: usize, context: Context, simulated: Option<f64>) -> bool {
        self.concurrency == concurrency && self.context == context && self.simulated_accept_length == simulated
    }

    /// Record k's measured cycle, τ and speedup (the ones given).
    pub fn add(&mut self, k: usize, cycle_ms: f64, tau: Option<f64>, speedup: Option<f64>) {
        self.cycle_ms.insert(k.to_string(), cycle_ms);
        if let Some(t) = tau {
            self.tau.insert(k.to_string(), t);
        }
        if let Some(s) = speedup {
            self.speedup.insert(k.to_string(), s);
        }
    }

    /// Its cells, one per k with a measured cycle, in k order.
    pub fn cells(&self) -> Vec<SurfaceCell> {
        let mut out: Vec<SurfaceCell> = self
            .cycle_ms
            .iter()
            .filter_map(|(k, &cycle)| {
                let n: usize = k.trim().parse().ok()?;
                Some(SurfaceCell {
                    k: n,
                    concurrency: self.concurrency,
                    context: self.context,
                    simulated_accept_length: self.simulated_accept_length,
                    t_d_ms: self.t_d_ms,
                    cycle_ms: cycle,
                    break_even_tau: cycle / self.t_d_ms,
                    tau: self.tau.get(k).copied(),
                    speedup: self.speedup.get(k).copied(),
                })
            })
            .collect();
        out.sort_by_key(|c| c.k);
        out
    }

    /// Check every number; `at` names the point in the message.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        if self.concurrency == 0 {
            return Err(format!("{at}: concurrency must be at least 1"));
        }
        if !(self.t_d_ms > 0.0 && self.t_d_ms.is_finite()) {
            return Err(format!("{at}: t_d_ms = {}: must be a positive number of ms", self.t_d_ms));
        }
        if let Some(s) = self.simulated_accept_length
            && !(s >= 1.0 && s.is_finite())
        {
            return Err(format!("{at}: simulated_accept_length = {s}: an accept length is at least 1"));
        }
        let check = |map: &BTreeMap<String, f64>, what: &str, ok: &dyn Fn(f64) -> bool, rule: &str| {
            for (k, &v) in map {
                if !k.trim().parse::<usize>().is_ok_and(|n| n >= 1) {
                    return Err(format!("{at}: {what}: key `{k}` is not a draft length k >= 1"));
                }
                if !(v.is_finite() && ok(v)) {
                    return Err(format!("{at}: {what}.{k} = {v}: {rule}"));
                }
            }
            Ok(())
        };
        check(&self.cycle_ms, "cycle_ms", &|v| v > 0.0, "must be a positive number of ms")?;
        check(&self.tau, "tau", &|v| v >= 1.0, "τ counts the bonus token: at least 1")?;
        check(&self.speedup, "speedup", &|v| v > 0.0, "must be positive")?;
        if let Some(k) = self.tau.keys().chain(self.speedup.keys()).find(|k| !self.cycle_ms.contains_key(*k)) {
            return Err(format!("{at}: k = {k} has a τ or speedup but no cycle_ms"));
        }
        Ok(())
    }
}

/// Check a whole surface: each point, and no two at the same place.
pub fn validate(points: &[SurfacePoint]) -> Result<(), String> {
    for (i, p) in points.iter().enumerate() {
        let at = format!("surface[{i}] (concurrency {}, context {})", p.concurrency, p.context);
        p.validate(&at)?;
        if points[..i].iter().any(|q| q.same_place(p.concurrency, p.context, p.simulated_accept_length)) {
            return Err(format!("{at}: a second point at the same concurrency and context"));
        }
    }
    Ok(())
}

/// Every cell of `points`, ordered by context, concurrency, k.
pub fn cells(points: &[SurfacePoint]) -> Vec<SurfaceCell> {
    let mut out: Vec<SurfaceCell> = points.iter().flat_map(SurfacePoint::cells).collect();
    out.sort_by_key(|c| (c.context, c.concurrency, c.k));
    out
}

/// The point `project` reads by default, today's single measurement: concurrency 1, short
/// context, the drafter's own acceptance; else the first point.
pub fn primary(points: &[SurfacePoint]) -> Option<&SurfacePoint> {
    points.iter().find(|p| p.same_place(1, Context::Short, None)).or_else(|| points.first())
}

/// The point at (`concurrency`, `context`): the drafter's own acceptance first, else a
/// simulated one; `Err` lists the places the surface has.
pub fn at(points: &[SurfacePoint], concurrency: usize, context: Context) -> Result<&SurfacePoint, String> {
    points
        .iter()
        .find(|p| p.same_place(concurrency, context, None))
        .or_else(|| points.iter().find(|p| p.concurrency == concurrency && p.context == context))
        .ok_or_else(|| {
            let have: Vec<String> = points.iter().map(|p| format!("{} {}", p.concurrency, p.context)).collect();
            format!(
                "no surface point at concurrency {concurrency}, context {context}; the file has: {}",
                if have.is_empty() {
                    "none (measure with --concurrency/--context lists)".into()
                } else {
                    have.join(", ")
                }
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(c: usize, ctx: Context, t_d: f64) -> SurfacePoint {
        SurfacePoint::plain(c, ctx, t_d)
    }

    #[test]
    fn cells_derive_the_break_even_of_each_k() {
        // The node at batch 1: 29 ms at k = 2 against 12.1 ms; a shorter, cheaper k = 1.
        let mut p = point(1, Context::Short, 12.1);
        p.add(2, 29.0, Some(2.0), Some(0.83));
        p.add(1, 20.0, None, None);
        let c = p.cells();
        assert_eq!(c.iter().map(|c| c.k).collect::<Vec<_>>(), [1, 2]);
        assert!((c[1].break_even_tau - 29.0 / 12.1).abs() < 1e-12);
        assert_eq!((c[1].tau, c[1].speedup, c[0].tau), (Some(2.0), Some(0.83), None));
        assert!(validate(&[p.clone()]).is_ok());
        // Batch 16: the step grows less than the cycle's share of it; the cell stands apart.
        let mut q = point(16, Context::Short, 20.0);
        q.add(2, 30.0, None, None);
        let all = cells(&[q.clone(), p.clone()]);
        assert_eq!(all.iter().map(|c| (c.concurrency, c.k)).collect::<Vec<_>>(), [(1, 1), (1, 2), (16, 2)]);
        assert!((all[2].break_even_tau - 1.5).abs() < 1e-12);
        let both = [q, p];
        assert_eq!(primary(&both).unwrap().concurrency, 1);
        assert_eq!(at(&both, 16, Context::Short).unwrap().t_d_ms, 20.0);
        let e = at(&both, 64, Context::Long).unwrap_err();
        assert!(e.contains("concurrency 64, context long") && e.contains("16 short"), "{e}");
    }

    #[test]
    fn bad_points_are_named() {
        let mut p = point(1, Context::Short, 12.1);
        p.tau.insert("2".into(), 1.5);
        assert!(validate(&[p.clone()]).unwrap_err().contains("no cycle_ms"));
        p.cycle_ms.insert("2".into(), 0.0);
        assert!(validate(&[p.clone()]).unwrap_err().contains("cycle_ms.2 = 0"));
        p.cycle_ms.insert("2".into(), 9.0);
        p.tau.insert("2".into(), 0.5);
        assert!(validate(&[p.clone()]).unwrap_err().contains("at least 1"));
        let p = point(1, Context::Short, 12.1);
        let e = validate(&[p.clone(), p.clone()]).unwrap_err();
        assert!(e.contains("surface[1]") && e.contains("same concurrency"), "{e}");
        let mut sim = p.clone();
        sim.simulated_accept_length = Some(1.0);
        assert!(validate(&[p, sim]).is_ok(), "a simulated point stands beside the drafter's own");
    }
}
