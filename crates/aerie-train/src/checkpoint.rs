//! Training checkpoints. `RUN/checkpoint-<step>/` is a drafter directory any aerie command (and
//! SGLang) loads: `config.json` + `model.safetensors` in the SGLang dialect, float32, no
//! embedding. Beside them `training_state/` holds what an exact resume needs:
//!
//! - `optimizer.mpk`: burn's `Optimizer::to_record()` (AdamW moments and step counts, keyed by
//!   the stable parameter ids of [`crate::grads::with_stable_ids`]), written with
//!   `NamedMpkFileRecorder<FullPrecisionSettings>` (float32 stays float32);
//! - `state.json`: [`TrainingState`] (step, data position, the PRNG state of the epoch order,
//!   the config hash);
//! - `config.toml`: the run's config.
//!
//! A checkpoint is written into `ckpt-<step>.tmp/` and renamed into place, `state.json` last: a
//! process killed at any moment leaves either the complete checkpoint or a `.tmp` directory that
//! the next start removes.

use std::path::{Path, PathBuf};

use aerie_model::Drafter;
use aerie_model::checkpoint::{Dialect, DrafterCheckpoint, Dtype, SaveOptions, SourceLayout, save_drafter};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};

use crate::data::DataIdentity;
use crate::step::{OptimRecord, Trainer};
use aerie_data::atomic::sync_dir;

use crate::{Error, Result};

/// `format` of `state.json`.
pub const STATE_FORMAT: &str = "aerie-train-state/1";
const STATE_DIR: &str = "training_state";
const STATE_FILE: &str = "state.json";
const OPTIM_FILE: &str = "optimizer";
const CONFIG_FILE: &str = "config.toml";
const PREFIX: &str = "checkpoint-";

/// Where a run stands, saved with every checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingState {
    /// [`STATE_FORMAT`].
    pub format: String,
    /// Optimizer steps done (the scheduler position).
    pub step: u64,
    /// Epoch of the next micro-batch.
    pub epoch: u64,
    /// Micro-batches of `epoch` already consumed.
    pub cursor: usize,
    /// The PRNG state that orders `epoch` (a pure function of seed and epoch; recorded so a
    /// resume can check it reproduces the same order).
    pub epoch_rng_state: u64,
    /// Steps of the whole run (the schedule's length).
    pub total_steps: u64,
    /// Micro-batches per optimizer step (grad_accumulation × replicas).
    pub micro_per_step: usize,
    /// sha256 of the config's result-affecting keys.
    pub config_hash: String,
    /// Real tokens trained on so far.
    pub tokens: f64,
    /// Padded tokens (B·Lmax) so far.
    pub padded_tokens: f64,
    /// Wall-clock seconds of training so far, over all segments of the run.
    pub elapsed_s: f64,
    /// aerie version that wrote it.
    pub aerie_version: String,
    /// The datasets trained on, which a resume must find unchanged (absent in states written
    /// before it was recorded: those resume unchecked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<DataIdentity>,
    /// An anchored run's θ₀ checksum ([`crate::grads::weights_checksum`] of the warm start's
    /// weights): a resume reloads θ₀ from the warm start and refuses one whose weights changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_checksum: Option<u64>,
}

fn ckpt_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), message: message.into() }
}

/// `RUN/checkpoint-<step>`.
pub fn checkpoint_dir(run: &Path, step: u64) -> PathBuf {
    run.join(format!("{PREFIX}{step}"))
}

fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix(PREFIX)?.parse().ok()
}

/// Complete checkpoints of `run` (those with `training_state/state.json`), oldest first.
pub fn list_checkpoints(run: &Path) -> Result<Vec<(u64, PathBuf)>> {
    if !run.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(run).map_err(|e| Error::io(run, e))? {
        let entry = entry.map_err(|e| Error::io(run, e))?;
        let name = entry.file_name();
        if let Some(step) = name.to_str().and_then(step_of)
            && entry.path().join(STATE_DIR).join(STATE_FILE).is_file()
        {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The newest complete checkpoint of `run`.
pub fn latest_checkpoint(run: &Path) -> Result<Option<(u64, PathBuf)>> {
    Ok(list_checkpoints(run)?.pop())
}

/// Remove what an interrupted save left behind (`ckpt-*.tmp/` and the drafter writer's
/// `.ckpt-*` temporaries).
pub fn clean_partial(run: &Path) -> Result<()> {
    if !run.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(run).map_err(|e| Error::io(run, e))? {
        let entry = entry.map_err(|e| Error::io(run, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if (name.starts_with("ckpt-") && name.ends_with(".tmp")) || name.starts_with(".ckpt-") {
            let p = entry.path();
            let r = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| Error::io(path, e))
}

/// A drafter's weights as a checkpoint saves them: the SGLang dialect, float32, and the layout of
/// the drafter the run started from (kept only where its layout is the checkpoint's, SGLang: the
/// published Kimi drafters').
pub fn drafter_checkpoint<Bk: Backend>(model: &Drafter<Bk>, source: Option<&SourceLayout>) -> DrafterCheckpoint {
    DrafterCheckpoint {
        config: model.config().clone(),
        dialect: Dialect::Sglang,
        weight_dtype: Dtype::F32,
        tensors: model.to_tensors(Dtype::F32),
        dir: PathBuf::new(),
        source: source.cloned(),
    }
}

/// Write `RUN/checkpoint-<state.step>/` atomically; returns its path.
pub fn save<B: AutodiffBackend>(
    run: &Path,
    trainer: &Trainer<B>,
    state: &TrainingState,
    config_toml: &str,
    source: Option<&SourceLayout>,
) -> Result<PathBuf> {
    let step = state.step;
    // Data parallelism: the replicas must still hold one set of weights (only the main one's is
    // saved, and a resume copies it into all of them), checked before anything is written.
    trainer.check_replicas_agree().map_err(|m| ckpt_err(&checkpoint_dir(run, step), m))?;
    let tmp = run.join(format!("ckpt-{step}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    // A failed save (disk full, say) leaves nothing behind: the half-written directory would
    // hold tens of MB of the space the next save needs.
    let dst = checkpoint_dir(run, step);
    if let Err(e) = write_checkpoint(trainer, state, config_toml, source, &tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(ckpt_err(
            &dst,
            format!(
                "cannot save it: {e}; nothing of it was kept, and a rerun of the same command resumes \
                 from the last checkpoint saved"
            ),
        ));
    }
    if dst.exists() {
        std::fs::remove_dir_all(&dst).map_err(|e| Error::io(&dst, e))?;
    }
    std::fs::rename(&tmp, &dst).map_err(|e| Error::io(&dst, e))?;
    sync_dir(run)?;
    Ok(dst)
}

/// The checkpoint's files, written and synced into `tmp`.
fn write_checkpoint<B: AutodiffBackend>(
    trainer: &Trainer<B>,
    state: &TrainingState,
    config_toml: &str,
    source: Option<&SourceLayout>,
    tmp: &Path,
) -> Result<()> {
    let ckpt = drafter_checkpoint(&trainer.valid(), source);
    let opts =
        SaveOptions { dialect: Dialect::Sglang, dtype: Some(Dtype::F32), include_embedding: false, overwrite: false };
    save_drafter(&ckpt, tmp, &opts)?;
    let sd = tmp.join(STATE_DIR);
    std::fs::create_dir(&sd).map_err(|e| Error::io(&sd, e))?;
    // Serialised in memory (the same named MessagePack bytes burn's file recorder writes), then
    // written here: a write error is then the file's own ("No space left on device"), where
    // burn's file recorder reports only that a MessagePack value could not be written. The cost
    // is one copy of the optimizer state in host memory while saving.
    let optim_path = sd.join(OPTIM_FILE);
    let bytes =
        Recorder::<B>::record(&NamedMpkBytesRecorder::<FullPrecisionSettings>::new(), trainer.optimizer_record(), ())
            .map_err(|e| ckpt_err(&optim_path, format!("cannot serialise the optimizer state: {e}")))?;
    write_synced(&optim_path.with_extension("mpk"), &bytes)?;
    write_synced(&sd.join(CONFIG_FILE), config_toml.as_bytes())?;
    let json = serde_json::to_string_pretty(state).expect("state serialises");
    write_synced(&sd.join(STATE_FILE), json.as_bytes())?;
    Ok(sync_dir(&sd)?)
}

/// Delete all but the newest `keep` checkpoints (0 keeps all).
pub fn prune(run: &Path, keep: usize) -> Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let all = list_checkpoints(run)?;
    for (_, p) in all.iter().take(all.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(p).map_err(|e| Error::io(p, e))?;
    }
    Ok(())
}

/// Read `training_state/state.json` of a checkpoint.
pub fn load_state(ckpt: &Path) -> Result<TrainingState> {
    let path = ckpt.join(STATE_DIR).join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let state: TrainingState =
        serde_json::from_str(&text).map_err(|e| ckpt_err(&path, format!("not a training state: {e}")))?;
    if state.format != STATE_FORMAT {
        return Err(ckpt_err(&path, format!("format `{}`, this build reads {STATE_FORMAT}", state.format)));
    }
    Ok(state)
}

/// Read the config saved with a checkpoint.
pub fn load_config_text(ckpt: &Path) -> Result<String> {
    let path = ckpt.join(STATE_DIR).join(CONFIG_FILE);
    std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))
}

/// Read the optimizer state of a checkpoint onto `device`.
pub fn load_optimizer<B: AutodiffBackend>(ckpt: &Path, device: &B::Device) -> Result<OptimRecord<B>> {
    let path = ckpt.join(STATE_DIR).join(OPTIM_FILE);
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
        .load(path.clone(), device)
        .map_err(|e| ckpt_err(&path.with_extension("mpk"), format!("cannot read the optimizer state: {e}")))
}
