//! [`train`]: the whole run. Setup (data, initial or resumed drafter, target head, compatibility
//! checks), then the loop: plan → step → log → eval → checkpoint, until the schedule ends, the
//! observer asks to stop, or the loss stops being finite.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use aerie_eval::batch::check_compatible;
use aerie_model::checkpoint::{DrafterCheckpoint, load_drafter};
use aerie_model::{Drafter, TargetHead, TttSums};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use crate::checkpoint::{self, STATE_FORMAT, TrainingState};
use crate::config::TrainConfig;
use crate::config::fingerprint::{diff, fingerprint, hash};
use crate::data::{Catalog, MicroBatch, epoch_seed, plan_epoch};
use crate::eval::evaluate;
use crate::grads::with_stable_ids;
use crate::init::{initial_drafter, load_head};
use crate::metrics::{EvalRecord, Event, MetricsLog, Status, StepProgress, Summary, TrainRecord, write_summary};
use crate::schedule::lr_at;
use crate::step::{MicroInput, Trainer, merge_sums};
use crate::{Error, Result};

/// How to run a config.
#[derive(Debug, Clone)]
pub struct RunOptions<B: AutodiffBackend> {
    /// Devices, the main one first. The same device listed twice gives two replicas run one after
    /// the other (`--devices cpu,cpu`): the data-parallel arithmetic without a second device.
    pub devices: Vec<B::Device>,
    /// A run directory to continue from its newest complete checkpoint.
    pub resume: Option<PathBuf>,
}

struct Start {
    run: PathBuf,
    checkpoint: DrafterCheckpoint,
    state: Option<TrainingState>,
    resumed_from: Option<PathBuf>,
    notes: Vec<String>,
}

fn resume_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Resume { path: path.to_path_buf(), message: message.into() }
}

fn start(cfg: &TrainConfig, resume: Option<&Path>, micro_per_step: usize) -> Result<Start> {
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
    let (_, ckpt) = checkpoint::latest_checkpoint(&run)?
        .ok_or_else(|| resume_err(&run, "no complete checkpoint-<step>/ in this directory"))?;
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
fn total_steps(cfg: &TrainConfig, catalog: &Catalog, per_step: usize) -> u64 {
    if let Some(m) = cfg.optim.max_steps {
        return m;
    }
    (0..cfg.optim.epochs as u64)
        .map(|e| plan_epoch(&catalog.train, cfg.seed, e, cfg.data.batch_tokens, cfg.data.bucket_window).len())
        .map(|n| n.div_ceil(per_step) as u64)
        .sum()
}

#[derive(Default)]
struct Window {
    steps: u64,
    loss: f64,
    grad_norm: f64,
    sums: TttSums,
    tokens: f64,
    padded: f64,
    seconds: f64,
}

/// Train per `cfg` on `opts.devices`, reporting to `observer` (return `Break` to stop, as a
/// kill would: no final checkpoint). Writes `metrics.jsonl`, checkpoints and `summary.json` in
/// the run directory (`output_dir`, or the resumed one).
pub fn train<B: AutodiffBackend>(
    cfg: &TrainConfig,
    opts: &RunOptions<B>,
    observer: &mut dyn FnMut(&Event<'_>) -> ControlFlow<()>,
) -> Result<Summary> {
    let devices = opts.devices.clone();
    let main = devices.first().cloned().ok_or_else(|| Error::Options("no device given".into()))?;
    let per_step = cfg.optim.grad_accumulation * devices.len();
    let catalog = Catalog::open(&cfg.data)?;
    let st = start(cfg, opts.resume.as_deref(), per_step)?;
    let run = st.run.clone();
    std::fs::create_dir_all(&run).map_err(|e| Error::io(&run, e))?;
    let config_toml = cfg.to_toml();
    let cfg_copy = run.join("config.toml");
    std::fs::write(&cfg_copy, &config_toml).map_err(|e| Error::io(&cfg_copy, e))?;

    let dc = &st.checkpoint.config;
    for (dir, set) in cfg.data.train.iter().zip(&catalog.train_sets).chain(cfg.data.eval.iter().zip(&catalog.eval_sets))
    {
        check_compatible(dc, set.metadata()).map_err(|e| Error::Init { path: dir.clone(), message: e.to_string() })?;
    }
    let model = with_stable_ids(Drafter::<B>::from_tensors(dc, &st.checkpoint.tensors, &main)?)?;
    let heads = teacher_head::<B>(cfg, &catalog, &st.checkpoint, &devices, &model)?;
    let eval_head = heads[0].clone();
    let mut trainer =
        Trainer::new(model, devices.iter().cloned().zip(heads).collect(), cfg.ttt_options(), cfg.loss, &cfg.optim)?
            .with_compute_dtype(cfg.precision.dtype());
    if let Some(ckpt) = &st.resumed_from {
        trainer.load_optimizer_record(checkpoint::load_optimizer::<B>(ckpt, &main)?);
    }

    let total = total_steps(cfg, &catalog, per_step);
    let config_hash = hash(&fingerprint(cfg));
    let (mut step, mut epoch, mut cursor, mut tokens, mut padded, elapsed0) = match &st.state {
        Some(s) => (s.step, s.epoch, s.cursor, s.tokens, s.padded_tokens, s.elapsed_s),
        None => (0, 0, 0, 0.0, 0.0, 0.0),
    };
    if let Some(s) = &st.state
        && s.epoch_rng_state != epoch_seed(cfg.seed, s.epoch)
    {
        return Err(resume_err(
            &run,
            "the saved data-order PRNG state does not match this build's (the data order would differ)",
        ));
    }
    let mut notes = st.notes.clone();
    notes.push(format!(
        "{} training samples ({} held out, {} skipped by length), {} steps of {per_step} micro-batches",
        catalog.train.len(),
        catalog.held_out.len(),
        catalog.skipped,
        total
    ));
    let mut log = MetricsLog::open(&run, step)?;
    let mut summary = Summary {
        status: Status::Completed,
        error: None,
        steps: step,
        total_steps: total,
        epoch,
        train_samples: catalog.train.len(),
        held_out_samples: catalog.held_out.len(),
        skipped_samples: catalog.skipped,
        tokens,
        padded_tokens: padded,
        elapsed_s: elapsed0,
        tokens_per_s: 0.0,
        last_train: None,
        eval: Vec::new(),
        checkpoints: Vec::new(),
        final_checkpoint: None,
        config_hash: config_hash.clone(),
        resumed_from: st.resumed_from.clone(),
        notes: notes.clone(),
    };
    if observer(&Event::Started { start_step: step, total_steps: total, notes: &notes }).is_break() {
        summary.status = Status::Interrupted;
        return finish(&run, summary);
    }

    let segment = Instant::now();
    let mut seg_tokens = 0.0;
    let mut window = Window::default();
    let mut plan: Option<(u64, Vec<MicroBatch>)> = None;
    let mut saved_at: Option<u64> = st.state.as_ref().map(|s| s.step);
    // A resume of a finished run has nothing left to do, its final evaluation included.
    let mut evaluated_at: Option<u64> = st.state.as_ref().filter(|s| s.step >= total).map(|s| s.step);
    let do_eval = !catalog.eval_sets.is_empty() || !catalog.held_out.is_empty();

    let state_of = |step, epoch, cursor, tokens, padded, elapsed| TrainingState {
        format: STATE_FORMAT.into(),
        step,
        epoch,
        cursor,
        epoch_rng_state: epoch_seed(cfg.seed, epoch),
        total_steps: total,
        micro_per_step: per_step,
        config_hash: config_hash.clone(),
        tokens,
        padded_tokens: padded,
        elapsed_s: elapsed,
        aerie_version: env!("CARGO_PKG_VERSION").into(),
    };

    while step < total {
        if plan.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let p = plan_epoch(&catalog.train, cfg.seed, epoch, cfg.data.batch_tokens, cfg.data.bucket_window);
            plan = Some((epoch, p));
        }
        let batches = &plan.as_ref().expect("planned above").1;
        if cursor >= batches.len() {
            epoch += 1;
            cursor = 0;
            continue;
        }
        let end = (cursor + per_step).min(batches.len());
        let micro: Vec<MicroInput<'_>> = batches[cursor..end]
            .iter()
            .map(|b| MicroInput {
                samples: b.iter().map(|&i| catalog.view(catalog.train[i])).collect(),
                labels: b.iter().map(|&i| catalog.describe(catalog.train[i])).collect(),
            })
            .collect();
        let lr = lr_at(step, total, cfg.optim.lr, cfg.optim.warmup_ratio);
        let t0 = Instant::now();
        let report = match trainer.step(micro, lr, step + 1) {
            Ok(r) => r,
            Err(Error::NonFinite { step: s, what, value, samples, .. }) => {
                let e = Error::NonFinite {
                    step: s,
                    what,
                    value,
                    samples,
                    last_checkpoint: checkpoint::latest_checkpoint(&run)?.map(|(_, p)| p),
                };
                summary.status = Status::NonFinite;
                summary.error = Some(e.to_string());
                finish(&run, summary)?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let dt = t0.elapsed().as_secs_f64();
        cursor = end;
        step += 1;
        tokens += report.positions;
        padded += report.padded_tokens;
        seg_tokens += report.positions;
        window.steps += 1;
        window.loss += report.loss;
        window.grad_norm += report.grad_norm;
        window.tokens += report.positions;
        window.padded += report.padded_tokens;
        window.seconds += dt;
        merge_sums(&mut window.sums, &report.sums);
        let seg_s = segment.elapsed().as_secs_f64();
        let elapsed = elapsed0 + seg_s;
        let rate = seg_tokens / seg_s.max(1e-9);
        let step_metrics = report.sums.metrics(&cfg.ttt_options().step_weights);

        if step % cfg.log_every == 0 || step == total {
            let m = window.sums.metrics(&cfg.ttt_options().step_weights);
            let n = window.steps.max(1) as f64;
            let rec = TrainRecord {
                kind: "train".into(),
                step,
                epoch,
                loss: window.loss / n,
                loss_k: m.loss_per_step,
                acc_k: m.acc_per_step,
                alpha_k: m.accept_rate_per_step,
                accept_length: m.simulated_accept_length,
                lr,
                grad_norm: window.grad_norm / n,
                tokens_per_s: window.tokens / window.seconds.max(1e-9),
                padded_tokens_per_s: window.padded / window.seconds.max(1e-9),
                tokens,
                elapsed_s: elapsed,
            };
            log.write(&rec)?;
            let _ = observer(&Event::Log(&rec));
            summary.last_train = Some(rec);
            window = Window::default();
        }
        if do_eval && cfg.eval_every > 0 && step % cfg.eval_every == 0 {
            run_eval(cfg, &trainer, eval_head.as_ref(), &catalog, step, &mut log, &mut summary.eval, observer)?;
            evaluated_at = Some(step);
        }
        if cfg.save_every > 0 && step % cfg.save_every == 0 && step < total {
            let state = state_of(step, epoch, cursor, tokens, padded, elapsed);
            let path = checkpoint::save(&run, &trainer, &state, &config_toml)?;
            checkpoint::prune(&run, cfg.keep_last)?;
            saved_at = Some(step);
            let _ = observer(&Event::Checkpoint { step, path: &path });
        }
        summary.steps = step;
        summary.epoch = epoch;
        summary.tokens = tokens;
        summary.padded_tokens = padded;
        summary.elapsed_s = elapsed;
        summary.tokens_per_s = tokens / elapsed.max(1e-9);
        let progress = StepProgress {
            step,
            total_steps: total,
            epoch,
            loss: report.loss,
            acc_0: step_metrics.acc_per_step.first().copied().unwrap_or(0.0),
            tokens_per_s: rate,
            lr,
            elapsed_s: elapsed,
            eta_s: (total - step) as f64 * seg_s / (step - summary_start(&st)).max(1) as f64,
        };
        if observer(&Event::Step(&progress)).is_break() {
            summary.status = Status::Interrupted;
            return finish(&run, summary);
        }
    }

    if do_eval && evaluated_at != Some(step) {
        run_eval(cfg, &trainer, eval_head.as_ref(), &catalog, step, &mut log, &mut summary.eval, observer)?;
    }
    if saved_at != Some(step) || checkpoint::latest_checkpoint(&run)?.is_none_or(|(s, _)| s != step) {
        let state = state_of(step, epoch, cursor, tokens, padded, summary.elapsed_s);
        let path = checkpoint::save(&run, &trainer, &state, &config_toml)?;
        checkpoint::prune(&run, cfg.keep_last)?;
        let _ = observer(&Event::Checkpoint { step, path: &path });
    }
    summary.final_checkpoint = Some(checkpoint::checkpoint_dir(&run, step));
    summary.status = Status::Completed;
    finish(&run, summary)
}

fn summary_start(st: &Start) -> u64 {
    st.state.as_ref().map_or(0, |s| s.step)
}

fn finish(run: &Path, mut summary: Summary) -> Result<Summary> {
    summary.checkpoints = checkpoint::list_checkpoints(run)?.into_iter().map(|(_, p)| p).collect();
    write_summary(run, &summary)?;
    Ok(summary)
}

#[allow(clippy::too_many_arguments)]
fn run_eval<B: AutodiffBackend>(
    cfg: &TrainConfig,
    trainer: &Trainer<B>,
    head: Option<&TargetHead<B::InnerBackend>>,
    catalog: &Catalog,
    step: u64,
    log: &mut MetricsLog,
    latest: &mut Vec<EvalRecord>,
    observer: &mut dyn FnMut(&Event<'_>) -> ControlFlow<()>,
) -> Result<()> {
    let model = trainer.valid();
    let records =
        evaluate(&model, head, catalog, &cfg.ttt_options(), cfg.data.eval_batch_size, cfg.data.eval_max_samples, step)?;
    latest.clear();
    for r in records {
        log.write(&r)?;
        let _ = observer(&Event::Eval(&r));
        latest.push(r);
    }
    Ok(())
}
