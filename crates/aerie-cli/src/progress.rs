//! Progress bars (indicatif) for long jobs: rate and ETA on stderr, hidden with `--json` output
//! consumers in mind only when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `total` items named `unit`.
pub fn bar(total: u64, what: &str, unit: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}, ETA {{eta}})"
        ))
        .expect("valid template"),
    );
    pb
}
