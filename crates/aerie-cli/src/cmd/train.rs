//! `aerie train CONFIG.toml`: fine-tune a drafter (aerie-train). Flags only choose the config,
//! its overrides, the devices and a resume directory; everything else is in the config (every key
//! with its default in `configs/README.md`).

use std::ops::ControlFlow;
use std::path::PathBuf;

use aerie_train::{Event, RunOptions, Summary, TrainConfig, train};
use anyhow::{Context, Result, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::device::DeviceArg;

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
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu", conflicts_with = "devices")]
    pub device: DeviceArg,
    /// Data-parallel devices: `cuda:0,cuda:1`, `cuda:0..7` (0 through 7, inclusive), or `cpu,cpu`
    /// (replicas run one after the other on the CPU; the same arithmetic, no speed-up).
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Print summary.json on stdout at the end.
    #[arg(long)]
    pub json: bool,
}

/// Parse `--devices`: a comma list whose items are `cpu`, `cuda:N` or `cuda:A..B` (inclusive).
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
                bail!("`{item}`: empty device range");
            }
            out.extend((a..=b).map(DeviceArg::Cuda));
        } else {
            out.push(item.parse::<DeviceArg>().map_err(anyhow::Error::msg)?);
        }
    }
    if out.is_empty() {
        bail!("--devices lists no device");
    }
    Ok(out)
}

fn parse_set(items: &[String]) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => bail!("--set `{s}`: expected KEY=VALUE"),
        })
        .collect()
}

/// Config keys that name a model or drafter: a hub id `org/name[@revision]` there resolves as
/// `--target` does on the command line (see `model_ref`).
const MODEL_KEYS: [&str; 5] = ["init.drafter", "init.target_config", "target.path", "target.head", "target.embedding"];

/// Whether `s` has the shape of a hub id (`org/name`, optionally `@revision`), not of a path.
fn looks_like_hub_id(s: &str) -> bool {
    let repo = s.split_once('@').map_or(s, |(r, _)| r);
    !s.starts_with(['/', '.', '~']) && repo.split('/').count() == 2 && repo.split('/').all(|p| !p.is_empty())
}

/// `--set` overrides that replace hub ids in the model keys of `config` (after the user's own
/// overrides) by their local snapshot directories. Paths that exist, and values that are not
/// hub ids, are left to the config loader.
fn hub_overrides(config: &std::path::Path, overrides: &[(String, String)]) -> Result<Vec<(String, String)>> {
    let Ok(text) = std::fs::read_to_string(config) else { return Ok(Vec::new()) };
    let Ok(table) = toml::from_str::<toml::Table>(&text) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for key in MODEL_KEYS {
        let from_set = overrides.iter().rev().find(|(k, _)| k == key).map(|(_, raw)| {
            match toml::from_str::<toml::Table>(&format!("v = {raw}")).ok().and_then(|mut t| t.remove("v")) {
                Some(toml::Value::String(s)) => s,
                _ => raw.clone(),
            }
        });
        let from_file = || {
            let (section, leaf) = key.split_once('.')?;
            table.get(section)?.get(leaf)?.as_str().map(str::to_owned)
        };
        let Some(value) = from_set.or_else(from_file) else { continue };
        if std::path::Path::new(&value).exists() || !looks_like_hub_id(&value) {
            continue;
        }
        let path = crate::model_ref::resolve(&value).with_context(|| format!("config key `{key}` = \"{value}\""))?;
        out.push((key.to_owned(), toml::Value::String(path.display().to_string()).to_string()));
    }
    Ok(out)
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
    let summary = if devices.iter().all(|d| *d == DeviceArg::Cpu) {
        let devs = vec![burn::backend::flex::FlexDevice; devices.len()];
        go::<burn::backend::Autodiff<burn::backend::Flex>>(&cfg, &args, devs)?
    } else {
        let ids: Vec<usize> = devices
            .iter()
            .map(|d| match d {
                DeviceArg::Cuda(i) => Ok(*i),
                DeviceArg::Cpu => bail!("--devices mixes cpu and cuda devices"),
            })
            .collect::<Result<_>>()?;
        cuda(&cfg, &args, &ids)?
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
    go::<burn::backend::Autodiff<burn::backend::Cuda>>(cfg, args, devs)
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &TrainConfig, _: &TrainArgs, _: &[usize]) -> Result<Summary> {
    bail!("this aerie was built without CUDA: rebuild with `cargo build --release --features cuda`")
}

fn go<B: AutodiffBackend>(cfg: &TrainConfig, args: &TrainArgs, devices: Vec<B::Device>) -> Result<Summary> {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("train [{elapsed_precise}] {wide_bar} {pos}/{len} steps (ETA {eta}) {msg}")
            .expect("valid template"),
    );
    let opts = RunOptions::<B> { devices, resume: args.resume.clone() };
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
            Event::Checkpoint { step, path } => pb.println(format!("checkpoint step {step}: {}", path.display())),
            Event::Log(_) => {}
        }
        ControlFlow::Continue(())
    };
    let result = train(cfg, &opts, &mut observer);
    pb.finish_and_clear();
    result.with_context(|| format!("training with {}", args.config.display()))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_lists() {
        assert_eq!(parse_devices("cpu,cpu").unwrap(), vec![DeviceArg::Cpu, DeviceArg::Cpu]);
        assert_eq!(parse_devices("cuda:0..3").unwrap().len(), 4);
        assert_eq!(parse_devices("cuda:2,cuda:5").unwrap(), vec![DeviceArg::Cuda(2), DeviceArg::Cuda(5)]);
        assert!(parse_devices("cuda:3..1").is_err());
        assert!(parse_devices("gpu").is_err());
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
