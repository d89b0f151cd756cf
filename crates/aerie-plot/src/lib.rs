//! aerie-plot: PNG and SVG charts with the same look everywhere, the drawing helpers behind
//! `aerie compare`'s acceptance and speedup plots (aerie-eval) and `aerie plot`'s training curves
//! (aerie-train). A crate of its own below both stages, because neither stage may use the other's
//! code, and charts are not data (aerie-data holds datasets and formats).
//!
//! Text on PNGs is rasterised by plotters' `ab_glyph` backend from DejaVu Sans embedded in the
//! binary (the `dejavu` crate), so images look the same on every machine and need neither system
//! fonts nor fontconfig; SVGs carry their text as text. PNGs are encoded with the `png` crate from
//! plotters' RGB buffer.

#![deny(missing_docs)]

use std::path::Path;
use std::sync::Once;

pub use plotters;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// A chart that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct Error {
    /// The PNG or SVG file.
    pub path: std::path::PathBuf,
    /// What failed.
    pub message: String,
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// The font family every chart names (DejaVu Sans on PNGs).
pub const FONT: &str = "sans-serif";

/// Line colours, one per candidate or run, in order (matplotlib's `tab10`, so charts read like
/// the ones people already know).
pub const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The colour of the `i`-th line (colours repeat after eight).
pub fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// What drawing returns: plotters' errors differ per backend, so they are carried as text.
pub type DrawResult = std::result::Result<(), String>;

/// A chart on linear f64 axes, the kind every panel here draws.
pub type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A drawing error as text (`map_err(text)` on any plotters call).
pub fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A picture that can be drawn on either backend ([`render`] picks one by file extension).
pub trait Figure {
    /// Draw on `root`, filling all of it.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult;
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A valid TrueType font shipped inside the `dejavu` crate; registration cannot fail on it.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

fn encode_png(size: (u32, u32), rgb: &[u8]) -> std::result::Result<Vec<u8>, png::EncodingError> {
    let mut bytes = Vec::new();
    let mut enc = png::Encoder::new(&mut bytes, size.0, size.1);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header()?;
    w.write_image_data(rgb)?;
    w.finish()?;
    Ok(bytes)
}

/// Write `bytes` to `path` whole or not at all, and never through a link: into a new file beside
/// it (`create_new`, which refuses an existing path, a planted symlink included), renamed over
/// `path` (a rename replaces a link at `path`; it does not follow it).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let fail = |e: std::io::Error| Error { path: path.to_path_buf(), message: e.to_string() };
    let name = path.file_name().ok_or_else(|| Error { path: path.to_path_buf(), message: "not a file name".into() })?;
    let tmp = path.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(fail)
}

/// Draw `figure` into `path`, a PNG or an SVG by its extension, `size` pixels.
pub fn render(path: &Path, size: (u32, u32), figure: &impl Figure) -> Result<()> {
    let fail = |message: String| Error { path: path.to_path_buf(), message: format!("cannot draw: {message}") };
    // Both backends lay text out with the registered font (SVG too, to measure it): a process
    // that draws only an SVG fails with `FontUnavailable` without this.
    register_font();
    match path.extension().and_then(|e| e.to_str()) {
        Some("png") => {
            let mut buf = vec![0u8; (size.0 * size.1 * 3) as usize];
            {
                let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
                figure.draw(&root).map_err(fail)?;
            }
            let png = encode_png(size, &buf).map_err(|e| Error { path: path.to_path_buf(), message: e.to_string() })?;
            write_atomic(path, &png)
        }
        Some("svg") => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
                figure.draw(&root).map_err(fail)?;
                root.present().map_err(|e| fail(e.to_string()))?;
            }
            write_atomic(path, svg.as_bytes())
        }
        _ => Err(Error { path: path.to_path_buf(), message: "plots are written as .png or .svg".into() }),
    }
}

/// One named line with a marker at each point (`markers`), in the legend under `name` when it
/// has one.
pub fn line<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    name: Option<&str>,
    style: ShapeStyle,
    pts: Vec<(f64, f64)>,
    markers: bool,
) -> DrawResult {
    let series = chart.draw_series(LineSeries::new(pts.clone(), style)).map_err(text)?;
    if let Some(name) = name {
        series.label(name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    if markers {
        let color = style.color;
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(text)?;
    }
    Ok(())
}

/// The legend box, in the corner the lines leave free.
pub fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>, position: SeriesLabelPosition) -> DrawResult {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Blank;

    impl Figure for Blank {
        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
            root.fill(&plotters::style::WHITE).map_err(text)
        }
    }

    /// A planted link at the output is replaced, never written through (issue 47: never write
    /// through a link), for both formats.
    #[cfg(unix)]
    #[test]
    fn a_link_at_the_output_is_replaced_not_followed() {
        let dir = std::env::temp_dir().join(format!("aerie-plot-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, magic) in [("chart.png", &b"\x89PNG"[..]), ("chart.svg", &b"<svg"[..])] {
            let victim = dir.join(format!("victim-{name}"));
            std::fs::write(&victim, b"precious").unwrap();
            let out = dir.join(name);
            let _ = std::fs::remove_file(&out);
            std::os::unix::fs::symlink(&victim, &out).unwrap();
            render(&out, (40, 30), &Blank).unwrap();
            assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "{name}: written through the link");
            assert!(std::fs::symlink_metadata(&out).unwrap().file_type().is_file(), "{name}");
            assert!(std::fs::read(&out).unwrap().starts_with(magic), "{name}");
        }
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "temporaries left: {leftovers:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_output_is_an_error_naming_it() {
        let out = std::env::temp_dir().join("aerie-plot-no-such-dir").join("x").join("chart.png");
        let err = render(&out, (40, 30), &Blank).unwrap_err();
        assert_eq!(err.path, out);
    }
}
