//! aerie-hub integration tests, one binary grouped by theme.

mod common;
mod inspect;
mod kimi;
mod mla;
mod published;
mod rope_export;
mod roundtrip;
mod speculators_load;
mod target;
mod validation;
