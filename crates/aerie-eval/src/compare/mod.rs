//! `aerie compare`: several drafters on the same captured data, one table. Each candidate's
//! [`AcceptReport`] (and, with a costs file, its [`Projection`]) becomes a row with τ, the
//! per-position rates, the projected tokens/s at its best k and its margin over break-even; the
//! table is written as Markdown, CSV and JSON, with PNG and SVG plots ([`crate::plot`]).
//!
//! `compare.parquet` holds the CSV's columns with their types (floats, nullable where a value
//! may not exist). The loops that evaluate the candidates, one per mode, are [`run`]'s.

pub mod run;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};

use serde::{Deserialize, Serialize};

use crate::accept::AcceptReport;
use crate::cost::{Costs, Projection, project};
use crate::plot;
use crate::profile::PROFILE_FILE;
use crate::{Error, Result};

/// `compare.json`'s `format`: recognises a comparison directory as aerie's before a rerun
/// replaces its files.
pub const COMPARE_FORMAT: &str = "aerie-compare/1";

/// One evaluated drafter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Short name (the directory name unless given).
    pub name: String,
    /// Where it was loaded from.
    pub path: String,
    /// Its acceptance on the data.
    pub accept: AcceptReport,
    /// Its projection through the costs file, when one was given.
    pub projection: Option<Projection>,
    /// The speedup real decoding measured (`compare --target --prompts`), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_speedup: Option<f64>,
}

impl Candidate {
    /// Build a candidate, projecting its curve through `costs` when given.
    pub fn new(name: String, path: String, accept: AcceptReport, costs: Option<&Costs>) -> Self {
        let projection = costs.map(|c| project(&accept.curve, c));
        Self { name, path, accept, projection, measured_speedup: None }
    }
}

/// One row of the comparison table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    /// Candidate name.
    pub name: String,
    /// τ at the evaluated K, bonus included.
    pub tau: f64,
    /// α_i, conditional.
    pub accept_rate_conditional: Vec<f64>,
    /// r_i, unconditional.
    pub accept_rate_unconditional: Vec<f64>,
    /// k of highest projected speedup.
    pub best_k: Option<usize>,
    /// τ(best k).
    pub tau_at_best_k: Option<f64>,
    /// S(best k).
    pub speedup: Option<f64>,
    /// Projected tokens/s per sequence at the best k.
    pub tokens_per_s: Option<f64>,
    /// Break-even τ at the best k.
    pub break_even_tau: Option<f64>,
    /// τ − break-even τ at the best k.
    pub margin_tau: Option<f64>,
    /// Positions counted.
    pub positions: u64,
    /// Share of positions whose captured next token is not the target argmax.
    pub captured_not_target_argmax: f64,
    /// Speedup measured by real decoding (decode mode only).
    pub measured_speedup: Option<f64>,
    /// The acceptance profile ([`crate::profile`]): rates, τ by output position (or why not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::profile::AcceptanceProfile>,
}

/// Table rows of `cands`, in order.
pub fn rows(cands: &[Candidate]) -> Vec<CompareRow> {
    cands
        .iter()
        .map(|c| {
            let best = c.projection.as_ref().and_then(|p| p.rows.iter().find(|r| Some(r.k) == p.best_k));
            CompareRow {
                name: c.name.clone(),
                tau: c.accept.tau,
                accept_rate_conditional: c.accept.accept_rate_conditional.clone(),
                accept_rate_unconditional: c.accept.accept_rate_unconditional.clone(),
                best_k: best.map(|r| r.k),
                tau_at_best_k: best.map(|r| r.tau),
                speedup: best.map(|r| r.speedup),
                tokens_per_s: best.map(|r| r.tokens_per_s),
                break_even_tau: best.map(|r| r.break_even_tau),
                margin_tau: best.map(|r| r.margin_tau),
                positions: c.accept.positions,
                captured_not_target_argmax: c.accept.captured_not_target_argmax,
                measured_speedup: c.measured_speedup,
                profile: c.accept.profile.clone(),
            }
        })
        .collect()
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_string(), |x| format!("{x:.digits$}"))
}

/// The table as Markdown.
pub fn markdown(rows: &[CompareRow], costs: Option<&Costs>) -> String {
    let k = rows.iter().map(|r| r.accept_rate_conditional.len()).max().unwrap_or(0);
    let mut s = String::new();
    let _ = writeln!(s, "# Drafter comparison\n");
    match costs {
        Some(c) => {
            let _ = writeln!(
                s,
                "Costs: `{}` (T_d {} ms, {:.1} tok/s without speculation).\n",
                c.name,
                c.t_d_ms,
                1000.0 / c.t_d_ms
            );
        }
        None => {
            let _ = writeln!(s, "No costs file: speedup columns are empty (pass --costs).\n");
        }
    }
    let _ = writeln!(
        s,
        "τ counts the bonus token. α_i: conditional rate, P(draft i accepted | drafts before it accepted). r_i: unconditional, P(at least i accepted).\n"
    );
    let mut head = String::from("| drafter | τ |");
    let mut rule = String::from("|---|---:|");
    for i in 1..=k {
        let _ = write!(head, " α_{i} |");
        rule.push_str("---:|");
    }
    for i in 1..=k {
        let _ = write!(head, " r_{i} |");
        rule.push_str("---:|");
    }
    head.push_str(" best k | τ(best k) | speedup | tok/s | break-even τ | margin | positions |");
    rule.push_str("---:|---:|---:|---:|---:|---:|---:|");
    let measured = rows.iter().any(|r| r.measured_speedup.is_some());
    if measured {
        head.push_str(" measured speedup |");
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    for r in rows {
        let mut line = format!("| {} | {:.3} |", r.name.replace('|', "\\|"), r.tau);
        for i in 0..k {
            let _ = write!(line, " {} |", opt(r.accept_rate_conditional.get(i).copied(), 3));
        }
        for i in 0..k {
            let _ = write!(line, " {} |", opt(r.accept_rate_unconditional.get(i).copied(), 3));
        }
        let _ = write!(
            line,
            " {} | {} | {} | {} | {} | {} | {} |",
            r.best_k.map_or("–".into(), |k| k.to_string()),
            opt(r.tau_at_best_k, 3),
            opt(r.speedup, 3),
            opt(r.tokens_per_s, 1),
            opt(r.break_even_tau, 3),
            r.margin_tau.map_or("–".into(), |m| format!("{m:+.3}")),
            r.positions
        );
        if measured {
            let _ = write!(line, " {} |", opt(r.measured_speedup, 3));
        }
        let _ = writeln!(s, "{line}");
    }
    if let Some(r) = rows.iter().find(|r| r.captured_not_target_argmax > 0.0) {
        let _ = writeln!(
            s,
            "\nWarning: the captured tokens are not the target's greedy outputs ({:.1}% of positions for `{}`): greedy τ here is not decoding τ.",
            100.0 * r.captured_not_target_argmax,
            r.name
        );
    }
    s
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// The table as CSV (one header line; empty cells where a value does not exist).
pub fn csv(rows: &[CompareRow]) -> String {
    let k = rows.iter().map(|r| r.accept_rate_conditional.len()).max().unwrap_or(0);
    let mut head = vec!["drafter".to_string(), "tau".into()];
    head.extend((1..=k).map(|i| format!("alpha_conditional_{i}")));
    head.extend((1..=k).map(|i| format!("r_unconditional_{i}")));
    head.extend(
        [
            "best_k",
            "tau_at_best_k",
            "speedup",
            "tokens_per_s",
            "break_even_tau",
            "margin_tau",
            "positions",
            "captured_not_target_argmax",
            "measured_speedup",
        ]
        .map(String::from),
    );
    let mut out = head.join(",") + "\n";
    let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
    for r in rows {
        let mut cells = vec![csv_field(&r.name), format!("{}", r.tau)];
        cells.extend((0..k).map(|i| f(r.accept_rate_conditional.get(i).copied())));
        cells.extend((0..k).map(|i| f(r.accept_rate_unconditional.get(i).copied())));
        cells.push(r.best_k.map_or(String::new(), |k| k.to_string()));
        cells.extend([r.tau_at_best_k, r.speedup, r.tokens_per_s, r.break_even_tau, r.margin_tau].map(f));
        cells.push(r.positions.to_string());
        cells.push(format!("{}", r.captured_not_target_argmax));
        cells.push(f(r.measured_speedup));
        out.push_str(&(cells.join(",") + "\n"));
    }
    out
}

/// Write the table as Parquet, the columns of [`csv`] with their types.
pub fn write_parquet(rows: &[CompareRow], path: &Path) -> Result<()> {
    let k = rows.iter().map(|r| r.accept_rate_conditional.len()).max().unwrap_or(0);
    let mut fields = vec![Field::new("drafter", DataType::Utf8, false), Field::new("tau", DataType::Float64, false)];
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>())),
        Arc::new(Float64Array::from(rows.iter().map(|r| r.tau).collect::<Vec<_>>())),
    ];
    let mut float = |name: String, values: Vec<Option<f64>>| {
        fields.push(Field::new(name, DataType::Float64, true));
        cols.push(Arc::new(Float64Array::from(values)));
    };
    for i in 0..k {
        float(
            format!("alpha_conditional_{}", i + 1),
            rows.iter().map(|r| r.accept_rate_conditional.get(i).copied()).collect(),
        );
    }
    for i in 0..k {
        float(
            format!("r_unconditional_{}", i + 1),
            rows.iter().map(|r| r.accept_rate_unconditional.get(i).copied()).collect(),
        );
    }
    float("best_k".into(), rows.iter().map(|r| r.best_k.map(|k| k as f64)).collect());
    float("tau_at_best_k".into(), rows.iter().map(|r| r.tau_at_best_k).collect());
    float("speedup".into(), rows.iter().map(|r| r.speedup).collect());
    float("tokens_per_s".into(), rows.iter().map(|r| r.tokens_per_s).collect());
    float("break_even_tau".into(), rows.iter().map(|r| r.break_even_tau).collect());
    float("margin_tau".into(), rows.iter().map(|r| r.margin_tau).collect());
    float("captured_not_target_argmax".into(), rows.iter().map(|r| Some(r.captured_not_target_argmax)).collect());
    float("measured_speedup".into(), rows.iter().map(|r| r.measured_speedup).collect());
    fields.push(Field::new("positions", DataType::UInt64, false));
    cols.push(Arc::new(UInt64Array::from(rows.iter().map(|r| r.positions).collect::<Vec<_>>())));
    let fail = |e: &dyn std::fmt::Display| Error::Report(format!("{}: {e}", path.display()));
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), cols).map_err(|e| fail(&e))?;
    // Atomically, through a temp file created new (never through a link at either name).
    aerie_data::atomic::write_file(path, |tmp| {
        let file = std::fs::OpenOptions::new().write(true).open(tmp).map_err(|e| aerie_data::Error::io(tmp, e))?;
        let fail = |e: &dyn std::fmt::Display| aerie_data::Error::io(tmp, std::io::Error::other(e.to_string()));
        let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).map_err(|e| fail(&e))?;
        w.write(&batch).map_err(|e| fail(&e))?;
        w.close().map_err(|e| fail(&e))?;
        Ok(())
    })?;
    Ok(())
}

/// Refuse `--out` when it holds files of a report's names that aerie did not write (no
/// `compare.json` of aerie's beside them). Called by [`write_report`], and by `compare` before
/// it evaluates anything, so a refused `--out` costs a second, not the evaluation.
pub fn check_out(dir: &Path) -> Result<()> {
    const NAMES: [&str; 8] = [
        "compare.md",
        "compare.csv",
        "compare.parquet",
        "compare.json",
        "acceptance.png",
        "acceptance.svg",
        "speedup.png",
        "speedup.svg",
    ];
    if let Some(name) = NAMES.iter().find(|n| dir.join(n).exists()) {
        let json = dir.join("compare.json");
        // Comparisons written before the format field are recognised by their shape.
        let ours = |v: &serde_json::Value| {
            aerie_data::owned::has_format(v, COMPARE_FORMAT)
                || (v.get("rows").is_some() && v.get("candidates").is_some())
        };
        if !json.exists() {
            return Err(aerie_data::Error::NotOurs {
                path: dir.join(name),
                message: "exists but no compare.json beside it, so it is not a comparison that aerie wrote; \
                          refusing to replace it: choose another --out"
                    .into(),
            }
            .into());
        }
        aerie_data::owned::check_json_is_ours(&json, "a comparison's compare.json", "in --out", ours)?;
    }
    Ok(())
}

/// Write `compare.md`, `compare.csv`, `compare.parquet`, `compare.json`, `acceptance.{png,svg}` and, with costs,
/// `speedup.{png,svg}` into `dir` (created). Returns the paths written.
///
/// A previous comparison in `dir` is replaced (recognised by its `compare.json`); files of these
/// names that another program wrote are not.
pub fn write_report(dir: &Path, cands: &[Candidate], costs: Option<&Costs>) -> Result<Vec<PathBuf>> {
    if cands.is_empty() {
        return Err(Error::Report("nothing to compare".into()));
    }
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
    let _lock = aerie_data::lock::OutputLock::beside(dir)?;
    check_out(dir)?;
    let table = rows(cands);
    let put = |name: &str, text: String| -> Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|source| Error::Io { path: p.clone(), source })?;
        Ok(p)
    };
    let mut written = vec![put("compare.md", markdown(&table, costs))?, put("compare.csv", csv(&table))?];
    for c in cands {
        if let Some(p) = &c.accept.profile {
            let path = dir.join(format!("{}.{PROFILE_FILE}", c.name));
            p.write(&path)?;
            written.push(path);
        }
    }
    let pq = dir.join("compare.parquet");
    write_parquet(&table, &pq)?;
    written.push(pq);
    let json = serde_json::json!({ "format": COMPARE_FORMAT, "costs": costs, "rows": table, "candidates": cands });
    written.push(put("compare.json", serde_json::to_string_pretty(&json).map_err(|e| Error::Report(e.to_string()))?)?);
    let series: Vec<plot::Series> = cands
        .iter()
        .map(|c| plot::Series {
            name: c.name.clone(),
            conditional: c.accept.accept_rate_conditional.clone(),
            unconditional: c.accept.accept_rate_unconditional.clone(),
            speedup: c
                .projection
                .as_ref()
                .map(|p| p.rows.iter().map(|r| (r.k, r.speedup)).collect())
                .unwrap_or_default(),
        })
        .collect();
    for ext in ["png", "svg"] {
        let p = dir.join(format!("acceptance.{ext}"));
        plot::acceptance(&series, &p)?;
        written.push(p);
        if costs.is_some() && series.iter().any(|s| !s.speedup.is_empty()) {
            let p = dir.join(format!("speedup.{ext}"));
            plot::speedup(&series, costs.map(|c| c.name.as_str()).unwrap_or(""), &p)?;
            written.push(p);
        }
    }
    Ok(written)
}
