//! PNG and SVG plots of a comparison: acceptance by draft position per candidate, and
//! projected speedup against k with the break-even line S = 1; and the cost surface's heatmap
//! ([`surface_heatmap`]); drawn with the chart helpers of
//! [`aerie_plot`] (the same fonts, colours and legends as training's curves).

use std::path::Path;

use aerie_plot::plotters::coord::Shift;
use aerie_plot::plotters::prelude::*;
use aerie_plot::plotters::style::text_anchor::{HPos, Pos, VPos};
use aerie_plot::{DrawResult, FONT, Figure, color, legend, line, render, text as s};

use crate::Result;
use crate::surface::{Context, SurfaceCell};

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

/// What a surface heatmap colours each (k, concurrency) cell by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceMetric {
    /// The measured speedup (white at 1, green above, red below).
    Speedup,
    /// The break-even τ, cycle / T_d (green low: easy to pay; red high).
    BreakEven,
}

/// The cell's colour: white where the metric says "even", green where speculation pays or
/// pays easily, red where it does not.
fn heat(metric: SurfaceMetric, v: f64) -> RGBColor {
    // Signed distance from even, -1 (worst) ..= 1 (best).
    let d = match metric {
        SurfaceMetric::Speedup => ((v - 1.0) / 0.5).clamp(-1.0, 1.0),
        SurfaceMetric::BreakEven => ((2.0 - v) / 1.5).clamp(-1.0, 1.0),
    };
    let (to, t) = if d >= 0.0 { ((44.0, 160.0, 44.0), d) } else { ((214.0, 39.0, 40.0), -d) };
    let mix = |a: f64| (255.0 + (a - 255.0) * t).round() as u8;
    RGBColor(mix(to.0), mix(to.1), mix(to.2))
}

fn heat_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    context: Context,
    cells: &[&SurfaceCell],
    metric: SurfaceMetric,
) -> DrawResult {
    let mut ks: Vec<usize> = cells.iter().map(|c| c.k).collect();
    let mut cs: Vec<usize> = cells.iter().map(|c| c.concurrency).collect();
    ks.sort_unstable();
    ks.dedup();
    cs.sort_unstable();
    cs.dedup();
    let what = match metric {
        SurfaceMetric::Speedup => "measured speedup",
        SurfaceMetric::BreakEven => "break-even τ = cycle / T_d",
    };
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{what}, {context} context"), (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((0..ks.len() as i32).into_segmented(), (0..cs.len() as i32).into_segmented())
        .map_err(s)?;
    let label = |v: &SegmentValue<i32>, of: &[usize]| match v {
        SegmentValue::CenterOf(i) => of.get(*i as usize).map_or(String::new(), |x| x.to_string()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("draft steps k")
        .y_desc("concurrency")
        .x_labels(ks.len() + 1)
        .y_labels(cs.len() + 1)
        .x_label_formatter(&|v| label(v, &ks))
        .y_label_formatter(&|v| label(v, &cs))
        .label_style((FONT, 14))
        .draw()
        .map_err(s)?;
    for c in cells {
        let i = ks.iter().position(|&k| k == c.k).unwrap_or(0) as i32;
        let j = cs.iter().position(|&x| x == c.concurrency).unwrap_or(0) as i32;
        let (value, text) = match (metric, c.speedup) {
            (SurfaceMetric::Speedup, Some(sp)) => (sp, format!("{sp:.2}×  τ* {:.2}", c.break_even_tau)),
            _ => (c.break_even_tau, format!("τ* {:.2}", c.break_even_tau)),
        };
        let corner = |a: i32, b: i32| (SegmentValue::Exact(a), SegmentValue::Exact(b));
        chart
            .draw_series([Rectangle::new([corner(i, j), corner(i + 1, j + 1)], heat(metric, value).filled())])
            .map_err(s)?;
        let style = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
        chart
            .draw_series([Text::new(text, (SegmentValue::CenterOf(i), SegmentValue::CenterOf(j)), style)])
            .map_err(s)?;
    }
    Ok(())
}

struct Heatmap<'a>(&'a [SurfaceCell], SurfaceMetric);

impl Figure for Heatmap<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
        root.fill(&WHITE).map_err(s)?;
        let mut contexts: Vec<Context> = self.0.iter().map(|c| c.context).collect();
        contexts.sort_unstable();
        contexts.dedup();
        let panels = root.split_evenly((1, contexts.len().max(1)));
        for (area, ctx) in panels.iter().zip(&contexts) {
            let cells: Vec<&SurfaceCell> = self.0.iter().filter(|c| c.context == *ctx).collect();
            heat_panel(area, *ctx, &cells, self.1)?;
        }
        root.present().map_err(s)
    }
}

/// The cost surface as a heatmap over k × concurrency, one panel per prompt length: each cell
/// coloured by its measured speedup where every cell has one, else by its break-even τ (τ*),
/// which is written in every cell either way.
pub fn surface_heatmap(cells: &[SurfaceCell], path: &Path) -> Result<()> {
    if cells.is_empty() {
        return Err(crate::Error::Report(format!(
            "{}: no cell to draw (the surface holds no measured cycle)",
            path.display()
        )));
    }
    let metric =
        if cells.iter().all(|c| c.speedup.is_some()) { SurfaceMetric::Speedup } else { SurfaceMetric::BreakEven };
    let panels = cells.iter().map(|c| c.context).collect::<std::collections::BTreeSet<_>>().len() as u32;
    Ok(render(path, (520 * panels.max(1), 420), &Heatmap(cells, metric))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::surface::SurfacePoint;

    #[test]
    fn a_surface_heatmap_is_drawn() {
        let mut points = Vec::new();
        for (c, t_d) in [(1, 12.1), (4, 14.0), (16, 20.0)] {
            for ctx in [Context::Short, Context::Long] {
                let mut p = SurfacePoint::plain(c, ctx, t_d);
                p.add(1, t_d * 1.5, Some(1.6), Some(1.05));
                p.add(2, t_d * 2.1, Some(2.0), Some(0.95));
                points.push(p);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        for name in ["s.png", "s.svg"] {
            let path = dir.path().join(name);
            surface_heatmap(&crate::surface::cells(&points), &path).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > 1000, "{name}");
        }
        assert!(heat(SurfaceMetric::Speedup, 1.0) == RGBColor(255, 255, 255));
        assert!(surface_heatmap(&[], &dir.path().join("e.png")).is_err());
    }
}
