//! PNG and SVG plots of a comparison (plotters): acceptance by draft position per candidate, and
//! projected speedup against k with the break-even line S = 1.
//!
//! Text on PNGs is rasterised by plotters' `ab_glyph` backend from DejaVu Sans embedded in the
//! binary (the `dejavu` crate), so images look the same on every machine and need neither system
//! fonts nor fontconfig; SVGs carry their text as text. PNGs are encoded with the `png` crate from
//! plotters' RGB buffer.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::{Error, Result};

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

const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

type DrawResult = std::result::Result<(), String>;

/// A chart on linear f64 axes, the kind every panel here draws.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A valid TrueType font shipped inside the `dejavu` crate; registration cannot fail on it.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

fn write_png(path: &Path, size: (u32, u32), rgb: &[u8]) -> Result<()> {
    let report = |e: png::EncodingError| Error::Report(format!("{}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), size.0, size.1);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(report)?;
    w.write_image_data(rgb).map_err(report)?;
    w.finish().map_err(report)
}

/// Draw with `$draw(&root)` on a PNG or SVG backend chosen by the extension of `$path`.
macro_rules! render {
    ($path:expr, $size:expr, $draw:expr) => {{
        let path: &Path = $path;
        let size: (u32, u32) = $size;
        let fail = |e: String| Error::Report(format!("{}: cannot draw: {e}", path.display()));
        match path.extension().and_then(|e| e.to_str()) {
            Some("png") => {
                register_font();
                let mut buf = vec![0u8; (size.0 * size.1 * 3) as usize];
                {
                    let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
                    $draw(&root).map_err(fail)?;
                }
                write_png(path, size, &buf)
            }
            Some("svg") => {
                let root = SVGBackend::new(path, size).into_drawing_area();
                $draw(&root).map_err(fail)
            }
            _ => Err(Error::Report(format!("{}: plots are written as .png or .svg", path.display()))),
        }
    }};
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
        draw_candidate(&mut chart, name, COLORS[j % COLORS.len()], pts)?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// One candidate's line with a marker at each point, named in the legend.
fn draw_candidate<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    name: &str,
    color: RGBColor,
    pts: Vec<(f64, f64)>,
) -> DrawResult {
    chart
        .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
        .map_err(s)?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(s)?;
    Ok(())
}

/// The legend box, in the corner the lines leave free.
fn draw_legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>, position: SeriesLabelPosition) -> DrawResult {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(s)
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
        draw_candidate(&mut chart, &c.name, COLORS[j % COLORS.len()], pts)?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(s)
}

/// Conditional and unconditional acceptance by draft position, one line per candidate.
pub fn acceptance(series: &[Series], path: &Path) -> Result<()> {
    render!(path, (1100, 460), |root| draw_acceptance(root, series))
}

/// Projected speedup S(k) per candidate, with the break-even line S = 1.
pub fn speedup(series: &[Series], costs_name: &str, path: &Path) -> Result<()> {
    render!(path, (800, 480), |root| draw_speedup(root, series, costs_name))
}
