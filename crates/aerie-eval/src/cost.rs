//! The cost model of speculative decoding (eagle3.md §7) and `aerie project`: from an acceptance
//! curve τ(k) and measured step costs, the projected throughput of every k, its break-even τ, the
//! best k, and how expensive verification may get before the drafter stops paying.
//!
//! Costs live in TOML files (`configs/costs/*.toml`), milliseconds throughout:
//! ```toml
//! name = "my-node"
//! t_d_ms = 12.1          # T_d: one plain decode step of the target
//! t_s_ms = 1.0           # T_s: one draft step
//! overhead_ms = 0.0      # per-cycle overhead outside draft and verify
//! [t_v]                  # T_v(n): one verify pass over n tokens, either a + b·n ...
//! a_ms = 26.1
//! b_ms = 0.3
//! # table = { 3 = 27.0, 4 = 27.3 }   # ... or a table {n = ms} (linear between entries)
//! [cycle_ms]             # measured whole cycles of a k-draft chain; they override the formula
//! 2 = 29.0
//! [[surface]]          # optional: the cost surface (crate::surface), one point per place
//! concurrency = 16
//! context = "short"
//! t_d_ms = 14.0
//! cycle_ms = { 2 = 31.0 }
//! [provenance]
//! measured_where = "8x RTX PRO 6000, TP8, SGLang"
//! when = "2026-11"
//! by = "who measured"
//! measured = ["t_d_ms", "cycle_ms.2"]
//! assumed = ["t_s_ms", "t_v", "overhead_ms"]
//! ```
//! cycle(k) = k·T_s + T_v(k+1) + overhead, S(k) = τ(k)·T_d / cycle(k), break-even τ = cycle / T_d.
//!
//! The top-level T_d and cycles are one place of the surface, concurrency 1 and short prompts
//! where measured ([`crate::surface::primary`]): files without `[[surface]]` load as before, and
//! `project` reads the top level unless asked for a place ([`Costs::at`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::accept::CurvePoint;
use crate::surface::{self, Context, SurfacePoint};
use crate::{Error, Result};
/// Today's UTC date, `YYYY-MM-DD`: the `when` of a costs file's provenance (the calendar is
/// aerie-data's, which chat templates' `strftime_now` also reads).
pub use aerie_data::template::clock::today;

/// T_v(n), the cost of one verify pass over n tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyCost {
    /// Intercept a of `a + b·n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_ms: Option<f64>,
    /// Slope b of `a + b·n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_ms: Option<f64>,
    /// Measured `{n = ms}`; linear interpolation between entries, no extrapolation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub table: BTreeMap<String, f64>,
}

/// Where and when the numbers were measured, by whom, and which were assumed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Machine, engine and settings.
    pub measured_where: String,
    /// Date.
    pub when: String,
    /// Person or tool.
    pub by: String,
    /// Keys that hold measurements.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<String>,
    /// Keys derived from measured ones, each with how (`t_v.table.1 (= t_d_ms ...)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub derived: Vec<String>,
    /// Keys that hold assumptions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assumed: Vec<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
}

/// A costs file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Costs {
    /// Short name of the setup.
    #[serde(default)]
    pub name: String,
    /// T_d, ms.
    pub t_d_ms: f64,
    /// T_s, ms (needed unless every k has a measured cycle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_s_ms: Option<f64>,
    /// Overhead per cycle, ms.
    #[serde(default)]
    pub overhead_ms: f64,
    /// T_v(n).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_v: Option<VerifyCost>,
    /// Measured cycles of a k-draft chain, `{k = ms}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cycle_ms: BTreeMap<String, f64>,
    /// Provenance.
    pub provenance: Provenance,
    /// The cost surface: T_d and the cycles at each (concurrency, context) measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surface: Vec<SurfacePoint>,
}

fn int_keys(map: &BTreeMap<String, f64>, what: &str) -> std::result::Result<Vec<(usize, f64)>, String> {
    let mut out = Vec::with_capacity(map.len());
    for (k, &v) in map {
        let n: usize = k.trim().parse().map_err(|_| format!("{what}: key `{k}` is not a whole number"))?;
        if !(v > 0.0 && v.is_finite()) {
            return Err(format!("{what}.{k} = {v}: a cost must be a positive number of ms"));
        }
        out.push((n, v));
    }
    out.sort_by_key(|&(n, _)| n);
    Ok(out)
}

impl Costs {
    /// Parse and validate TOML text (`path` names it in errors).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self> {
        let err = |message: String| Error::Input { path: path.to_path_buf(), message };
        let costs: Costs = toml::from_str(text).map_err(|e| err(format!("not a costs file: {e}")))?;
        costs.validate().map_err(err)?;
        Ok(costs)
    }

    /// Read a costs file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Self::from_toml(&text, path)
    }

    /// TOML text of this file; a file that does not validate (a NaN, a missing cost) is an
    /// error, never written.
    pub fn to_toml(&self) -> Result<String> {
        self.validate().map_err(|m| Error::Report(format!("refusing to write an invalid costs file: {m}")))?;
        toml::to_string_pretty(self).map_err(|e| Error::Report(format!("cannot write costs TOML: {e}")))
    }

    /// Check every number and the T_v form.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let pos = |v: f64, what: &str| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(format!("{what} = {v}: must be a positive number of ms"))
            }
        };
        pos(self.t_d_ms, "t_d_ms")?;
        if let Some(ts) = self.t_s_ms
            && !(ts >= 0.0 && ts.is_finite())
        {
            return Err(format!("t_s_ms = {ts}: must be >= 0"));
        }
        if !(self.overhead_ms >= 0.0 && self.overhead_ms.is_finite()) {
            return Err(format!("overhead_ms = {}: must be >= 0", self.overhead_ms));
        }
        if let Some(tv) = &self.t_v {
            let linear = tv.a_ms.is_some() || tv.b_ms.is_some();
            match (linear, tv.table.is_empty()) {
                (true, false) => return Err("t_v: give either a_ms + b_ms or a table, not both".into()),
                (false, true) => return Err("t_v: give a_ms and b_ms, or a table {n = ms}".into()),
                (true, true) if tv.a_ms.is_none() || tv.b_ms.is_none() => {
                    return Err("t_v: a linear verify cost needs both a_ms and b_ms".into());
                }
                _ => {}
            }
            int_keys(&tv.table, "t_v.table")?;
        }
        int_keys(&self.cycle_ms, "cycle_ms")?;
        if self.t_v.is_none() && self.cycle_ms.is_empty() {
            return Err("no verify cost: give [t_v] or measured [cycle_ms]".into());
        }
        surface::validate(&self.surface)?;
        if self.provenance.measured_where.trim().is_empty()
            || self.provenance.when.trim().is_empty()
            || self.provenance.by.trim().is_empty()
        {
            return Err("provenance: measured_where, when and by are required".into());
        }
        Ok(())
    }

    /// A costs file measured as a surface: the top level is its primary point (concurrency 1,
    /// short prompts, where measured), T_v(1) = T_d derived, so `project` without a place reads
    /// what it read before surfaces.
    pub fn from_surface(name: String, points: Vec<SurfacePoint>, mut provenance: Provenance) -> Result<Self> {
        let p = surface::primary(&points)
            .ok_or_else(|| Error::Report("no point measured: the surface is empty".into()))?
            .clone();
        provenance.derived.push(format!(
            "t_d_ms and cycle_ms (= the surface point at concurrency {}, context {})",
            p.concurrency, p.context
        ));
        provenance.derived.push("t_v.table.1 (= t_d_ms: a verify pass over one token is a decode step)".into());
        let costs = Costs {
            name,
            t_d_ms: p.t_d_ms,
            t_v: Some(VerifyCost { table: [("1".to_string(), p.t_d_ms)].into(), ..Default::default() }),
            cycle_ms: p.cycle_ms.clone(),
            provenance,
            surface: points,
            ..Default::default()
        };
        costs.validate().map_err(|m| Error::Report(format!("the measured costs are not a costs file: {m}")))?;
        Ok(costs)
    }

    /// The costs at one place of the surface, as a costs file of its own (its T_d, its measured
    /// cycles, T_v(1) = T_d): what `project --concurrency N --context short|long` reads. No T_s
    /// is carried over, so a k without a cycle measured there is skipped, never modelled from
    /// another place's costs.
    pub fn at(&self, concurrency: usize, context: Context) -> std::result::Result<Costs, String> {
        let p = surface::at(&self.surface, concurrency, context).map_err(|e| format!("{}: {e}", self.name))?;
        let sim = p.simulated_accept_length.map_or(String::new(), |s| format!(", simulated accept length {s}"));
        Ok(Costs {
            name: format!("{} at concurrency {concurrency}, context {context}{sim}", self.name),
            t_d_ms: p.t_d_ms,
            t_v: Some(VerifyCost { table: [("1".to_string(), p.t_d_ms)].into(), ..Default::default() }),
            cycle_ms: p.cycle_ms.clone(),
            provenance: self.provenance.clone(),
            ..Default::default()
        })
    }

    /// T_v(n) in ms, when the file gives it for n.
    pub fn verify_ms(&self, n: usize) -> Option<f64> {
        let tv = self.t_v.as_ref()?;
        if let (Some(a), Some(b)) = (tv.a_ms, tv.b_ms) {
            return Some(a + b * n as f64);
        }
        let table = int_keys(&tv.table, "t_v.table").ok()?;
        table
            .windows(2)
            .find(|w| w[0].0 <= n && n <= w[1].0)
            .map(|w| {
                let ((n0, v0), (n1, v1)) = (w[0], w[1]);
                if n1 == n0 { v0 } else { v0 + (v1 - v0) * (n - n0) as f64 / (n1 - n0) as f64 }
            })
            .or_else(|| table.iter().find(|&&(m, _)| m == n).map(|&(_, v)| v))
    }

    /// The cycle of `k` draft steps verifying `n` tokens, and whether it was measured.
    pub fn cycle(&self, k: usize, n: usize) -> Option<(f64, CycleSource)> {
        if n == k + 1
            && let Some(&ms) = self.cycle_ms.get(&k.to_string())
        {
            return Some((ms, CycleSource::Measured));
        }
        Some((k as f64 * self.t_s_ms? + self.verify_ms(n)? + self.overhead_ms, CycleSource::Model))
    }
}

/// Where a cycle cost came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CycleSource {
    /// `[cycle_ms]` of the costs file.
    Measured,
    /// k·T_s + T_v(n) + overhead.
    Model,
}

/// S = τ·T_d / cycle: throughput with speculation over throughput without.
pub fn speedup(tau: f64, t_d_ms: f64, cycle_ms: f64) -> f64 {
    tau * t_d_ms / cycle_ms
}

/// The τ at which speculation breaks even: cycle / T_d.
pub fn break_even_tau(cycle_ms: f64, t_d_ms: f64) -> f64 {
    cycle_ms / t_d_ms
}

/// One k of the projection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProjectionRow {
    /// Draft steps.
    pub k: usize,
    /// Tokens verified per pass.
    pub verify_tokens: usize,
    /// Accept length, bonus included.
    pub tau: f64,
    /// Cycle cost, ms.
    pub cycle_ms: f64,
    /// Whether that cycle was measured or modelled.
    pub cycle_source: CycleSource,
    /// S(k) = τ·T_d / cycle.
    pub speedup: f64,
    /// Projected tokens/s per sequence with speculation, S·1000/T_d.
    pub tokens_per_s: f64,
    /// Break-even τ = cycle / T_d.
    pub break_even_tau: f64,
    /// τ − break-even τ (positive: the drafter pays).
    pub margin_tau: f64,
    /// The cycle at which S = 1: τ·T_d.
    pub max_cycle_ms: f64,
    /// The verify cost at which S = 1: τ·T_d − k·T_s − overhead (needs T_s).
    pub max_verify_ms: Option<f64>,
}

/// The result of `aerie project`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    /// Costs file name.
    pub costs: String,
    /// T_d, ms.
    pub t_d_ms: f64,
    /// Tokens/s per sequence without speculation, 1000/T_d.
    pub baseline_tokens_per_s: f64,
    /// Every k whose cycle is known.
    pub rows: Vec<ProjectionRow>,
    /// The k of highest S.
    pub best_k: Option<usize>,
    /// Whether the best k beats plain decoding.
    pub pays: bool,
    /// k of the curve left out (no cycle cost for them), with why.
    pub skipped: Vec<String>,
}

/// Project an acceptance curve through a costs file.
pub fn project(curve: &[CurvePoint], costs: &Costs) -> Projection {
    let t_d = costs.t_d_ms;
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for p in curve {
        let Some((cycle, source)) = costs.cycle(p.k, p.verify_tokens) else {
            skipped.push(format!(
                "k = {} ({} verified tokens): no measured cycle and no T_s/T_v({}) in the costs file",
                p.k, p.verify_tokens, p.verify_tokens
            ));
            continue;
        };
        let s = speedup(p.tau, t_d, cycle);
        let be = break_even_tau(cycle, t_d);
        rows.push(ProjectionRow {
            k: p.k,
            verify_tokens: p.verify_tokens,
            tau: p.tau,
            cycle_ms: cycle,
            cycle_source: source,
            speedup: s,
            tokens_per_s: s * 1000.0 / t_d,
            break_even_tau: be,
            margin_tau: p.tau - be,
            max_cycle_ms: p.tau * t_d,
            max_verify_ms: costs.t_s_ms.map(|ts| p.tau * t_d - p.k as f64 * ts - costs.overhead_ms),
        });
    }
    let best = rows.iter().max_by(|a, b| a.speedup.total_cmp(&b.speedup));
    Projection {
        costs: costs.name.clone(),
        t_d_ms: t_d,
        baseline_tokens_per_s: 1000.0 / t_d,
        best_k: best.map(|r| r.k),
        pays: best.is_some_and(|r| r.speedup > 1.0),
        rows,
        skipped,
    }
}

/// What a chain of k drafts must reach to pay in an engine, from its costs alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakEven {
    /// Draft steps.
    pub k: usize,
    /// Cycle cost, ms.
    pub cycle_ms: f64,
    /// Whether that cycle was measured or modelled.
    pub cycle_source: CycleSource,
    /// τ at which speculation at this k equals plain decoding (cycle / T_d).
    pub break_even_tau: f64,
}

/// The break-even τ of chains of k = 1..=`max_k` drafts (and every measured k beyond), for the
/// question a costs file answers before any drafter exists: what accept length must a drafter
/// reach in this engine to pay? k with neither a measured cycle nor a cost model are left out.
/// `max_k` and the measured k are bounded by the draft length limit (`drafter::shape::MAX_DEPTH`)
/// before the loop over them.
pub fn break_even(costs: &Costs, max_k: usize) -> Result<Vec<BreakEven>> {
    use aerie_data::limits::check;
    const WHY: &str = "the longest draft aerie runs (acceptance past a few dozen steps is zero for any drafter)";
    let limit = aerie_model::drafter::shape::MAX_DEPTH as u64;
    check("--max-k", max_k, limit, WHY)?;
    let measured_max = costs.cycle_ms.keys().filter_map(|k| k.parse::<u128>().ok()).max().unwrap_or(0);
    check(format!("a measured k of the costs file {}", costs.name), measured_max, limit, WHY)?;
    let measured_max = measured_max as usize;
    Ok((1..=max_k.max(measured_max))
        .filter_map(|k| {
            let (cycle, source) = costs.cycle(k, k + 1)?;
            Some(BreakEven {
                k,
                cycle_ms: cycle,
                cycle_source: source,
                break_even_tau: break_even_tau(cycle, costs.t_d_ms),
            })
        })
        .collect())
}

/// Read the acceptance curve of an accept or measure report (`curve: [{k, verify_tokens, tau}]`).
pub fn load_curve(path: &Path) -> Result<Vec<CurvePoint>> {
    let err = |message: String| Error::Input { path: path.to_path_buf(), message };
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
    let curve = v.get("curve").ok_or_else(|| {
        err("no `curve` field: pass the --json output of `aerie eval accept` or `aerie measure`".into())
    })?;
    let curve: Vec<CurvePoint> = serde_json::from_value(curve.clone()).map_err(|e| err(format!("`curve`: {e}")))?;
    if curve.is_empty() {
        return Err(err("`curve` is empty".into()));
    }
    if let Some(p) = curve.iter().find(|p| !(p.tau >= 1.0 && p.tau.is_finite()) || p.verify_tokens < 2) {
        return Err(err(format!("curve point {p:?}: τ counts the bonus token (>= 1) and a pass verifies >= 2 tokens")));
    }
    Ok(curve)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kimi(t_d: f64, cycle: f64) -> Costs {
        Costs {
            name: "kimi".into(),
            t_d_ms: t_d,
            cycle_ms: [("2".to_string(), cycle)].into(),
            provenance: Provenance {
                measured_where: "node".into(),
                when: "then".into(),
                by: "us".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn point(k: usize, tau: f64) -> CurvePoint {
        CurvePoint { k, verify_tokens: k + 1, tau }
    }

    #[test]
    fn kimi_production_numbers() {
        // τ 2.0, 2-step cycle 29 ms, decode 12.1 ms: S = 2·12.1/29 = 0.8345 (16.6% slower);
        // break-even 29/12.1 = 2.397. At a 30 ms cycle and 12.2 ms decode: 30/12.2 = 2.459.
        let p = project(&[point(2, 2.0)], &kimi(12.1, 29.0));
        let r = &p.rows[0];
        assert!((r.speedup - 0.834_482_758_6).abs() < 1e-9, "{}", r.speedup);
        assert!((r.break_even_tau - 2.396_694_214_9).abs() < 1e-9);
        assert!((r.margin_tau + 0.396_694_214_9).abs() < 1e-9);
        assert!((r.tokens_per_s - 68.965_517_24).abs() < 1e-6); // 2 tokens / 29 ms
        assert!((r.max_cycle_ms - 24.2).abs() < 1e-12);
        assert_eq!(r.cycle_source, CycleSource::Measured);
        assert!(!p.pays);
        let p = project(&[point(2, 2.0)], &kimi(12.2, 30.0));
        assert!((p.rows[0].break_even_tau - 2.459_016_393).abs() < 1e-8);
        assert!((p.rows[0].speedup - 0.813_333_333).abs() < 1e-8);
    }

    #[test]
    fn model_cycles_pick_the_best_k() {
        // T_d 10, T_s 1, T_v(n) = 8 + 1·n, overhead 0.5: cycle(k) = k + 8 + (k+1) + 0.5 = 2k + 9.5.
        let mut c = kimi(10.0, 1.0);
        c.cycle_ms.clear();
        c.t_s_ms = Some(1.0);
        c.overhead_ms = 0.5;
        c.t_v = Some(VerifyCost { a_ms: Some(8.0), b_ms: Some(1.0), table: BTreeMap::new() });
        let curve = [point(1, 1.8), point(2, 2.4), point(3, 2.6)];
        let p = project(&curve, &c);
        let cycles: Vec<f64> = p.rows.iter().map(|r| r.cycle_ms).collect();
        assert_eq!(cycles, vec![11.5, 13.5, 15.5]);
        // S = 18/11.5 = 1.565, 24/13.5 = 1.778, 26/15.5 = 1.677 → best k = 2.
        assert_eq!(p.best_k, Some(2));
        assert!(p.pays);
        // S = 1 when T_v = τ·T_d − k·T_s − overhead = 24 − 2 − 0.5.
        assert_eq!(p.rows[1].max_verify_ms, Some(21.5));
        assert!((p.rows[1].break_even_tau - 1.35).abs() < 1e-12);
        assert!((p.rows[1].speedup - 24.0 / 13.5).abs() < 1e-12);
    }

    #[test]
    fn verify_table_interpolates_inside_only() {
        let mut c = kimi(10.0, 1.0);
        c.t_v = Some(VerifyCost { table: [("2".into(), 10.0), ("4".into(), 14.0)].into(), ..Default::default() });
        assert_eq!(c.verify_ms(2), Some(10.0));
        assert_eq!(c.verify_ms(3), Some(12.0));
        assert_eq!(c.verify_ms(4), Some(14.0));
        assert_eq!(c.verify_ms(5), None);
        // No T_s: only the measured k = 2 is covered.
        let p = project(&[point(1, 1.5), point(2, 2.0)], &c);
        assert_eq!(p.rows.len(), 1);
        assert_eq!(p.skipped.len(), 1);
    }

    #[test]
    fn costs_files_parse_and_validate() {
        let path = Path::new("x.toml");
        let text = r#"
            name = "t"
            t_d_ms = 12.1
            t_s_ms = 1.0
            [t_v]
            table = { 3 = 27.0 }
            [cycle_ms]
            2 = 29.0
            [provenance]
            measured_where = "node"
            when = "2026"
            by = "me"
        "#;
        let c = Costs::from_toml(text, path).unwrap();
        assert_eq!(c.cycle(2, 3), Some((29.0, CycleSource::Measured)));
        assert_eq!(c.cycle(2, 4), None);
        let round = Costs::from_toml(&c.to_toml().unwrap(), path).unwrap();
        assert_eq!(round, c);
        let bad = text.replace("table = { 3 = 27.0 }", "a_ms = 1.0\ntable = { 3 = 27.0 }");
        assert!(Costs::from_toml(&bad, path).unwrap_err().to_string().contains("not both"));
        let bad = text.replace("t_d_ms = 12.1", "t_d_ms = 0");
        assert!(Costs::from_toml(&bad, path).unwrap_err().to_string().contains("t_d_ms"));
        let bad = text.replace("by = \"me\"", "by = \"\"");
        assert!(Costs::from_toml(&bad, path).unwrap_err().to_string().contains("provenance"));
        let bad = text.replace("2 = 29.0", "two = 29.0");
        assert!(Costs::from_toml(&bad, path).unwrap_err().to_string().contains("whole number"));
    }

    /// Issue 46 §1: a file with a surface round-trips, `at` picks a place (today's default is the
    /// concurrency-1 short point), and a file without one loads as before.
    #[test]
    fn surfaces_round_trip_and_old_files_still_load() {
        let mut one = SurfacePoint::plain(1, Context::Short, 12.1);
        one.add(2, 29.0, Some(2.0), Some(0.8));
        let mut busy = SurfacePoint::plain(16, Context::Long, 20.0);
        busy.add(2, 26.0, None, None);
        let prov = kimi(1.0, 1.0).provenance;
        let c = Costs::from_surface("node".into(), vec![busy, one], prov).unwrap();
        assert_eq!((c.t_d_ms, c.cycle(2, 3)), (12.1, Some((29.0, CycleSource::Measured))));
        let path = Path::new("s.toml");
        assert_eq!(Costs::from_toml(&c.to_toml().unwrap(), path).unwrap(), c);
        let far = c.at(16, Context::Long).unwrap();
        let be = break_even(&far, 1).unwrap();
        assert_eq!((be.len(), be[0].k, be[0].break_even_tau), (1, 2, 1.3));
        assert!(c.at(4, Context::Short).unwrap_err().contains("node: no surface point at concurrency 4"));
        let old = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/costs/kimi-k25-8x-rtx-pro-6000.toml"),
        )
        .unwrap();
        assert!(Costs::from_toml(&old, path).unwrap().surface.is_empty());
        let bad = c.to_toml().unwrap().replace("concurrency = 16", "concurrency = 0");
        assert!(Costs::from_toml(&bad, path).unwrap_err().to_string().contains("concurrency must be"));
    }

    #[test]
    fn shipped_costs_files_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/costs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                Costs::load(&p).unwrap();
                n += 1;
            }
        }
        assert!(n >= 2, "expected the Kimi costs files in {}", dir.display());
        let k = Costs::load(&dir.join("kimi-k25-8x-rtx-pro-6000.toml")).unwrap();
        let p = project(&[point(2, 2.0)], &k);
        assert!((p.rows[0].speedup - 0.8345).abs() < 1e-3);
    }
}
