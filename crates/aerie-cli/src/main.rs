//! `aerie`: fine-tune EAGLE-3 drafters and measure whether they make a serving engine faster.
//!
//! The binary is thin: each subcommand turns its flags into a library call of one pipeline
//! crate. Only `main` maps errors to exit codes (1 for errors, 2 for lint failures reported by
//! `inspect`, clap's 2 for usage errors).

mod cmd;
mod device;
mod progress;

use clap::{Parser, Subcommand};

/// Fine-tune EAGLE-3 draft models and measure, honestly, whether they make serving faster.
#[derive(Debug, Parser)]
#[command(name = "aerie", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Evaluate a drafter.
    #[command(subcommand)]
    Eval(cmd::eval::EvalCommand),
    /// Measure throughput and memory.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Eval(c) => cmd::eval::run(c).map(|()| 0),
        Command::Bench(c) => cmd::bench::run(c).map(|()| 0),
    }
}

fn main() {
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            1
        }
    };
    std::process::exit(code);
}
