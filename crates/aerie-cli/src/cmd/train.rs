//! `aerie train CONFIG.toml`: fine-tune a drafter (aerie-train). Flags only choose the config,
//! its overrides, the devices and a resume directory; everything else is in the config (every key
//! with its default in `configs/README.md`).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use aerie_eval::accept::AcceptRule;
use aerie_eval::decode::{DecodeOptions, DecodeSession};
use aerie_model::Drafter;
use aerie_model::drafter::shape::DraftShape;
use aerie_train::config::SelectConfig;
use aerie_train::config::model_paths::model_path_overrides;
use aerie_train::select::{Decoded, Selector};
use aerie_train::{Event, RunOptions, Summary, TrainConfig, train};
use anyhow::{Context, Result, bail};
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::cmd::common::parse_set;
use crate::device::DeviceArg;
use crate::model_ref::{self, looks_like_hub_id};

/// Arguments of `aerie train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Training config (TOML).
    pub config: PathBuf,
    /// Override a config key, e.g. `--set optim.lr=5e-5` (repeatable; same key names as the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue the run in DIR from its newest complete checkpoint (the config must agree with the
    /// run's in every key that changes the result).
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// `cpu`, `cuda:N` or `wgpu:N`.
    #[arg(long, default_value = "cpu", conflicts_with = "devices")]
    pub device: DeviceArg,
    /// Data-parallel devices: `cuda:0,cuda:1`, `cuda:0..7` (0 through 7, inclusive; gradients
    /// summed with NCCL), `wgpu:0,wgpu:1` (one thread per GPU, gradients summed through host
    /// memory), `cpu,cpu` or `wgpu:0,wgpu:0` (replicas run one after the other on the one device;
    /// the same arithmetic, no speed-up).
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Print summary.json on stdout at the end.
    #[arg(long)]
    pub json: bool,
}

/// Parse `--devices`: a comma list whose items are `cpu`, `cuda:N`, `wgpu:N` or `cuda:A..B`
/// (inclusive).
fn parse_devices(s: &str) -> Result<Vec<DeviceArg>> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if let Some((a, b)) = item.strip_prefix("cuda:").and_then(|r| r.split_once("..")) {
            let b = b.strip_prefix('=').unwrap_or(b);
            let (a, b): (usize, usize) = (
                a.parse().with_context(|| format!("`{item}`: bad device range"))?,
                b.parse().with_context(|| format!("`{item}`: bad device range"))?,
            );
            if b < a {
                bail!("--devices `{item}`: an empty range: write the lower GPU first, `cuda:{b}..{a}` (both included)");
            }
            // Counted before it is expanded: `cuda:0..4000000000` is a typo, not 4e9 devices.
            let count = (b - a) as u128 + 1 + out.len() as u128;
            aerie_data::limits::check(
                format!("--devices `{item}`: the device count"),
                count,
                aerie_data::limits::MAX_DEVICES,
                aerie_data::limits::WHY_DEVICES,
            )?;
            out.extend((a..=b).map(DeviceArg::Cuda));
        } else {
            out.push(item.parse::<DeviceArg>().map_err(anyhow::Error::msg)?);
            aerie_data::limits::check(
                "--devices: the device count",
                out.len(),
                aerie_data::limits::MAX_DEVICES,
                aerie_data::limits::WHY_DEVICES,
            )?;
        }
    }
    if out.is_empty() {
        bail!("--devices lists no device");
    }
    Ok(out)
}

/// `--set` overrides that replace hub ids in the model-path keys of `config` (after the user's
/// own overrides) by their local snapshot directories. Paths that exist, and values that are not
/// hub ids, are left to the config loader.
fn hub_overrides(config: &Path, overrides: &[(String, String)]) -> Result<Vec<(String, String)>> {
    model_path_overrides(config, overrides, |key, value| {
        if Path::new(value).exists() || !looks_like_hub_id(value) {
            return Ok(None);
        }
        let path = model_ref::resolve(value).with_context(|| format!("config key `{key}` = \"{value}\""))?;
        Ok(Some(path))
    })
}

/// Run `aerie train`.
pub fn run(args: TrainArgs) -> Result<()> {
    let mut overrides = parse_set(&args.set)?;
    let resolved = hub_overrides(&args.config, &overrides)?;
    overrides.extend(resolved);
    let cfg = TrainConfig::load(&args.config, &overrides)?;
    let devices = match &args.devices {
        Some(list) => parse_devices(list)?,
        None => vec![args.device],
    };
    if let Some(other) = devices.iter().find(|d| d.kind() != devices[0].kind()) {
        bail!("--devices mixes {} and {} devices", devices[0].kind(), other.kind());
    }
    let summary = match devices[0] {
        DeviceArg::Cpu => {
            let devs = vec![burn::backend::flex::FlexDevice; devices.len()];
            go::<burn::backend::Autodiff<burn::backend::Flex>>(&cfg, &args, devs, None)?
        }
        DeviceArg::Cuda(_) => {
            let ids: Vec<usize> =
                devices.iter().filter_map(|d| if let DeviceArg::Cuda(i) = d { Some(*i) } else { None }).collect();
            cuda(&cfg, &args, &ids)?
        }
        DeviceArg::Wgpu(_) => wgpu(&cfg, &args, &devices)?,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn cuda(cfg: &TrainConfig, args: &TrainArgs, ids: &[usize]) -> Result<Summary> {
    let devs = ids.iter().map(|&i| burn::backend::cuda::CudaDevice::new(i)).collect();
    // Replicas on distinct GPUs sum their gradients with NCCL (one GPU listed twice: host memory).
    let nccl: std::sync::Arc<dyn aerie_train::collective::AllReduce<burn::backend::Cuda>> =
        std::sync::Arc::new(aerie_train::collective::Nccl);
    go::<burn::backend::Autodiff<burn::backend::Cuda>>(cfg, args, devs, Some(nccl))
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &TrainConfig, _: &TrainArgs, _: &[usize]) -> Result<Summary> {
    bail!("this aerie was built without CUDA: rebuild with `cargo build --release --features cuda`")
}

#[cfg(feature = "wgpu")]
fn wgpu(cfg: &TrainConfig, args: &TrainArgs, devices: &[DeviceArg]) -> Result<Summary> {
    crate::device::refuse_bf16_on_wgpu(cfg.precision, devices[0])?;
    let devs = devices
        .iter()
        .map(|d| match d {
            DeviceArg::Wgpu(i) => crate::device::wgpu_device(*i),
            _ => unreachable!("one kind of device"),
        })
        .collect::<Result<_>>()?;
    go::<burn::backend::Autodiff<burn::backend::Wgpu>>(cfg, args, devs, None)
}

#[cfg(not(feature = "wgpu"))]
fn wgpu(_: &TrainConfig, _: &TrainArgs, _: &[DeviceArg]) -> Result<Summary> {
    bail!("this aerie was built without wgpu: rebuild with the default features")
}

fn go<B: AutodiffBackend>(
    cfg: &TrainConfig,
    args: &TrainArgs,
    devices: Vec<B::Device>,
    all_reduce: Option<std::sync::Arc<dyn aerie_train::collective::AllReduce<B::InnerBackend>>>,
) -> Result<Summary> {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("train [{elapsed_precise}] {wide_bar} {pos}/{len} steps (ETA {eta}) {msg}")
            .expect("valid template"),
    );
    let selector = match &cfg.select {
        Some(s) => Some(decode_selector::<B::InnerBackend>(cfg, s, &devices[0])?),
        None => None,
    };
    let opts = RunOptions::<B> { devices, resume: args.resume.clone(), all_reduce, selector };
    let mut observer = |e: &Event<'_>| {
        match e {
            Event::Started { start_step, total_steps, notes } => {
                for n in *notes {
                    pb.println(format!("note: {n}"));
                }
                pb.set_length(*total_steps);
                pb.set_position(*start_step);
                pb.reset_eta();
            }
            Event::Step(p) => {
                pb.set_position(p.step);
                pb.set_message(format!("loss {:.4}  acc_0 {:.3}  {:.0} tok/s", p.loss, p.acc_0, p.tokens_per_s));
            }
            Event::Eval(r) => pb.println(format!(
                "eval step {} {}: loss {:.4}, acc_0 {:.3}, simulated accept length {:.3}",
                r.step,
                r.set,
                r.metrics.loss,
                r.metrics.acc_per_step.first().copied().unwrap_or(0.0),
                r.metrics.simulated_accept_length
            )),
            Event::Select(r) => pb.println(format!(
                "select step {}: decoded τ {:.3} over {} answers ({:.0} s); best {:.3} at step {}",
                r.step, r.decoded.tau, r.decoded.answers, r.decoded.seconds, r.best_tau, r.best_step
            )),
            Event::Checkpoint { step, path } => pb.println(format!("checkpoint step {step}: {}", path.display())),
            Event::Log(_) => {}
        }
        ControlFlow::Continue(())
    };
    let result = train(cfg, &opts, &mut observer);
    pb.finish_and_clear();
    result.with_context(|| format!("training with {}", args.config.display()))
}

/// `[select]`'s decoder: aerie-eval's decoding session (the native target and the held-out
/// prompts, loaded once for the whole run) on the main device, decoding greedy chains of
/// `select.k` drafts.
struct DecodeSelector<Bk: Backend> {
    session: DecodeSession<Bk>,
    opts: DecodeOptions,
    prompts: PathBuf,
}

impl<Bk: Backend> std::fmt::Debug for DecodeSelector<Bk> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DecodeSelector({}, {:?})", self.prompts.display(), self.opts.shape)
    }
}

impl<Bk: Backend> Selector<Bk> for DecodeSelector<Bk> {
    fn decoded_tau(&self, drafter: Drafter<Bk>) -> std::result::Result<Decoded, String> {
        let t = self.session.speculative_tau(drafter, &self.opts).map_err(|e| format!("{e:#}"))?;
        Ok(Decoded { tau: t.tau, answers: t.answers, cycles: t.cycles, seconds: t.seconds })
    }
}

/// Load the target and prompts `[select]` decodes with (a named prompt set fetched like
/// `--prompts`), before the first step: a wrong path fails now, not after hours of training.
fn decode_selector<Bk: Backend>(
    cfg: &TrainConfig,
    s: &SelectConfig,
    device: &Bk::Device,
) -> Result<std::sync::Arc<dyn Selector<Bk>>> {
    let target = s.target_dir(cfg).context("[select] needs the target model directory")?;
    let prompts = if s.prompts.exists() {
        s.prompts.clone()
    } else {
        crate::cmd::assets::parse_prompts(&s.prompts.to_string_lossy()).map_err(anyhow::Error::msg)?
    };
    let opts = DecodeOptions {
        shape: DraftShape::Chain { k: s.k },
        temperature: 0.0,
        rule: AcceptRule::Greedy,
        max_new_tokens: s.max_new_tokens,
        seed: 0,
    };
    let session = DecodeSession::<Bk>::load(target, &prompts, s.max_prompts, &s.template, device)
        .with_context(|| format!("[select] of {}: loading the target and prompts", cfg.output_dir.display()))?;
    Ok(std::sync::Arc::new(DecodeSelector { session, opts, prompts }))
}

fn print_summary(s: &Summary) {
    println!("status       {:?}", s.status);
    println!("steps        {} of {} (epoch {})", s.steps, s.total_steps, s.epoch);
    println!("tokens       {:.0} in {:.1} s ({:.0} tokens/s)", s.tokens, s.elapsed_s, s.tokens_per_s);
    if let Some(t) = &s.last_train {
        println!("train loss   {:.4} (acc_0 {:.3})", t.loss, t.acc_k.first().copied().unwrap_or(0.0));
    }
    for e in &s.eval {
        println!(
            "eval         {}: loss {:.4}, simulated accept length {:.3}",
            e.set, e.metrics.loss, e.metrics.simulated_accept_length
        );
    }
    if let Some(c) = &s.final_checkpoint {
        println!("drafter      {}", c.display());
    }
    if let Some(b) = &s.best {
        println!("best         decoded τ {:.3} at step {} (RUN/best/)", b.decoded.tau, b.step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_lists() {
        assert_eq!(parse_devices("cpu,cpu").unwrap(), vec![DeviceArg::Cpu, DeviceArg::Cpu]);
        assert_eq!(parse_devices("cuda:0..3").unwrap().len(), 4);
        // Bounded before the range is expanded (u64::MAX panicked, 4e9 aborted on allocation).
        for huge in ["cuda:0..18446744073709551615", "cuda:0..4000000000", "cuda:0..1023,cuda:5"] {
            let e = parse_devices(huge).unwrap_err().to_string();
            assert!(e.contains("limit of 1024"), "{huge}: {e}");
        }
        assert_eq!(parse_devices("cuda:0..1023").unwrap().len(), 1024);
        assert_eq!(parse_devices("cuda:2,cuda:5").unwrap(), vec![DeviceArg::Cuda(2), DeviceArg::Cuda(5)]);
        assert!(parse_devices("cuda:3..1").is_err());
        assert!(parse_devices("gpu").is_err());
        assert_eq!(parse_devices("wgpu:0,wgpu:1").unwrap(), vec![DeviceArg::Wgpu(0), DeviceArg::Wgpu(1)]);
        assert_eq!(parse_set(&["optim.lr=5e-5".into()]).unwrap(), vec![("optim.lr".into(), "5e-5".into())]);
        assert!(parse_set(&["optim.lr".into()]).is_err());
    }

    #[test]
    fn hub_ids_in_model_keys() {
        assert!(looks_like_hub_id("AQ-MedAI/Kimi-K2-Instruct-eagle3"));
        assert!(looks_like_hub_id("org/name@v1.0"));
        assert!(!looks_like_hub_id("/models/org/name"));
        assert!(!looks_like_hub_id("./org/name"));
        assert!(!looks_like_hub_id("runs/a/drafter"));
        assert!(!looks_like_hub_id("drafter"));
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        let local = dir.path().join("d");
        std::fs::create_dir(&local).unwrap();
        std::fs::write(
            &cfg,
            format!("[init]\ndrafter = \"{}\"\n[target]\npath = \"/nonexistent/x/y\"\n", local.display()),
        )
        .unwrap();
        // A local path and a non-hub path are left alone.
        assert!(hub_overrides(&cfg, &[]).unwrap().is_empty());
        // A --set value wins over the file's.
        let sets = [("target.path".to_owned(), format!("\"{}\"", local.display()))];
        assert!(hub_overrides(&cfg, &sets).unwrap().is_empty());
    }
}
