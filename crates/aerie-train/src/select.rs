//! Choosing the checkpoint by decoded τ (`[select]`; NeMo Automodel's `decode_eval`): every
//! `select.every_steps` steps and after the last, the current drafter decodes held-out prompts
//! greedily against the native target, its τ goes into `metrics.jsonl` (`kind: "select"`), and
//! the best drafter so far is kept as `RUN/best/` with `best/selection.json` (its τ, step and
//! what was decoded).
//!
//! The decoder lives in aerie-eval, which this crate may not depend on (the crates' layering):
//! the caller hands [`crate::RunOptions::selector`] a [`Selector`] (the `aerie train` command
//! builds one from aerie-eval's `DecodeSession`), and this module does the bookkeeping.
//!
//! `best/` is replaced atomically: written into `best.tmp/`, the old one renamed to `best.old/`,
//! the new one renamed into place, the old one removed; a start after a kill between the renames
//! puts `best.old/` back. A resumed run reads `best/selection.json` and keeps choosing against
//! its τ, refusing one chosen under another config or other decode settings.

use std::path::{Path, PathBuf};

use aerie_data::atomic::sync_dir;
use aerie_model::Drafter;
use aerie_model::checkpoint::{SaveOptions, SourceLayout, save_drafter};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::checkpoint::drafter_checkpoint;
use crate::config::SelectConfig;
use crate::{Error, Result};

/// `format` of `best/selection.json`.
pub const SELECTION_FORMAT: &str = "aerie-select/1";
const SELECTION_FILE: &str = "selection.json";

/// Decodes held-out prompts with a drafter and says its τ.
pub trait Selector<B: Backend>: std::fmt::Debug {
    /// τ (accept length, bonus included) of greedy speculative decoding with `drafter` (in its
    /// training layout, on the main device), and what the decode covered; an error message
    /// otherwise.
    fn decoded_tau(&self, drafter: Drafter<B>) -> std::result::Result<Decoded, String>;
}

/// What one selection decode measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Decoded {
    /// Accept length: tokens per verify cycle, bonus included.
    pub tau: f64,
    /// Answers decoded (prompts × turns).
    pub answers: usize,
    /// Verify cycles.
    pub cycles: usize,
    /// Wall seconds of the decode.
    pub seconds: f64,
}

/// A `kind: "select"` line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectRecord {
    /// `select`.
    pub kind: String,
    /// Optimizer steps done.
    pub step: u64,
    /// What the decode measured.
    #[serde(flatten)]
    pub decoded: Decoded,
    /// The best τ so far, this one included, and its step.
    pub best_tau: f64,
    /// The step of `best/`.
    pub best_step: u64,
}

/// `best/selection.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// [`SELECTION_FORMAT`].
    pub format: String,
    /// The optimizer step of the weights in `best/`.
    pub step: u64,
    /// What decoding them measured.
    #[serde(flatten)]
    pub decoded: Decoded,
    /// The decode settings (`[select]` without `every_steps`): τ under other settings is not
    /// comparable.
    pub settings: serde_json::Value,
    /// The run's config hash (its result-affecting keys).
    pub config_hash: String,
}

/// The decode settings τ depends on.
pub fn settings(cfg: &SelectConfig) -> serde_json::Value {
    let mut v = serde_json::to_value(cfg).expect("a SelectConfig serialises");
    if let Some(o) = v.as_object_mut() {
        o.remove("every_steps");
    }
    v
}

/// `RUN/best`.
pub fn best_dir(run: &Path) -> PathBuf {
    run.join("best")
}

fn select_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), message: message.into() }
}

/// Finish or undo a replacement of `best/` that a kill interrupted, and read the selection there
/// is, refused when it was made under another config or other decode settings.
pub fn resume_best(run: &Path, cfg: &SelectConfig, config_hash: &str) -> Result<Option<Selection>> {
    let (best, tmp, old) = (best_dir(run), run.join("best.tmp"), run.join("best.old"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    if old.exists() {
        if best.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
        } else {
            std::fs::rename(&old, &best).map_err(|e| Error::io(&best, e))?;
        }
    }
    let path = best.join(SELECTION_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let sel: Selection =
        serde_json::from_str(&text).map_err(|e| select_err(&path, format!("not a selection record: {e}")))?;
    if sel.format != SELECTION_FORMAT {
        return Err(select_err(&path, format!("format `{}`, this build reads {SELECTION_FORMAT}", sel.format)));
    }
    let why = if sel.config_hash != config_hash {
        Some("another training config")
    } else if sel.settings != settings(cfg) {
        Some("other [select] settings")
    } else {
        None
    };
    if let Some(why) = why {
        return Err(select_err(
            &path,
            format!(
                "best/ was chosen under {why} than this run's, so its τ is not comparable: move {} away, or \
                 restore the settings it records",
                best.display()
            ),
        ));
    }
    Ok(Some(sel))
}

/// Write `drafter` as `RUN/best/` with `selection` beside its weights, replacing the old best
/// atomically (see the module doc).
pub fn write_best<B: Backend>(
    run: &Path,
    drafter: &Drafter<B>,
    source: Option<&SourceLayout>,
    selection: &Selection,
) -> Result<PathBuf> {
    let (best, tmp, old) = (best_dir(run), run.join("best.tmp"), run.join("best.old"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    let ckpt = drafter_checkpoint(drafter, source);
    let opts = SaveOptions {
        dialect: ckpt.dialect,
        dtype: Some(ckpt.weight_dtype),
        include_embedding: false,
        overwrite: false,
    };
    let written = save_drafter(&ckpt, &tmp, &opts).map_err(Error::from).and_then(|_| {
        let json = serde_json::to_string_pretty(selection).expect("a selection serialises");
        let path = tmp.join(SELECTION_FILE);
        aerie_data::atomic::write_bytes(&path, json.as_bytes())?;
        Ok(sync_dir(&tmp)?)
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(select_err(&best, format!("cannot write the best drafter: {e}")));
    }
    if best.exists() {
        std::fs::rename(&best, &old).map_err(|e| Error::io(&old, e))?;
    }
    std::fs::rename(&tmp, &best).map_err(|e| Error::io(&best, e))?;
    sync_dir(run)?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aerie_model::checkpoint::{Dtype, load_drafter, synthetic};

    fn selection(step: u64, tau: f64, cfg: &SelectConfig) -> Selection {
        Selection {
            format: SELECTION_FORMAT.into(),
            step,
            decoded: Decoded { tau, answers: 2, cycles: 10, seconds: 0.5 },
            settings: settings(cfg),
            config_hash: "h".into(),
        }
    }

    #[test]
    fn best_is_replaced_atomically_and_read_back() {
        let run = tempfile::tempdir().unwrap();
        let cfg = SelectConfig {
            every_steps: 5,
            prompts: "p.jsonl".into(),
            k: 2,
            max_new_tokens: 8,
            max_prompts: None,
            target: None,
            template: "auto".into(),
        };
        let dc = synthetic::tiny_config();
        let d = |seed| {
            let t = synthetic::random_drafter(&dc, Dtype::F32, seed).tensors;
            Drafter::<burn::backend::Flex>::from_tensors(&dc, &t, &Default::default()).unwrap()
        };
        write_best(run.path(), &d(1), None, &selection(5, 1.5, &cfg)).unwrap();
        write_best(run.path(), &d(2), None, &selection(10, 1.7, &cfg)).unwrap();
        let sel = resume_best(run.path(), &cfg, "h").unwrap().unwrap();
        assert_eq!((sel.step, sel.decoded.tau), (10, 1.7));
        assert!(load_drafter(&best_dir(run.path()), None).is_ok());
        assert!(!run.path().join("best.tmp").exists() && !run.path().join("best.old").exists());
        // A kill between the two renames: best.old is put back.
        std::fs::rename(best_dir(run.path()), run.path().join("best.old")).unwrap();
        assert_eq!(resume_best(run.path(), &cfg, "h").unwrap().unwrap().step, 10);
        // Other settings or another config: refused, naming the file.
        let other = SelectConfig { k: 3, ..cfg.clone() };
        let e = resume_best(run.path(), &other, "h").unwrap_err().to_string();
        assert!(e.contains("selection.json") && e.contains("[select] settings"), "{e}");
        let e = resume_best(run.path(), &cfg, "other").unwrap_err().to_string();
        assert!(e.contains("training config"), "{e}");
        // A different every_steps still compares.
        let every = SelectConfig { every_steps: 1, ..cfg };
        assert!(resume_best(run.path(), &every, "h").unwrap().is_some());
    }
}
