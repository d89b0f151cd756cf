//! One module per subcommand: clap arguments, conversion into library options, one library call,
//! and the human or `--json` rendering of its result.

pub mod bench;
pub mod eval;
