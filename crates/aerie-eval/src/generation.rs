//! `aerie bench generate`: the native target's batched greedy generation
//! ([`aerie_model::native::bench`]) on the first turns of a prompt file ([`crate::prompts`]),
//! each rendered with the target's chat template and tokenizer, as `aerie eval decode` renders
//! them.

use std::path::Path;

use aerie_data::template::{ChatTemplate, TemplateChoice};
use aerie_data::tokenizer::TokenizerFiles;
use aerie_model::TargetModel;
use aerie_model::native::bench::{GenerateBench, bench_generate, check_options};
use burn::backend::Flex;

use crate::prompts::read_prompts;
use crate::{Error, Result};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateBenchOptions {
    /// Batch sizes to measure, in order (batch 1, when present, is the reference of identity).
    pub batch: Vec<usize>,
    /// Prompts generated per batch size (default: the largest batch size); the file's prompts
    /// repeat when it holds fewer.
    pub num_prompts: Option<usize>,
    /// New tokens per prompt (eos ignored, so every run decodes the same tokens).
    pub max_new_tokens: usize,
}

/// Load the target in `target_dir` (CPU), render the first turn of `prompts`' prompts, and
/// measure its batched generation at every batch size of `opts`.
pub fn bench_generate_prompts(target_dir: &Path, prompts: &Path, opts: &GenerateBenchOptions) -> Result<GenerateBench> {
    check_options(&opts.batch, opts.max_new_tokens)?;
    let device = Default::default();
    let target = TargetModel::<Flex>::load(target_dir, &device)
        .map_err(|e| Error::step(format!("loading target {}", target_dir.display()), e))?;
    let tok = TokenizerFiles::load(target_dir)?;
    let template = ChatTemplate::resolve(&TemplateChoice::Auto, &tok)?;
    let n = opts.num_prompts.unwrap_or_else(|| opts.batch.iter().copied().max().unwrap_or(1));
    let read = read_prompts(prompts)?;
    if read.is_empty() {
        return Err(Error::Input { path: prompts.to_path_buf(), message: "no prompts".into() });
    }
    let ids: Vec<Vec<u32>> = read
        .iter()
        .cycle()
        .take(n)
        .map(|p| {
            let text = template.render(&p.context, true)?;
            let encoding = tok.tokenizer.encode(text.as_str(), false).map_err(|e| Error::Input {
                path: target_dir.to_path_buf(),
                message: format!("prompt {}: the tokenizer failed: {e}", p.id),
            })?;
            Ok(encoding.get_ids().to_vec())
        })
        .collect::<Result<_>>()?;
    Ok(bench_generate(&target, target_dir.to_path_buf(), &ids, &opts.batch, opts.max_new_tokens)?)
}
