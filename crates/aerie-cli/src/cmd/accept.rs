//! `aerie eval accept`: serving-mode acceptance of a drafter on captured shards (drafts from its
//! own tokens, verified against the target's distributions); τ, per-position rates, τ(k).

use std::path::{Path, PathBuf};

use aerie_data::shard::ShardDataset;
use aerie_eval::accept::{AcceptReport, AcceptRule};
use aerie_eval::verify::{AcceptOptions, TreeShape, eval_accept};
use aerie_model::Drafter;
use aerie_model::checkpoint::{load_drafter, load_target_head};
use anyhow::{Context, Result, bail};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use clap::Args;

use crate::device::{DeviceArg, with_backend};
use crate::progress;

/// Arguments of `aerie eval accept`.
#[derive(Debug, Args)]
pub struct AcceptArgs {
    /// Drafter directory (SGLang or speculators layout) or hub id `org/name[@revision]`.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub drafter: PathBuf,
    #[command(flatten)]
    pub common: AcceptCommon,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Flags shared by `eval accept` and `compare`.
#[derive(Debug, Args)]
pub struct AcceptCommon {
    /// Captured shard directory (aerie-shard/1).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Target lm_head: a safetensors file with `lm_head.weight`, or the target model directory.
    /// Not needed when the shards carry a top-k teacher only. A hub id names the target's
    /// snapshot directory.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target_head: Option<PathBuf>,
    /// Target model to take `embed_tokens` from when a drafter does not ship it; defaults to
    /// --target-head when that is a directory. A directory, file or hub id.
    #[arg(long, value_parser = crate::model_ref::parse)]
    pub target: Option<PathBuf>,
    /// Draft steps K (chain length, or tree depth).
    #[arg(long = "k", default_value_t = 3)]
    pub k: usize,
    /// Children per node of a draft tree (SGLang --speculative-eagle-topk); > 1 drafts a tree.
    #[arg(long, default_value_t = 1)]
    pub topk: usize,
    /// Tokens verified per pass of a tree, root included (SGLang --speculative-num-draft-tokens).
    #[arg(long)]
    pub tree_tokens: Option<usize>,
    /// Draft temperature; 0 drafts the argmax (as SGLang's EAGLE worker does).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of the draft sampler (temperature > 0).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Verify rule: greedy (draft == target argmax), sampling (Σ min(p, q)), onehot (p(draft)).
    #[arg(long, default_value = "greedy")]
    pub rule: AcceptRule,
    /// Samples per forward.
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    /// Evaluate only the first N samples.
    #[arg(long)]
    pub max_samples: Option<usize>,
    /// Rows of the target head per chunk of the full-vocabulary pass.
    #[arg(long, default_value_t = 8192)]
    pub head_chunk_rows: usize,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
}

impl AcceptCommon {
    /// The library options these flags describe.
    pub fn options(&self) -> Result<AcceptOptions> {
        let tree = match (self.topk, self.tree_tokens) {
            (1, None) => None,
            (topk, Some(n)) => Some(TreeShape { topk, verify_tokens: n }),
            (topk, None) => {
                bail!("--topk {topk} drafts a tree: give --tree-tokens N (tokens verified per pass, root included)")
            }
        };
        let opts = AcceptOptions {
            steps: self.k,
            tree,
            temperature: self.temperature,
            seed: self.seed,
            rule: self.rule,
            batch_size: self.batch_size,
            max_samples: self.max_samples,
            head_chunk_rows: self.head_chunk_rows,
        };
        opts.validate()?;
        Ok(opts)
    }

    /// The shard directory (`--data`), required by offline evaluation.
    pub fn data_dir(&self) -> Result<&Path> {
        self.data
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--data SHARD_DIR is required (captured shards to evaluate on)"))
    }

    fn target_for_embedding(&self) -> Option<PathBuf> {
        self.target.clone().or_else(|| self.target_head.clone().filter(|p| p.is_dir()))
    }
}

/// The target head `[V, Ht]` as a tensor.
pub fn head_tensor<B: Backend>(path: &Path, device: &B::Device) -> Result<Tensor<B, 2>> {
    let head = load_target_head(path)?;
    let [v, h] = match head.shape[..] {
        [v, h] => [v, h],
        _ => bail!("{}: the target head must be 2-D [V, Ht], found {:?}", path.display(), head.shape),
    };
    Ok(Tensor::from_data(TensorData::new(head.to_f32("lm_head.weight")?, [v, h]), device))
}

/// Samples `eval accept` will read from `data` under `common`.
pub fn samples(common: &AcceptCommon, data: &ShardDataset) -> usize {
    common.max_samples.map_or(data.len(), |m| m.min(data.len()))
}

/// Load a drafter and run `eval accept` on it; `progress(done)` after every batch (samples).
pub fn accept_one<B: Backend>(
    drafter_dir: &Path,
    common: &AcceptCommon,
    data: &ShardDataset,
    head: Option<&Tensor<B, 2>>,
    progress: &dyn Fn(usize),
    device: &B::Device,
) -> Result<AcceptReport> {
    let ckpt = load_drafter(drafter_dir, common.target_for_embedding().as_deref())
        .with_context(|| format!("loading drafter {}", drafter_dir.display()))?;
    let drafter = Drafter::<B>::from_tensors(&ckpt.config, &ckpt.tensors, device)
        .with_context(|| format!("building drafter {}", drafter_dir.display()))?;
    let opts = common.options()?;
    eval_accept(&drafter, data, head, &opts, &mut |done, _| progress(done)).with_context(|| {
        format!("evaluating {} on {}", drafter_dir.display(), common.data_dir().unwrap_or(Path::new("?")).display())
    })
}

/// Open the data and, when the shards need it, the target head.
pub fn open_data<B: Backend>(
    common: &AcceptCommon,
    device: &B::Device,
) -> Result<(ShardDataset, Option<Tensor<B, 2>>)> {
    let dir = common.data_dir()?;
    let data = ShardDataset::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let teacher = data.metadata().teacher;
    let head = match (&common.target_head, teacher.has_final_hidden()) {
        (Some(path), true) => Some(head_tensor::<B>(path, device)?),
        (None, true) if teacher.topk().is_none() => bail!(
            "{}: the shards carry final hidden states only; pass --target-head (lm_head safetensors or target directory)",
            dir.display()
        ),
        _ => None,
    };
    Ok((data, head))
}

/// Run `aerie eval accept`.
pub fn run(args: AcceptArgs) -> Result<()> {
    args.common.options()?;
    with_backend!(args.common.device, |B, dev| accept::<B>(&args, &dev))
}

fn accept<B: Backend>(args: &AcceptArgs, device: &B::Device) -> Result<()> {
    let (data, head) = open_data::<B>(&args.common, device)?;
    let pb = progress::bar(samples(&args.common, &data) as u64, "eval accept", "samples");
    let report =
        accept_one::<B>(&args.drafter, &args.common, &data, head.as_ref(), &|d| pb.set_position(d as u64), device);
    pb.finish_and_clear();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_report(&args.drafter.display().to_string(), &report);
    Ok(())
}

/// The human rendering of an accept report.
pub fn print_report(name: &str, r: &AcceptReport) {
    println!("drafter    {name}");
    println!(
        "drafting   {} (k {}, topk {}, {} verified tokens, temperature {}), rule {}",
        r.drafting,
        r.steps,
        r.topk,
        r.verify_tokens,
        r.temperature,
        r.rule.name()
    );
    println!(
        "positions  {} ({} samples, {} drafts, {} cut by turn end)",
        r.positions, r.samples, r.drafts, r.positions_cut_by_turn_end
    );
    println!("τ          {:.3} (accept length, bonus token included)", r.tau);
    println!("position   α_i (conditional)   r_i (unconditional)");
    for (i, (a, u)) in r.accept_rate_conditional.iter().zip(&r.accept_rate_unconditional).enumerate() {
        println!("{:<10} {:<19.4} {:.4}", i + 1, a, u);
    }
    if r.drafting == "chain" {
        let curve: Vec<String> = r.curve.iter().map(|p| format!("τ({})={:.3}", p.k, p.tau)).collect();
        println!("curve      {}", curve.join("  "));
    }
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
}
