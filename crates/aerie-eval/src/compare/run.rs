//! The candidate loops of `aerie compare`, one per mode: every drafter on the same captured
//! shards (offline acceptance), on the same prompts (real decoding on the native target), or in
//! the same serving engine (`eval serve`'s runs, ranked by the engine's measured speedup). Each
//! drafter becomes a [`Candidate`]; the CLI names the drafters, shows [`CompareProgress`] and
//! prints the table.

use std::path::{Path, PathBuf};

use aerie_model::drafter::shape::DraftShape;
use burn::tensor::backend::Backend;

use super::Candidate;
use crate::Result;
use crate::cost::Costs;
use crate::decode::{DecodeOptions, DecodeSession, measured_costs};
use crate::offline::ShardEval;
use crate::serve::ServeReport;
use crate::verify::AcceptOptions;

/// What `compare` reports while it runs (a progress bar); every method does nothing by default.
pub trait CompareProgress {
    /// The loop starts: `total` units of `unit` over all candidates.
    fn start(&self, _total: u64, _unit: &str) {}
    /// Candidate `i` (0-based) of `n`, named `name`, starts at overall position `position`.
    fn candidate(&self, _i: usize, _n: usize, _name: &str, _position: u64) {}
    /// The overall position, in units.
    fn position(&self, _position: u64) {}
    /// `units` more done.
    fn advance(&self, _units: u64) {}
    /// One candidate's result, as a line.
    fn line(&self, _line: &str) {}
}

/// What every mode compares: the drafters (unique names and their directories), the costs file
/// to project through, and where progress goes.
pub struct Compare<'a> {
    /// (name, directory) of each candidate, in order; names are unique.
    pub drafters: &'a [(String, PathBuf)],
    /// The costs file given, if any.
    pub costs: Option<&'a Costs>,
    /// Progress.
    pub progress: &'a dyn CompareProgress,
}

impl Compare<'_> {
    fn start(&self, i: usize, position: u64) -> &str {
        let name = &self.drafters[i].0;
        self.progress.candidate(i, self.drafters.len(), name, position);
        name
    }

    fn done(&self, i: usize, what: String) {
        self.progress.line(&format!("[{}/{}] {}: {what}", i + 1, self.drafters.len(), self.drafters[i].0));
    }
}

/// Offline: each drafter's serving-mode acceptance on the same shards (its embedding from
/// `target` when it ships none), projected through the costs file.
pub fn offline<B: Backend>(
    c: &Compare<'_>,
    shards: &ShardEval<B>,
    target: Option<&Path>,
    opts: &AcceptOptions,
    max_samples: Option<usize>,
    device: &B::Device,
) -> Result<Vec<Candidate>> {
    let per = shards.samples(max_samples);
    c.progress.start((c.drafters.len() * per) as u64, "samples");
    let mut cands = Vec::with_capacity(c.drafters.len());
    for (i, (_, dir)) in c.drafters.iter().enumerate() {
        let name = c.start(i, (i * per) as u64).to_owned();
        let report = shards.accept(dir, target, opts, &|d| c.progress.position((i * per + d) as u64), device)?;
        c.done(i, format!("τ {:.3}", report.tau));
        cands.push(Candidate::new(name, dir.display().to_string(), report, c.costs));
    }
    Ok(cands)
}

/// Decoding: each drafter decodes the session's prompts on the native target beside plain
/// decoding. Without a costs file each candidate is projected through the costs its own run
/// measured (on `device_name`, dated `when`); the table's costs are the given file's, else the
/// first run's.
pub fn decoding<B: Backend>(
    c: &Compare<'_>,
    session: &DecodeSession<B>,
    target: &Path,
    opts: &DecodeOptions,
    (device_name, when): (&str, &str),
    device: &B::Device,
) -> Result<(Vec<Candidate>, Option<Costs>)> {
    opts.validate(usize::MAX)?;
    let per = 2 * session.answers() * opts.max_new_tokens;
    c.progress.start((c.drafters.len() * per) as u64, "tokens (max)");
    let mut cands = Vec::with_capacity(c.drafters.len());
    let mut table_costs = c.costs.cloned();
    for (i, (_, dir)) in c.drafters.iter().enumerate() {
        let name = c.start(i, (i * per) as u64).to_owned();
        let (report, timings) = session.run(target, dir, opts, device, &mut |t| c.progress.advance(t as u64))?;
        let own = c.costs.cloned().or_else(|| measured_costs(&timings, target, device_name, &opts.shape, when));
        if table_costs.is_none() {
            table_costs.clone_from(&own);
        }
        c.done(i, format!("τ {:.3}, measured speedup {:.3}", report.tau, report.speedup));
        let mut acceptance = report.acceptance;
        acceptance.profile = Some(report.profile);
        let mut cand = Candidate::new(name, dir.display().to_string(), acceptance, own.as_ref());
        cand.measured_speedup = Some(report.speedup);
        cands.push(cand);
    }
    Ok((cands, table_costs))
}

/// Serving: `eval serve`'s runs as candidates, projected through the costs file or else the
/// engine's own measured costs (dated `when`), ranked by the engine's measured speedup.
pub fn serving(report: &ServeReport, costs: Option<&Costs>, when: &str) -> Result<(Vec<Candidate>, Costs)> {
    let costs = match costs {
        Some(c) => c.clone(),
        None => report.costs(when)?,
    };
    let mut cands: Vec<Candidate> = report
        .runs
        .iter()
        .map(|r| {
            let path = r.drafter_dir.display().to_string();
            let mut c = Candidate::new(r.drafter.clone(), path, r.accept_report(), Some(&costs));
            c.measured_speedup = Some(r.speedup);
            c
        })
        .collect();
    cands.sort_by(|a, b| b.measured_speedup.unwrap_or(0.0).total_cmp(&a.measured_speedup.unwrap_or(0.0)));
    Ok((cands, costs))
}

/// The one draft shape an engine serves: a chain of k drafts (engines' EAGLE-3 has no trees
/// here), else an error saying so.
pub fn served_chain(shape: &DraftShape) -> Result<usize> {
    match shape {
        DraftShape::Chain { k } => Ok(*k),
        _ => Err(crate::Error::Incompatible(
            "--engine serves chains of --k drafts (the engines' EAGLE-3 here has no draft trees)".into(),
        )),
    }
}
