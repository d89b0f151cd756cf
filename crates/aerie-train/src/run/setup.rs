//! The setup steps of a run, in the order [`super::train`] takes them: where the run starts (a
//! fresh drafter, or the newest checkpoint of a run being resumed, with every check that the
//! resume continues the same computation), the data's fit with the drafter, the trainer with its
//! teacher heads, and how many steps the run has.

use std::path::{Path, PathBuf};

use aerie_data::lock::OutputLock;
use aerie_model::checkpoint::{DrafterCheckpoint, load_drafter};
use aerie_model::ttt::batch::check_compatible;
use aerie_model::{Drafter, TargetHead};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use crate::checkpoint::{self, TrainingState};
use crate::config::TrainConfig;
use crate::config::fingerprint::{diff, fingerprint, hash};
use crate::data::{Catalog, epoch_seed, plan_epoch};
use crate::grads::{weights_checksum, with_stable_ids};
use crate::init::{initial_drafter, load_head};
use crate::step::Trainer;
use crate::{Error, Result};

/// Hold the run directory for the whole run: two runs into one
/// `output_dir` would each write checkpoints the other then resumes from or overwrites. Taken
/// before anything looks at the directory's checkpoints.
pub(super) fn lock_run(run: &Path) -> Result<OutputLock> {
    Ok(OutputLock::beside(run)?)
}

/// Where a run starts from.
pub(super) struct Start {
    /// The run directory.
    pub(super) run: PathBuf,
    /// The first weights (float32).
    pub(super) checkpoint: DrafterCheckpoint,
    /// The training state of a resumed run.
    pub(super) state: Option<TrainingState>,
    /// The checkpoint resumed from.
    pub(super) resumed_from: Option<PathBuf>,
    /// What the setup decided, for the run's notes.
    pub(super) notes: Vec<String>,
}

pub(super) fn resume_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Resume { path: path.to_path_buf(), message: message.into() }
}

/// The run directory and first weights: a fresh drafter in an empty `output_dir`, or the newest
/// complete checkpoint of the run being resumed, refused when the config changes the result.
pub(super) fn start(cfg: &TrainConfig, resume: Option<&Path>, micro_per_step: usize) -> Result<Start> {
    let Some(run) = resume else {
        let run = cfg.output_dir.clone();
        if let Some((step, _)) = checkpoint::latest_checkpoint(&run)? {
            return Err(Error::config(
                &run,
                format!(
                    "output_dir already holds a run (checkpoint at step {step}): continue it with --resume {}, or choose another output_dir",
                    run.display()
                ),
            ));
        }
        checkpoint::clean_partial(&run)?;
        let init = initial_drafter(cfg)?;
        return Ok(Start { run, checkpoint: init.checkpoint, state: None, resumed_from: None, notes: init.notes });
    };
    let run = run.to_path_buf();
    checkpoint::clean_partial(&run)?;
    let (_, ckpt) = checkpoint::latest_checkpoint(&run)?.ok_or_else(|| {
        // A checkpoint given instead of its run: name the run to give.
        let parent = run.parent().filter(|_| run.join("training_state").is_dir());
        match parent {
            Some(p) => resume_err(
                &run,
                format!("is a checkpoint, not a run: --resume takes the run's directory, here {}", p.display()),
            ),
            None => resume_err(&run, "no complete checkpoint-<step>/ in this directory"),
        }
    })?;
    let state = checkpoint::load_state(&ckpt)?;
    let saved_text = checkpoint::load_config_text(&ckpt)?;
    let saved = TrainConfig::from_toml_str(&saved_text, &ckpt.join("training_state/config.toml"), &[])?;
    let differences = diff(&fingerprint(&saved), &fingerprint(cfg));
    if !differences.is_empty() {
        return Err(resume_err(
            &run,
            format!(
                "the config differs from the run's in keys that change the result:\n  - {}",
                differences.join("\n  - ")
            ),
        ));
    }
    if state.config_hash != hash(&fingerprint(cfg)) {
        return Err(resume_err(&ckpt, "training_state/state.json records another config hash than its config.toml"));
    }
    if state.micro_per_step != micro_per_step {
        return Err(resume_err(
            &run,
            format!(
                "the run took {} micro-batches per step (optim.grad_accumulation × devices), this one takes {micro_per_step}: use the same number of devices",
                state.micro_per_step
            ),
        ));
    }
    let mut checkpoint = load_drafter(&ckpt, cfg.target.embedding_source())?;
    if !checkpoint.tensors.contains_key("embed_tokens.weight") {
        return Err(resume_err(&ckpt, "the target embedding is needed: set `target.path` or `target.embedding`"));
    }
    checkpoint.weight_dtype = aerie_model::checkpoint::Dtype::F32;
    let notes = vec![format!("resumed from {} at step {}", ckpt.display(), state.step)];
    Ok(Start { run, checkpoint, state: Some(state), resumed_from: Some(ckpt), notes })
}

/// Write the config the run uses into the run directory (created if needed); returns its text,
/// which every checkpoint also stores.
pub(super) fn write_run_config(cfg: &TrainConfig, run: &Path) -> Result<String> {
    std::fs::create_dir_all(run).map_err(|e| Error::io(run, e))?;
    let config_toml = cfg.to_toml();
    let cfg_copy = run.join("config.toml");
    std::fs::write(&cfg_copy, &config_toml).map_err(|e| Error::io(&cfg_copy, e))?;
    Ok(config_toml)
}

/// Refuse training and eval data captured for another target or aux layout than the drafter's.
pub(super) fn check_data_fits(cfg: &TrainConfig, catalog: &Catalog, st: &Start) -> Result<()> {
    let dc = &st.checkpoint.config;
    for (dir, set) in cfg.data.train.iter().zip(&catalog.train_sets).chain(cfg.data.eval.iter().zip(&catalog.eval_sets))
    {
        check_compatible(dc, set.metadata()).map_err(|e| Error::Init { path: dir.clone(), message: e.to_string() })?;
    }
    Ok(())
}

/// The target head evaluation runs with on the main device (none for a top-k teacher).
pub(super) type EvalHead<B> = Option<TargetHead<<B as AutodiffBackend>::InnerBackend>>;

/// The trainer on `devices` (main first) with the start's weights, teacher heads, the L2-SP
/// anchor when `optim.anchor_weight` sets one and, on a resume, optimizer state; plus the main
/// device's head for evaluation and the anchor's checksum (for `state.json`).
pub(super) fn build_trainer<B: AutodiffBackend>(
    cfg: &TrainConfig,
    st: &Start,
    catalog: &Catalog,
    devices: &[B::Device],
    main: &B::Device,
) -> Result<(Trainer<B>, EvalHead<B>, Option<u64>)> {
    let dc = &st.checkpoint.config;
    let model = with_stable_ids(Drafter::<B>::from_tensors(dc, &st.checkpoint.tensors, main)?)?;
    let heads = teacher_head::<B>(cfg, catalog, &st.checkpoint, devices, &model)?;
    let eval_head = heads[0].clone();
    let warm_start = anchor_weights::<B>(cfg, st, &model, main)?;
    let mut trainer =
        Trainer::new(model, devices.iter().cloned().zip(heads).collect(), cfg.ttt_options(), cfg.loss, &cfg.optim)?
            .with_compute_dtype(cfg.precision.dtype())
            .with_replay(cfg.optim.replay_weight)?;
    let mut anchor_checksum = None;
    if let Some(w) = warm_start {
        anchor_checksum = Some(weights_checksum(&w));
        trainer = trainer.with_anchor(cfg.optim.anchor_weight, &w)?;
    }
    if let (Some(ckpt), Some(state)) = (&st.resumed_from, &st.state) {
        if state.anchor_checksum != anchor_checksum {
            return Err(resume_err(
                ckpt,
                "the warm start the run is anchored to (`optim.anchor_weight`, θ₀ = `init.drafter`) is not \
                 the one it started from: its weights' checksum differs from the one in \
                 training_state/state.json. Restore the warm start's files, or start a new run",
            ));
        }
        trainer.load_optimizer_record(checkpoint::load_optimizer::<B>(ckpt, main)?);
    }
    Ok((trainer, eval_head, anchor_checksum))
}

/// θ₀ of an anchored run: the warm start's weights as the run began from them (vocab override
/// applied). A fresh run starts from them (`model`); a resumed one reloads them from
/// `init.drafter`, since checkpoints do not store them. `None` when the run is not anchored.
fn anchor_weights<B: AutodiffBackend>(
    cfg: &TrainConfig,
    st: &Start,
    model: &Drafter<B>,
    main: &B::Device,
) -> Result<Option<Drafter<B>>> {
    if cfg.optim.anchor_weight == 0.0 {
        return Ok(None);
    }
    if st.resumed_from.is_none() {
        return Ok(Some(model.clone()));
    }
    let warm = initial_drafter(cfg)?.checkpoint;
    Ok(Some(with_stable_ids(Drafter::<B>::from_tensors(&warm.config, &warm.tensors, main)?)?))
}

/// Whether the shards give a final-hidden teacher (needing the head) or a top-k one.
fn teacher_head<B: AutodiffBackend>(
    cfg: &TrainConfig,
    catalog: &Catalog,
    drafter: &DrafterCheckpoint,
    devices: &[B::Device],
    model: &Drafter<B>,
) -> Result<Vec<Option<TargetHead<B::InnerBackend>>>> {
    let sets = catalog.train_sets.iter().chain(&catalog.eval_sets);
    let all_final = sets.clone().all(|s| s.metadata().teacher.has_final_hidden());
    let all_topk = sets.clone().all(|s| s.metadata().teacher.topk().is_some());
    let source = cfg.target.head_source();
    let use_head = match (all_final, all_topk, source) {
        (true, _, Some(_)) => true,
        (_, true, _) => false,
        (true, false, None) => {
            return Err(Error::config(
                &cfg.output_dir,
                "the shards carry final hidden states only: set `target.path` or `target.head` (the target lm_head is the teacher)",
            ));
        }
        _ => {
            return Err(Error::config(
                &cfg.output_dir,
                "the shards do not share a teacher kind (final hidden states everywhere, or top-k everywhere)",
            ));
        }
    };
    if !use_head {
        return Ok(devices.iter().map(|_| None).collect());
    }
    let src = source.expect("checked above");
    let host = load_head(src, &drafter.config)?;
    let values = host.to_f32("lm_head.weight")?;
    let [v, h] = [host.shape[0], host.shape[1]];
    let mut heads: Vec<(B::Device, TargetHead<B::InnerBackend>)> = Vec::new();
    let mut out = Vec::new();
    for d in devices {
        let head = match heads.iter().find(|(hd, _)| hd == d) {
            Some((_, head)) => head.clone(),
            None => {
                let w = Tensor::<B::InnerBackend, 2>::from_data(TensorData::new(values.clone(), [v, h]), d);
                let head = TargetHead::new(w, model.vocab(), cfg.target.head_chunk_rows);
                heads.push((d.clone(), head.clone()));
                head
            }
        };
        out.push(Some(head));
    }
    Ok(out)
}

/// Total steps: `max_steps`, or the steps of `epochs` planned epochs.
pub(super) fn total_steps(cfg: &TrainConfig, catalog: &Catalog, per_step: usize) -> u64 {
    if let Some(m) = cfg.optim.max_steps {
        return m;
    }
    (0..cfg.optim.epochs as u64)
        .map(|e| plan_epoch(&catalog.train, cfg.seed, e, cfg.data.batch_tokens, cfg.data.bucket_window).len())
        .map(|n| n.div_ceil(per_step) as u64)
        .sum()
}

/// How far a run is: the optimizer steps taken, the data position and the tokens seen.
#[derive(Debug, Clone, Copy)]
pub(super) struct Position {
    pub(super) step: u64,
    pub(super) epoch: u64,
    pub(super) cursor: usize,
    pub(super) tokens: f64,
    pub(super) padded: f64,
    /// Seconds spent in earlier segments of the run (before a resume).
    pub(super) elapsed0: f64,
}

/// A resumed run trains on the data it started on: the datasets' counts and manifest digests
/// recorded in the checkpoint's state are compared with the ones opened now.
pub(super) fn check_same_data(st: &Start, catalog: &Catalog) -> Result<()> {
    let (Some(state), Some(ckpt)) = (&st.state, &st.resumed_from) else { return Ok(()) };
    if state.data.is_empty() {
        return Ok(());
    }
    let differences = crate::data::identity_differences(&state.data, &catalog.identity());
    if differences.is_empty() {
        return Ok(());
    }
    Err(resume_err(
        &st.run,
        format!(
            "the data is not what the run trained on (recorded in {}):\n  - {}\nresuming would continue at a position \
             in other data; restore the datasets, or start a new run",
            ckpt.join("training_state/state.json").display(),
            differences.join("\n  - ")
        ),
    ))
}

/// Where the loop picks up: the start of the data, or the resumed state, whose data-order PRNG
/// state must be this build's.
pub(super) fn resume_position(cfg: &TrainConfig, st: &Start) -> Result<Position> {
    let pos = match &st.state {
        Some(s) => Position {
            step: s.step,
            epoch: s.epoch,
            cursor: s.cursor,
            tokens: s.tokens,
            padded: s.padded_tokens,
            elapsed0: s.elapsed_s,
        },
        None => Position { step: 0, epoch: 0, cursor: 0, tokens: 0.0, padded: 0.0, elapsed0: 0.0 },
    };
    if let Some(s) = &st.state
        && s.epoch_rng_state != epoch_seed(cfg.seed, s.epoch)
    {
        return Err(resume_err(
            &st.run,
            "the saved data-order PRNG state does not match this build's (the data order would differ)",
        ));
    }
    Ok(pos)
}
