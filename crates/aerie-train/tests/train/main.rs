//! aerie-train integration tests, grouped by theme, on a tiny synthetic capture (CPU, burn-flex).

mod common;

mod anchor;
mod config;
mod curves;
mod dp;
mod mla;
mod nan;
mod replay;
mod resume;
mod select;
mod throughput;
mod training;
mod warm_start;
