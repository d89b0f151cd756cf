//! Progress bars (indicatif) for long jobs: rate and ETA on stderr, hidden with `--json` output
//! consumers in mind only when stderr is not a terminal. Byte bars of downloads, one per file,
//! too ([`FileBars`]).

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

/// One byte bar per file, replaced when the next file starts.
#[derive(Default)]
pub(crate) struct FileBars {
    current: Option<(String, ProgressBar)>,
}

impl FileBars {
    pub(crate) fn update(&mut self, file: &str, done: u64, total: u64) {
        if self.current.as_ref().is_none_or(|(f, _)| f != file) {
            self.finish();
            let pb = ProgressBar::new(total);
            pb.set_style(
                ProgressStyle::with_template(
                    "{msg} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
                )
                .expect("valid template"),
            );
            pb.set_message(file.to_owned());
            self.current = Some((file.to_owned(), pb));
        }
        if let Some((_, pb)) = &self.current {
            pb.set_length(total);
            pb.set_position(done);
        }
    }

    pub(crate) fn finish(&mut self) {
        if let Some((_, pb)) = self.current.take() {
            pb.finish_and_clear();
        }
    }
}
