//! PNG and SVG plots of a comparison: acceptance by draft position per candidate, and
//! projected speedup against k with the break-even line S = 1, drawn with the chart helpers of
//! [`aerie_plot`] (the same fonts, colours and legends as training's curves).

use std::path::Path;

use aerie_plot::plotters::coord::Shift;
use aerie_plot::plotters::prelude::*;
use aerie_plot::{DrawResult, FONT, Figure, color, legend, line, render, text as s};

use crate::Result;

/// One candidate's curves.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend name.
    pub name: String,
    /// α_i, i = 1..=K.
    pub conditional: Vec<f64>,
    /// r_i, i = 1..=K.
    pub unconditional: Vec<f64>,
    /// (k, S(k)) points.
    pub speedup: Vec<(usize, f64)>,
}

fn rate_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    series: &[(String, Vec<f64>)],
) -> DrawResult {
    let k = series.iter().map(|(_, v)| v.len()).max().unwrap_or(1).max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.5f64..k as f64 + 0.5, 0f64..1.05f64)
        .map_err(s)?;
    chart
        .configure_mesh()
        .x_desc("draft position i")
        .y_desc("acceptance rate")
        .x_labels(k)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(s)?;
    for (j, (name, values)) in series.iter().enumerate() {
        let pts = values.iter().enumerate().map(|(i, &v)| ((i + 1) as f64, v)).collect();
        line(&mut chart, Some(name), color(j).stroke_width(2), pts, true)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn draw_acceptance<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, series: &[Series]) -> DrawResult {
    root.fill(&WHITE).map_err(s)?;
    let (w, _) = root.dim_in_pixel();
    let (left, right) = root.split_horizontally(w / 2);
    let cond: Vec<(String, Vec<f64>)> = series.iter().map(|c| (c.name.clone(), c.conditional.clone())).collect();
    let uncond: Vec<(String, Vec<f64>)> = series.iter().map(|c| (c.name.clone(), c.unconditional.clone())).collect();
    rate_panel(&left, "conditional α_i = P(accept i | 1..i-1 accepted)", &cond)?;
    rate_panel(&right, "unconditional r_i = P(at least i accepted)", &uncond)?;
    root.present().map_err(s)
}

fn draw_speedup<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, series: &[Series], costs_name: &str) -> DrawResult {
    root.fill(&WHITE).map_err(s)?;
    let kmax = series.iter().flat_map(|c| c.speedup.iter().map(|p| p.0)).max().unwrap_or(1).max(1);
    let kmin = series.iter().flat_map(|c| c.speedup.iter().map(|p| p.0)).min().unwrap_or(1).min(kmax);
    let smax = series.iter().flat_map(|c| c.speedup.iter().map(|p| p.1)).fold(1.0f64, f64::max);
    let title = format!("projected speedup S(k) = τ(k)·T_d / cycle(k)  [{costs_name}]");
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(kmin as f64 - 0.5..kmax as f64 + 0.5, 0f64..smax * 1.15)
        .map_err(s)?;
    chart
        .configure_mesh()
        .x_desc("draft steps k")
        .y_desc("S (throughput vs no speculation)")
        .x_labels(kmax - kmin + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(s)?;
    let even = [(kmin as f64 - 0.5, 1.0), (kmax as f64 + 0.5, 1.0)];
    chart
        .draw_series(DashedLineSeries::new(even, 8, 6, BLACK.stroke_width(2)))
        .map_err(s)?
        .label("break-even (S = 1)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    for (j, c) in series.iter().enumerate() {
        let pts = c.speedup.iter().map(|&(k, v)| (k as f64, v)).collect();
        line(&mut chart, Some(&c.name), color(j).stroke_width(2), pts, true)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(s)
}

struct Acceptance<'a>(&'a [Series]);

impl Figure for Acceptance<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
        draw_acceptance(root, self.0)
    }
}

struct Speedup<'a>(&'a [Series], &'a str);

impl Figure for Speedup<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
        draw_speedup(root, self.0, self.1)
    }
}

/// Conditional and unconditional acceptance by draft position, one line per candidate.
pub fn acceptance(series: &[Series], path: &Path) -> Result<()> {
    Ok(render(path, (1100, 460), &Acceptance(series))?)
}

/// Projected speedup S(k) per candidate, with the break-even line S = 1.
pub fn speedup(series: &[Series], costs_name: &str, path: &Path) -> Result<()> {
    Ok(render(path, (800, 480), &Speedup(series, costs_name))?)
}
