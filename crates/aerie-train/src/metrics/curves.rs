//! Training curves of one or more runs on one PNG or SVG (`aerie plot`): the numbers TensorBoard
//! shows from the event files, drawn from `metrics.jsonl` with the chart helpers `aerie compare`
//! uses ([`aerie_plot`]), one colour per run. Six panels against the optimizer step: loss,
//! teacher-forced accuracy per unrolled step, simulated τ, learning rate, gradient norm and
//! tokens/s; evaluation lines (thin, with markers) join the loss and τ panels.

use std::path::{Path, PathBuf};

use aerie_plot::plotters::coord::Shift;
use aerie_plot::plotters::prelude::*;
use aerie_plot::{DrawResult, FONT, Figure, color, legend, line, render, text};

use super::{Metrics, read};
use crate::{Error, Result};

/// One run to draw: its legend name and its lines.
#[derive(Debug, Clone)]
pub struct Run {
    /// Legend name.
    pub name: String,
    /// Its `metrics.jsonl`.
    pub metrics: Metrics,
}

/// Read the runs named by `dirs` (run directories, or `metrics.jsonl` files). Each is named by
/// its directory's last component, or by the path as given where two would share a name.
pub fn load(dirs: &[PathBuf]) -> Result<Vec<Run>> {
    let short = |d: &Path| {
        let dir = if d.is_file() { d.parent().unwrap_or(d) } else { d };
        dir.file_name().map_or_else(|| d.display().to_string(), |n| n.to_string_lossy().into_owned())
    };
    let mut runs = Vec::new();
    for d in dirs {
        let metrics = read(d)?;
        if metrics.train.is_empty() {
            return Err(Error::Metrics {
                path: d.clone(),
                message: "no train lines yet (the first is written after `log_every` steps)".into(),
            });
        }
        let unique = dirs.iter().filter(|o| short(o) == short(d)).count() == 1;
        runs.push(Run { name: if unique { short(d) } else { d.display().to_string() }, metrics });
    }
    Ok(runs)
}

/// Read the runs in `dirs` and draw their curves into `out` (`.png` or `.svg`).
pub fn plot_runs(dirs: &[PathBuf], out: &Path) -> Result<()> {
    if dirs.is_empty() {
        return Err(Error::Options("plot: name at least one run directory".into()));
    }
    plot(&load(dirs)?, out)
}

/// Draw `runs` into `out` (`.png` or `.svg`).
pub fn plot(runs: &[Run], out: &Path) -> Result<()> {
    Ok(render(out, (1500, 900), &Curves(runs))?)
}

/// One line of a panel.
struct Line {
    name: Option<String>,
    style: ShapeStyle,
    pts: Vec<(f64, f64)>,
    markers: bool,
}

/// One panel: title, y axis, lines, and whether its legend goes up (curves that fall) or down
/// (curves that rise), where the lines leave room.
struct Panel {
    title: &'static str,
    y_desc: &'static str,
    lines: Vec<Line>,
    legend_up: bool,
}

fn train_line(run: &Run, j: usize, value: impl Fn(&super::TrainRecord) -> f64) -> Line {
    Line {
        name: Some(run.name.clone()),
        style: color(j).stroke_width(2),
        pts: run.metrics.train.iter().map(|r| (r.step as f64, value(r))).collect(),
        markers: false,
    }
}

/// One line per eval set of `run`, thin and with markers.
fn eval_lines(run: &Run, j: usize, value: impl Fn(&aerie_model::TttMetrics) -> f64) -> Vec<Line> {
    let mut sets: Vec<String> = run.metrics.eval.iter().map(|r| r.set.clone()).collect();
    sets.sort();
    sets.dedup();
    sets.iter()
        .map(|set| {
            let records = run.metrics.eval.iter().filter(|r| &r.set == set);
            let name = records.clone().next().map(|r| r.set_name()).unwrap_or_default();
            Line {
                name: Some(format!("{} (eval: {name})", run.name)),
                style: color(j).stroke_width(1),
                pts: records.map(|r| (r.step as f64, value(&r.metrics))).collect(),
                markers: true,
            }
        })
        .collect()
}

fn panels(runs: &[Run]) -> Vec<Panel> {
    let mut loss = Vec::new();
    let mut acc = Vec::new();
    let mut tau = Vec::new();
    let (mut lr, mut grad, mut speed) = (Vec::new(), Vec::new(), Vec::new());
    for (j, run) in runs.iter().enumerate() {
        loss.push(train_line(run, j, |r| r.loss));
        loss.extend(eval_lines(run, j, |m| m.loss));
        let k = run.metrics.train.iter().map(|r| r.acc_k.len()).max().unwrap_or(0);
        for step in 0..k {
            // Later unrolled steps fade: step 1 is the darkest line of its run.
            let opacity = 1.0 - 0.7 * step as f64 / k.max(2) as f64;
            acc.push(Line {
                name: (step == 0).then(|| run.name.clone()),
                style: color(j).mix(opacity).stroke_width(2),
                pts: run.metrics.train.iter().filter_map(|r| r.acc_k.get(step).map(|&a| (r.step as f64, a))).collect(),
                markers: false,
            });
        }
        tau.push(train_line(run, j, |r| r.accept_length));
        tau.extend(eval_lines(run, j, |m| m.simulated_accept_length));
        lr.push(train_line(run, j, |r| r.lr));
        grad.push(train_line(run, j, |r| r.grad_norm));
        speed.push(train_line(run, j, |r| r.tokens_per_s));
    }
    vec![
        Panel { title: "loss (train; eval with markers)", y_desc: "loss", lines: loss, legend_up: true },
        Panel {
            title: "teacher-forced accuracy per step (step 1 darkest)",
            y_desc: "accuracy",
            lines: acc,
            legend_up: false,
        },
        Panel {
            title: "simulated τ = 1 + Σ_k Π_{i≤k} acc_i", y_desc: "accept length", lines: tau, legend_up: false
        },
        Panel { title: "learning rate", y_desc: "lr", lines: lr, legend_up: true },
        Panel { title: "gradient norm (before clipping)", y_desc: "norm", lines: grad, legend_up: true },
        Panel { title: "tokens/s", y_desc: "real tokens per second", lines: speed, legend_up: false },
    ]
}

/// `lo..hi` padded by 5%, and widened around a flat line.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    let span = hi - lo;
    if span <= f64::EPSILON * hi.abs().max(1.0) {
        let d = (hi.abs() * 0.1).max(1e-9);
        return (lo - d, hi + d);
    }
    (lo - 0.05 * span, hi + 0.05 * span)
}

/// Tick labels with digits that suit the axis: learning rates need exponents, tokens none.
fn tick(v: f64, scale: f64) -> String {
    if scale >= 1000.0 {
        format!("{v:.0}")
    } else if scale >= 1.0 {
        format!("{v:.2}")
    } else if scale >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    }
}

fn draw_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Panel) -> DrawResult {
    let pts = || p.lines.iter().flat_map(|l| l.pts.iter()).filter(|(_, y)| y.is_finite());
    let (x0, x1) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &(x, _)| (a.min(x), b.max(x)));
    let (y0, y1) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &(_, y)| (a.min(y), b.max(y)));
    if !x0.is_finite() || !y0.is_finite() {
        return Ok(());
    }
    let (x0, x1) = padded(x0, x1);
    let (y0, y1) = padded(y0, y1);
    let scale = y1.abs().max(y0.abs());
    let mut chart = ChartBuilder::on(area)
        .caption(p.title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc("optimizer step")
        .y_desc(p.y_desc)
        // Steps are whole numbers: at most one label per step, so none repeats.
        .x_labels(((x1 - x0).floor() as usize + 1).clamp(2, 10))
        .x_label_formatter(&|x| if x.fract() == 0.0 { format!("{x:.0}") } else { format!("{x:.1}") })
        .y_label_formatter(&|y| tick(*y, scale))
        .label_style((FONT, 13))
        .draw()
        .map_err(text)?;
    for l in &p.lines {
        line(&mut chart, l.name.as_deref(), l.style, l.pts.clone(), l.markers)?;
    }
    legend(&mut chart, if p.legend_up { SeriesLabelPosition::UpperRight } else { SeriesLabelPosition::LowerRight })
}

struct Curves<'a>(&'a [Run]);

impl Figure for Curves<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
        root.fill(&WHITE).map_err(text)?;
        for (area, panel) in root.split_evenly((2, 3)).iter().zip(panels(self.0)) {
            draw_panel(area, &panel)?;
        }
        root.present().map_err(text)
    }
}
