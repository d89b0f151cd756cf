//! aerie-hub integration tests, one binary grouped by theme.

mod common;
mod inspect;
mod kimi;
mod roundtrip;
mod target;
mod validation;
