//! `aerie hub download`: fetch a Hugging Face repository snapshot into the shared hub cache (the
//! layout Python `huggingface_hub` uses) and print its snapshot directory.

use aerie_hub::hf::{self, HubConfig, RepoRef, RepoType};
use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};

use crate::progress::FileBars;

/// `aerie hub ...`
#[derive(Debug, Subcommand)]
pub enum HubCommand {
    /// Download a repository (or the files matching --include) into `$HF_HUB_CACHE` (default
    /// `$HF_HOME/hub`). Honours HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE=1 (cache only).
    Download {
        /// Repository id, `org/name`.
        repo: String,
        /// Branch, tag or commit.
        #[arg(long, default_value = "main")]
        revision: String,
        /// Only files matching this glob (fnmatch: `*` crosses `/`; `dir/` means all below);
        /// repeatable. Default: every file.
        #[arg(long)]
        include: Vec<String>,
        /// Repository kind.
        #[arg(long, value_enum, default_value = "model")]
        repo_type: RepoTypeArg,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// `--repo-type` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RepoTypeArg {
    /// A model repository.
    Model,
    /// A dataset repository.
    Dataset,
}

/// Run `aerie hub`.
pub fn run(cmd: HubCommand) -> Result<()> {
    let HubCommand::Download { repo, revision, include, repo_type, json } = cmd;
    let repo_type = match repo_type {
        RepoTypeArg::Model => RepoType::Model,
        RepoTypeArg::Dataset => RepoType::Dataset,
    };
    let repo = RepoRef::new(&repo, repo_type, &revision)?;
    let cfg = HubConfig::from_env();
    let mut bar = FileBars::default();
    let snap = hf::download(&cfg, &repo, &include, &mut |file, done, total| bar.update(file, done, total))
        .with_context(|| format!("downloading {repo} into {}", cfg.cache_dir.display()))?;
    bar.finish();
    if json {
        println!("{}", serde_json::to_string(&snap)?);
    } else {
        eprintln!(
            "{} {}: {} files ({} downloaded, commit {})",
            snap.repo_type.as_str(),
            repo,
            snap.files.len(),
            snap.downloaded.len(),
            snap.commit
        );
        println!("{}", snap.path.display());
    }
    Ok(())
}
