//! The `aerie-shard/1` and `/2` capture format end to end: write/read round trips in every dtype and
//! teacher kind, shard rotation, crash and resume, and every validation error, each naming the
//! file and tensor. Datasets are written under cargo's per-target tmp dir.

pub mod common;
mod encodings;
mod resume;
mod roundtrip;
mod validation;
