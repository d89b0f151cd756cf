//! Chat data preparation, end to end: readers (ShareGPT JSON, JSONL, parquet), normalisation and
//! drop reasons, chat templates, loss masks, prepared datasets and draft vocabularies. Fixtures
//! are written into temp directories; the tokenizer is a tiny byte-level BPE built in the test.

pub mod common;
mod kimi_masks;
mod kimi_templates;
mod kimi_tokenizer;
mod kimi_tools_ts;
mod mask;
mod normalize;
mod prepare;
mod readers;
mod real_assets;
mod templates;
mod vocab;
