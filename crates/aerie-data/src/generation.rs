//! Prompts for generation: a conversation so far, rendered with the model's chat template and
//! `add_generation_prompt` (as transformers' `apply_chat_template(..., add_generation_prompt=True)`
//! then `tokenizer(text, add_special_tokens=False)`), the ids the target continues from; and the
//! ids it stops at. Shared by speculative decoding (`aerie eval decode`) and self-distillation
//! (`aerie regenerate`), so both feed the target exactly what serving would.

use std::path::Path;

use crate::conversation::Message;
use crate::template::{ChatTemplate, TemplateChoice};
use crate::tokenizer::TokenizerFiles;
use crate::{Error, Result};

/// A tokenizer directory's chat template and tokenizer, ready to encode generation prompts.
pub struct PromptEncoder {
    files: TokenizerFiles,
    template: ChatTemplate,
}

impl std::fmt::Debug for PromptEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptEncoder").field("files", &self.files).field("template", &self.template.name()).finish()
    }
}

impl PromptEncoder {
    /// Load the tokenizer of `dir` (a model directory) and resolve its chat template.
    pub fn load(dir: &Path, template: &TemplateChoice) -> Result<Self> {
        let files = TokenizerFiles::load(dir)?;
        let template = ChatTemplate::resolve(template, &files)?;
        Ok(Self { files, template })
    }

    /// The loaded tokenizer files.
    pub fn files(&self) -> &TokenizerFiles {
        &self.files
    }

    /// The chat template's name.
    pub fn template_name(&self) -> &str {
        self.template.name()
    }

    /// Token ids of `messages` followed by the assistant's generation prompt.
    pub fn encode(&self, messages: &[Message]) -> Result<Vec<u32>> {
        let text = self.template.render(messages, true)?;
        let enc = self.files.tokenizer.encode(text.as_str(), false).map_err(|e| self.error(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of generated `ids`, special tokens (the stop token) left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.files.tokenizer.decode(ids, true).map_err(|e| self.error(e))
    }

    /// Ids generation stops at: the model's `eos_token_id`(s) plus the tokenizer's `eos_token`
    /// (chat models end a turn with a token that `config.json` often does not list, such as
    /// ChatML's `<|im_end|>`), deduplicated in that order.
    pub fn stop_ids(&self, model_eos: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        let tokenizer_eos = self
            .files
            .special_tokens()
            .get("eos_token")
            .and_then(|v| v.as_str().map(str::to_owned))
            .and_then(|s| self.files.tokenizer.token_to_id(&s));
        for id in model_eos.iter().copied().chain(tokenizer_eos) {
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }

    fn error(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer { path: self.files.file(), message: e.to_string() }
    }
}
