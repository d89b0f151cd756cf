//! One module per subcommand: clap arguments, conversion into library options, one library call,
//! and the human or `--json` rendering of its result. Subcommand modules do not use each other;
//! what several of them take on the command line is in [`common`].

pub mod assets;
pub mod bench;
pub mod capture;
pub mod common;
pub mod compare;
pub mod data;
pub mod doctor;
pub mod eval;
pub mod export;
pub mod hub;
pub mod import;
pub mod inspect;
pub mod measure;
pub mod plot;
pub mod project;
pub mod quickstart;
pub mod regenerate;
pub mod shards;
pub mod train;
pub mod vocab;
