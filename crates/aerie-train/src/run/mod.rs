//! [`train`]: the whole run. Setup ([`setup`]: data, initial or resumed drafter, compatibility
//! checks, trainer and target heads), then the loop: plan → step → log → eval → checkpoint, until
//! the schedule ends, the observer asks to stop, or the loss stops being finite; then the final
//! evaluation and checkpoint. Each step of the run is a function named after what it does.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use aerie_model::checkpoint::SourceLayout;
use aerie_model::{TargetHead, TttSums};
use burn::tensor::backend::AutodiffBackend;

use crate::checkpoint::{self, STATE_FORMAT, TrainingState};
use crate::collective::AllReduce;
use crate::config::TrainConfig;
use crate::config::fingerprint::{fingerprint, hash};
use crate::data::{Catalog, MicroBatch, epoch_seed, plan_epoch};
use crate::eval::evaluate;
use crate::metrics::{EvalRecord, Event, MetricsLog, Status, StepProgress, Summary, TrainRecord, write_summary};
use crate::schedule::lr_at;
use crate::select::{
    SELECTION_FORMAT, SelectRecord, Selection, Selector, resume_best, settings as select_settings, write_best,
};
use crate::step::{MicroInput, StepReport, Trainer, merge_sums};
use crate::{Error, Result};

mod setup;

use setup::{
    Position, Start, build_trainer, check_data_fits, check_same_data, lock_run, resume_position, start, total_steps,
    write_run_config,
};

/// How to run a config.
#[derive(Debug, Clone)]
pub struct RunOptions<B: AutodiffBackend> {
    /// Devices, the main one first. The same device listed twice gives two replicas run one after
    /// the other (`--devices cpu,cpu`): the data-parallel arithmetic without a second device.
    pub devices: Vec<B::Device>,
    /// A run directory to continue from its newest complete checkpoint.
    pub resume: Option<PathBuf>,
    /// How the replicas sum their gradients; `None`: through host memory
    /// ([`crate::collective::HostExchange`], every backend).
    pub all_reduce: Option<Arc<dyn AllReduce<B::InnerBackend>>>,
    /// What decodes held-out prompts for `[select]` (the `aerie train` command builds one from
    /// aerie-eval's decoder); required when the config has `[select]`, unused otherwise.
    pub selector: Option<Arc<dyn Selector<B::InnerBackend>>>,
}

/// `[select]` as the loop runs it.
struct Selecting<Bk: burn::tensor::backend::Backend> {
    selector: Arc<dyn Selector<Bk>>,
    settings: serde_json::Value,
    every: u64,
    /// The best so far (read back from `best/` on a resume).
    best: Option<Selection>,
    /// The step last decoded at.
    at: Option<u64>,
}

/// Sums over the steps since the last `train` log record.
#[derive(Default)]
struct Window {
    steps: u64,
    loss: f64,
    grad_norm: f64,
    sums: TttSums,
    tokens: f64,
    padded: f64,
    seconds: f64,
    /// Σ of the anchored steps' L2-SP penalties, and how many steps that is.
    anchor: (f64, u64),
    /// Σ of the replay steps' shares of cycle starts, and how many steps that is.
    replay: (f64, u64),
}

impl Window {
    fn add(&mut self, report: &StepReport, seconds: f64) {
        self.steps += 1;
        self.loss += report.loss;
        self.grad_norm += report.grad_norm;
        self.tokens += report.positions;
        self.padded += report.padded_tokens;
        self.seconds += seconds;
        if let Some(p) = report.anchor_penalty {
            self.anchor.0 += p;
            self.anchor.1 += 1;
        }
        if let Some(s) = report.replay_starts {
            self.replay.0 += s;
            self.replay.1 += 1;
        }
        merge_sums(&mut self.sums, &report.sums);
    }
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
    let _lock = lock_run(opts.resume.as_deref().unwrap_or(&cfg.output_dir))?;
    let st = start(cfg, opts.resume.as_deref(), per_step)?;
    check_same_data(&st, &catalog)?;
    let run = st.run.clone();
    let config_toml = write_run_config(cfg, &run)?;
    check_data_fits(cfg, &catalog, &st)?;
    let (mut trainer, eval_head, anchor_checksum) = build_trainer::<B>(cfg, &st, &catalog, &devices, &main)?;
    if let Some(all_reduce) = &opts.all_reduce {
        trainer = trainer.with_all_reduce(all_reduce.clone());
    }

    let total = total_steps(cfg, &catalog, per_step);
    let config_hash = hash(&fingerprint(cfg));
    let pos = resume_position(cfg, &st)?;
    let mut notes = run_notes(&st, &catalog, total, per_step);
    if devices.len() > 1 {
        notes.push(format!(
            "{} replicas, gradients summed by the {} all-reduce",
            devices.len(),
            trainer.all_reduce_name()
        ));
    }
    let log = MetricsLog::open(&run, pos.step)?;
    let mut summary = initial_summary(&st, &catalog, &pos, total, &config_hash, notes);
    let selecting = match (&cfg.select, &opts.selector) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(Error::Options(
                "the config has [select], which decodes with aerie-eval's decoder: pass RunOptions::selector (the \
                 `aerie train` command does)"
                    .into(),
            ));
        }
        (Some(s), Some(selector)) => {
            let best = resume_best(&run, s, &config_hash)?;
            summary.best = best.clone();
            Some(Selecting {
                selector: selector.clone(),
                settings: select_settings(s),
                every: s.every_steps,
                best,
                // A resume of a finished run has nothing left to decode.
                at: st.state.as_ref().filter(|s| s.step >= total).map(|s| s.step),
            })
        }
    };
    if observer(&Event::Started { start_step: pos.step, total_steps: total, notes: &summary.notes }).is_break() {
        summary.status = Status::Interrupted;
        return finish(&run, summary);
    }

    let mut r = Run {
        cfg,
        catalog: &catalog,
        run,
        config_toml,
        config_hash,
        per_step,
        total,
        start_step: st.state.as_ref().map_or(0, |s| s.step),
        trainer,
        eval_head,
        anchor_checksum,
        log,
        summary,
        pos,
        segment: Instant::now(),
        seg_tokens: 0.0,
        window: Window::default(),
        plan: None,
        saved_at: st.state.as_ref().map(|s| s.step),
        // A resume of a finished run has nothing left to do, its final evaluation included.
        evaluated_at: st.state.as_ref().filter(|s| s.step >= total).map(|s| s.step),
        do_eval: !catalog.eval_sets.is_empty() || !catalog.held_out.is_empty(),
        source: st.checkpoint.source.clone().map(SourceLayout::trained_by_aerie),
        selecting,
    };
    while r.pos.step < total {
        let Some(end) = r.next_step_end() else { continue };
        let micro = r.micro_inputs(end);
        let lr = lr_at(r.pos.step, total, cfg.optim.lr, cfg.optim.warmup_ratio);
        let t0 = Instant::now();
        let report = match r.trainer.step(micro, lr, r.pos.step + 1) {
            Ok(report) => report,
            Err(e @ Error::NonFinite { .. }) => return stop_non_finite(&r.run, r.summary, e),
            Err(e) => return Err(e),
        };
        let seg_s = r.record_step(&report, end, t0.elapsed().as_secs_f64());
        let elapsed = r.pos.elapsed0 + seg_s;
        if r.pos.step.is_multiple_of(cfg.log_every) || r.pos.step == total {
            r.log_window(lr, elapsed, observer)?;
        }
        if r.do_eval && cfg.eval_every > 0 && r.pos.step.is_multiple_of(cfg.eval_every) {
            r.evaluate(observer)?;
        }
        if r.selecting.as_ref().is_some_and(|s| s.every > 0 && r.pos.step.is_multiple_of(s.every)) {
            r.select(observer)?;
        }
        if cfg.save_every > 0 && r.pos.step.is_multiple_of(cfg.save_every) && r.pos.step < total {
            r.save_checkpoint(elapsed, observer)?;
            r.saved_at = Some(r.pos.step);
        }
        r.update_summary(elapsed);
        if observer(&Event::Step(&r.progress(&report, lr, seg_s))).is_break() {
            r.summary.status = Status::Interrupted;
            return finish(&r.run, r.summary);
        }
    }
    r.finish_schedule(observer)
}

/// The notes of a run: the setup's, then the data split and the schedule.
fn run_notes(st: &Start, catalog: &Catalog, total: u64, per_step: usize) -> Vec<String> {
    let mut notes = st.notes.clone();
    notes.push(format!(
        "{} training samples ({} held out, {} skipped by length), {} steps of {per_step} micro-batches",
        catalog.train.len(),
        catalog.held_out.len(),
        catalog.skipped,
        total
    ));
    notes
}

/// The summary before the first step: where the run starts, nothing measured yet.
fn initial_summary(
    st: &Start,
    catalog: &Catalog,
    pos: &Position,
    total: u64,
    config_hash: &str,
    notes: Vec<String>,
) -> Summary {
    Summary {
        status: Status::Completed,
        error: None,
        steps: pos.step,
        total_steps: total,
        epoch: pos.epoch,
        train_samples: catalog.train.len(),
        held_out_samples: catalog.held_out.len(),
        skipped_samples: catalog.skipped,
        tokens: pos.tokens,
        padded_tokens: pos.padded,
        elapsed_s: pos.elapsed0,
        tokens_per_s: 0.0,
        last_train: None,
        eval: Vec::new(),
        checkpoints: Vec::new(),
        final_checkpoint: None,
        config_hash: config_hash.to_owned(),
        resumed_from: st.resumed_from.clone(),
        notes,
        best: None,
    }
}

/// A step whose loss or gradient norm is not finite ends the run: the error names the newest
/// checkpoint on disk (the last good state), and the summary records it.
fn stop_non_finite(run: &Path, mut summary: Summary, e: Error) -> Result<Summary> {
    let Error::NonFinite { step, what, value, samples, .. } = e else { return Err(e) };
    let e = Error::NonFinite {
        step,
        what,
        value,
        samples,
        last_checkpoint: checkpoint::latest_checkpoint(run)?.map(|(_, p)| p),
    };
    summary.status = Status::NonFinite;
    summary.error = Some(e.to_string());
    finish(run, summary)?;
    Err(e)
}

/// The list of checkpoints left, then `summary.json`.
fn finish(run: &Path, mut summary: Summary) -> Result<Summary> {
    summary.checkpoints = checkpoint::list_checkpoints(run)?.into_iter().map(|(_, p)| p).collect();
    write_summary(run, &summary)?;
    Ok(summary)
}

/// The state of a run in its loop.
struct Run<'a, B: AutodiffBackend> {
    cfg: &'a TrainConfig,
    catalog: &'a Catalog,
    run: PathBuf,
    config_toml: String,
    config_hash: String,
    per_step: usize,
    total: u64,
    /// The step this segment of the run started at (0, or the resumed step).
    start_step: u64,
    trainer: Trainer<B>,
    eval_head: Option<TargetHead<B::InnerBackend>>,
    /// The checksum of the L2-SP anchor's θ₀, recorded with every checkpoint.
    anchor_checksum: Option<u64>,
    log: MetricsLog,
    summary: Summary,
    pos: Position,
    /// When this segment of the run started, and the tokens it has trained on.
    segment: Instant,
    seg_tokens: f64,
    window: Window,
    plan: Option<(u64, Vec<MicroBatch>)>,
    saved_at: Option<u64>,
    evaluated_at: Option<u64>,
    do_eval: bool,
    /// The layout of the drafter the run started from (a warm start's published files, or the
    /// resumed checkpoint's), which every checkpoint keeps so an export in that layout gives its
    /// config keys and tensor set back.
    source: Option<SourceLayout>,
    /// `[select]`, when the config has it.
    selecting: Option<Selecting<B::InnerBackend>>,
}

impl<'a, B: AutodiffBackend> Run<'a, B> {
    /// The end (in the epoch's plan) of the next step's micro-batches, planning the epoch when it
    /// starts; `None` when the epoch is used up (the position moves to the next epoch).
    fn next_step_end(&mut self) -> Option<usize> {
        let (cfg, epoch) = (self.cfg, self.pos.epoch);
        if self.plan.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let p = plan_epoch(&self.catalog.train, cfg.seed, epoch, cfg.data.batch_tokens, cfg.data.bucket_window);
            self.plan = Some((epoch, p));
        }
        let batches = &self.plan.as_ref().expect("planned above").1;
        if self.pos.cursor >= batches.len() {
            self.pos.epoch += 1;
            self.pos.cursor = 0;
            return None;
        }
        Some((self.pos.cursor + self.per_step).min(batches.len()))
    }

    /// The samples (and their labels for error messages) of the micro-batches `cursor..end`.
    fn micro_inputs(&self, end: usize) -> Vec<MicroInput<'a>> {
        let catalog = self.catalog;
        let batches = &self.plan.as_ref().expect("planned").1;
        batches[self.pos.cursor..end]
            .iter()
            .map(|b| MicroInput {
                samples: b.iter().map(|&i| catalog.view(catalog.train[i])).collect(),
                labels: b.iter().map(|&i| catalog.describe(catalog.train[i])).collect(),
            })
            .collect()
    }

    /// Advance the position past a step that took `seconds`; returns the seconds of this segment
    /// of the run so far.
    fn record_step(&mut self, report: &StepReport, end: usize, seconds: f64) -> f64 {
        self.pos.cursor = end;
        self.pos.step += 1;
        self.pos.tokens += report.positions;
        self.pos.padded += report.padded_tokens;
        self.seg_tokens += report.positions;
        self.window.add(report, seconds);
        self.segment.elapsed().as_secs_f64()
    }

    /// Write the `train` record of the steps since the last one, and start a new window.
    fn log_window(
        &mut self,
        lr: f64,
        elapsed: f64,
        observer: &mut dyn FnMut(&Event<'_>) -> ControlFlow<()>,
    ) -> Result<()> {
        let w = &self.window;
        let m = w.sums.metrics(&self.cfg.ttt_options().step_weights);
        let n = w.steps.max(1) as f64;
        let rec = TrainRecord {
            kind: "train".into(),
            step: self.pos.step,
            epoch: self.pos.epoch,
            loss: w.loss / n,
            loss_k: m.loss_per_step,
            acc_k: m.acc_per_step,
            alpha_k: m.accept_rate_per_step,
            accept_length: m.simulated_accept_length,
            lr,
            grad_norm: w.grad_norm / n,
            tokens_per_s: w.tokens / w.seconds.max(1e-9),
            padded_tokens_per_s: w.padded / w.seconds.max(1e-9),
            tokens: self.pos.tokens,
            elapsed_s: elapsed,
            anchor_penalty: (w.anchor.1 > 0).then(|| w.anchor.0 / w.anchor.1 as f64),
            replay_starts: (w.replay.1 > 0).then(|| w.replay.0 / w.replay.1 as f64),
        };
        self.log.write(&rec)?;
        let _ = observer(&Event::Log(&rec));
        self.summary.last_train = Some(rec);
        self.window = Window::default();
        Ok(())
    }

    /// Evaluate the current weights on every eval set; the records replace the summary's.
    fn evaluate(&mut self, observer: &mut dyn FnMut(&Event<'_>) -> ControlFlow<()>) -> Result<()> {
        let (cfg, step) = (self.cfg, self.pos.step);
        run_eval(
            cfg,
            &self.trainer,
            self.eval_head.as_ref(),
            self.catalog,
            step,
            &mut self.log,
            &mut self.summary.eval,
            observer,
        )?;
        self.evaluated_at = Some(step);
        Ok(())
    }

    /// Decode the held-out prompts with the current weights ([`crate::select`]): log the τ, and
    /// keep the weights as `best/` when no earlier step decoded better.
    fn select(&mut self, observer: &mut dyn FnMut(&Event<'_>) -> ControlFlow<()>) -> Result<()> {
        let step = self.pos.step;
        let Some(s) = self.selecting.as_mut() else { return Ok(()) };
        let decoded = s
            .selector
            .decoded_tau(self.trainer.valid())
            .map_err(|message| Error::Options(format!("step {step}: decoding for [select]: {message}")))?;
        if s.best.as_ref().is_none_or(|b| decoded.tau > b.decoded.tau) {
            let selection = Selection {
                format: SELECTION_FORMAT.into(),
                step,
                decoded: decoded.clone(),
                settings: s.settings.clone(),
                config_hash: self.config_hash.clone(),
            };
            write_best(&self.run, &self.trainer.valid(), self.source.as_ref(), &selection)?;
            s.best = Some(selection);
        }
        let best = s.best.as_ref().expect("set above");
        let rec =
            SelectRecord { kind: "select".into(), step, decoded, best_tau: best.decoded.tau, best_step: best.step };
        self.summary.best = Some(best.clone());
        s.at = Some(step);
        self.log.write(&rec)?;
        let _ = observer(&Event::Select(&rec));
        Ok(())
    }

    /// The training state to store with a checkpoint at the current position.
    fn state(&self, elapsed: f64) -> TrainingState {
        TrainingState {
            format: STATE_FORMAT.into(),
            step: self.pos.step,
            epoch: self.pos.epoch,
            cursor: self.pos.cursor,
            epoch_rng_state: epoch_seed(self.cfg.seed, self.pos.epoch),
            total_steps: self.total,
            micro_per_step: self.per_step,
            config_hash: self.config_hash.clone(),
            tokens: self.pos.tokens,
            padded_tokens: self.pos.padded,
            elapsed_s: elapsed,
            aerie_version: env!("CARGO_PKG_VERSION").into(),
            data: self.catalog.identity(),
            anchor_checksum: self.anchor_checksum,
        }
    }

    /// Save a checkpoint at the current step and prune old ones.
    fn save_checkpoint(&self, elapsed: f64, observer: &mut dyn FnMut(&Event<'_>) -> ControlFlow<()>) -> Result<()> {
        let path =
            checkpoint::save(&self.run, &self.trainer, &self.state(elapsed), &self.config_toml, self.source.as_ref())?;
        checkpoint::prune(&self.run, self.cfg.keep_last)?;
        let _ = observer(&Event::Checkpoint { step: self.pos.step, path: &path });
        Ok(())
    }

    /// The summary at the current position.
    fn update_summary(&mut self, elapsed: f64) {
        let s = &mut self.summary;
        s.steps = self.pos.step;
        s.epoch = self.pos.epoch;
        s.tokens = self.pos.tokens;
        s.padded_tokens = self.pos.padded;
        s.elapsed_s = elapsed;
        s.tokens_per_s = self.pos.tokens / elapsed.max(1e-9);
    }

    /// What the observer sees after each step, `seg_s` seconds into this segment of the run.
    fn progress(&self, report: &StepReport, lr: f64, seg_s: f64) -> StepProgress {
        let step = self.pos.step;
        let step_metrics = report.sums.metrics(&self.cfg.ttt_options().step_weights);
        StepProgress {
            step,
            total_steps: self.total,
            epoch: self.pos.epoch,
            loss: report.loss,
            acc_0: step_metrics.acc_per_step.first().copied().unwrap_or(0.0),
            tokens_per_s: self.seg_tokens / seg_s.max(1e-9),
            lr,
            elapsed_s: self.pos.elapsed0 + seg_s,
            eta_s: (self.total - step) as f64 * seg_s / (step - self.start_step).max(1) as f64,
        }
    }

    /// After the last step: the final evaluation and checkpoint (unless this step has them
    /// already), then the summary.
    fn finish_schedule(mut self, observer: &mut dyn FnMut(&Event<'_>) -> ControlFlow<()>) -> Result<Summary> {
        let step = self.pos.step;
        if self.do_eval && self.evaluated_at != Some(step) {
            self.evaluate(observer)?;
        }
        if self.selecting.as_ref().is_some_and(|s| s.at != Some(step)) {
            self.select(observer)?;
        }
        if self.saved_at != Some(step) || checkpoint::latest_checkpoint(&self.run)?.is_none_or(|(s, _)| s != step) {
            self.save_checkpoint(self.summary.elapsed_s, observer)?;
        }
        self.summary.final_checkpoint = Some(checkpoint::checkpoint_dir(&self.run, step));
        self.summary.status = Status::Completed;
        finish(&self.run, self.summary)
    }
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
