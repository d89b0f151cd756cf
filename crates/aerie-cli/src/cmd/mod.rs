//! One module per subcommand: clap arguments, conversion into library options, one library call,
//! and the human or `--json` rendering of its result.

pub mod accept;
pub mod assets;
pub mod bench;
pub mod capture;
pub mod compare;
pub mod data;
pub mod decode;
pub mod eval;
pub mod export;
pub mod hub;
pub mod import;
pub mod inspect;
pub mod measure;
pub mod project;
pub mod quickstart;
pub mod regenerate;
pub mod train;
pub mod vocab;
