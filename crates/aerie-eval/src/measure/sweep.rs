//! The costs file of an `aerie measure` sweep: a plain server's runs at each concurrency and
//! context start the surface (T_d at each place), a speculative server's runs add their cycle,
//! τ and speedup at its k to the same places. The server's k is the server's: one sweep measures
//! one k, and a second server started at another k extends the same file.

use super::{MeasureReport, costs_from_report};
use crate::cost::{Costs, Provenance};
use crate::surface::{self, SurfacePoint};
use crate::{Error, Result};

/// The costs file a sweep writes. Plain `reports` (one per place) start one: each place's T_d, the
/// top level the concurrency-1 short one ([`Costs::from_surface`]). Speculative ones extend
/// `existing`, which must hold the same places measured without speculation: each gets the
/// server's k, its cycle, τ and speedup (the plain T_d of that place over this run's
/// inter-token latency, both streamed decode times). A file from before surfaces, extended at
/// one place, is extended as before ([`costs_from_report`]).
pub fn costs_from_sweep(reports: &[MeasureReport], existing: Option<Costs>, provenance: Provenance) -> Result<Costs> {
    let err = |m: String| Error::Incompatible(m);
    let Some(first) = reports.first() else { return Err(err("no run measured".into())) };
    if reports.iter().any(|r| r.speculative != first.speculative) {
        return Err(err("a sweep is all plain or all speculative: one server answers it".into()));
    }
    if !first.speculative {
        let mut points = Vec::with_capacity(reports.len());
        for r in reports {
            let t_d = r.t_d_ms.ok_or_else(|| {
                err(format!(
                    "no decode time at concurrency {}, context {}: no tokens came back",
                    r.concurrency, r.context
                ))
            })?;
            points.push(SurfacePoint::plain(r.concurrency, r.context, t_d));
        }
        let mut p = provenance;
        p.measured.push("t_d_ms and surface.t_d_ms (the streamed inter-token latency of a plain server)".into());
        let name = if first.label.is_empty() { "measured".to_string() } else { first.label.clone() };
        return Costs::from_surface(name, points, p);
    }
    let mut costs = existing.ok_or_else(|| {
        err("a speculative run adds its cycle to a costs file holding T_d: run `aerie measure --out FILE` against the plain server first, at the same --concurrency and --context".into())
    })?;
    if costs.surface.is_empty() {
        if let [one] = reports {
            return costs_from_report(one, Some(costs), provenance);
        }
        return Err(err(format!(
            "{}: a costs file without a surface holds one T_d; measure the plain server with the same --concurrency and --context lists first",
            costs.name
        )));
    }
    for r in reports {
        let at = format!("concurrency {}, context {}", r.concurrency, r.context);
        let cycle = r.implied_cycle_ms.ok_or_else(|| err(format!("{at}: no cycle cost could be derived")))?;
        let k = r.steps.ok_or_else(|| err(format!("{at}: the server sent no accepted-drafts histogram: k unknown")))?;
        if r.verify_tokens.is_some_and(|n| n != k + 1) {
            return Err(err(
                "tree drafting: the surface holds chain cycles (k drafts, k+1 verified tokens) only".into()
            ));
        }
        let point =
            costs.surface.iter_mut().find(|p| p.same_place(r.concurrency, r.context, None)).ok_or_else(|| {
                err(format!("{}: no plain T_d at {at}: measure the plain server there first", costs.name))
            })?;
        let speedup = r.itl_ms.filter(|&itl| itl > 0.0).map(|itl| point.t_d_ms / itl);
        point.add(k, cycle, r.tau, speedup);
        costs.provenance.measured.push(format!(
            "surface cycle_ms.{k}, tau.{k}, speedup.{k} at {at} (the decode time over the server's verify cycles, of the same responses; speedup = T_d / this run's inter-token latency), {}: {}",
            provenance.when, provenance.measured_where
        ));
    }
    if let Some(p) = surface::primary(&costs.surface) {
        costs.t_d_ms = p.t_d_ms;
        costs.cycle_ms.extend(p.cycle_ms.iter().map(|(k, v)| (k.clone(), *v)));
    }
    costs.validate().map_err(|m| Error::Report(format!("the measured costs are not a costs file: {m}")))?;
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{MeasureOptions, RequestResult, summarize};
    use crate::surface::Context;
    use aerie_engine::meta::SpecMeta;

    fn plain(concurrency: usize, context: Context, decode_s: f64) -> MeasureReport {
        let r = RequestResult {
            meta: SpecMeta { completion_tokens: Some(11), ..Default::default() },
            e2e_s: 0.2,
            decode_s: Some(decode_s),
            decode_tokens: Some(10),
            first_chunk_tokens: Some(1),
            attempts: 1,
            ..RequestResult::default()
        };
        let mut rep = summarize(&[r], 0.2, &MeasureOptions { concurrency, ..MeasureOptions::default() }).unwrap();
        rep.context = context;
        rep
    }

    fn spec(concurrency: usize, decode_s: f64) -> MeasureReport {
        // k = 2: 4 cycles accepting 1 + 2 drafts (τ 1.75), 8 decode tokens.
        let r = RequestResult {
            meta: SpecMeta {
                completion_tokens: Some(9),
                verify_ct: Some(4),
                proposed_drafts: Some(8),
                histogram: Some(vec![2, 1, 1]),
                ..Default::default()
            },
            e2e_s: 1.0,
            decode_s: Some(decode_s),
            decode_tokens: Some(8),
            first_chunk_tokens: Some(1),
            attempts: 1,
            ..RequestResult::default()
        };
        summarize(&[r], 1.0, &MeasureOptions { concurrency, ..MeasureOptions::default() }).unwrap()
    }

    fn prov() -> Provenance {
        Provenance { measured_where: "mock".into(), when: "now".into(), by: "test".into(), ..Default::default() }
    }

    #[test]
    fn a_plain_sweep_then_a_speculative_one_fill_the_surface() {
        // T_d 12.1 ms at concurrency 1, 20 ms at 4.
        let plains = [plain(1, Context::Short, 0.121), plain(4, Context::Short, 0.2)];
        let costs = costs_from_sweep(&plains, None, prov()).unwrap();
        assert_eq!((costs.t_d_ms, costs.surface.len()), (12.1, 2));
        // The speculative server at k = 2: 0.16 s over 4 cycles = 40 ms; ITL 20 ms.
        let specs = [spec(1, 0.16), spec(4, 0.16)];
        let c = costs_from_sweep(&specs, Some(costs.clone()), prov()).unwrap();
        assert_eq!(c.cycle_ms.get("2"), Some(&40.0), "the top level follows the concurrency-1 point");
        let four = &c.surface[1];
        assert_eq!((four.cycle_ms.get("2"), four.tau.get("2")), (Some(&40.0), Some(&1.75)));
        assert!((four.speedup["2"] - 1.0).abs() < 1e-9, "T_d 20 ms over ITL 20 ms");
        let e = costs_from_sweep(&[spec(16, 0.16)], Some(costs), prov()).unwrap_err().to_string();
        assert!(e.contains("no plain T_d at concurrency 16, context short"), "{e}");
        let e = costs_from_sweep(&specs, None, prov()).unwrap_err().to_string();
        assert!(e.contains("plain server first"), "{e}");
    }
}
