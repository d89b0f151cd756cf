//! Hub configuration and repository references: the environment of Python `huggingface_hub`
//! read into an explicit [`HubConfig`], and [`RepoRef`], whose parts are validated before any of
//! them becomes part of a cache path.

use std::fmt;
use std::fs;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Serialize;

use crate::error::{Error, Result};

/// The public hub; `HF_ENDPOINT` overrides it.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Kind of repository (the hub keeps models and datasets in separate namespaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RepoType {
    /// A model repository (`models--org--name` in the cache).
    #[default]
    Model,
    /// A dataset repository (`datasets--org--name`).
    Dataset,
}

impl RepoType {
    /// `model` or `dataset`.
    pub fn as_str(self) -> &'static str {
        match self {
            RepoType::Model => "model",
            RepoType::Dataset => "dataset",
        }
    }

    pub(super) fn plural(self) -> &'static str {
        match self {
            RepoType::Model => "models",
            RepoType::Dataset => "datasets",
        }
    }

    pub(super) fn hf(self) -> hf_hub::RepoType {
        match self {
            RepoType::Model => hf_hub::RepoType::Model,
            RepoType::Dataset => hf_hub::RepoType::Dataset,
        }
    }
}

impl FromStr for RepoType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "model" => Ok(RepoType::Model),
            "dataset" => Ok(RepoType::Dataset),
            _ => Err(Error::InvalidInput { input: s.to_owned(), problem: "repo type must be model or dataset".into() }),
        }
    }
}

/// Where and how to reach the hub. Explicit, so tests and library callers never depend on the
/// process environment; [`HubConfig::from_env`] reads it the way `huggingface_hub` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Base URL, without a trailing slash (`HF_ENDPOINT`).
    pub endpoint: String,
    /// The hub cache (`HF_HUB_CACHE`, default `$HF_HOME/hub`).
    pub cache_dir: PathBuf,
    /// Bearer token for private or gated repositories (`HF_TOKEN`, else the token file).
    pub token: Option<String>,
    /// Resolve from the cache only, never touching the network (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
}

impl HubConfig {
    /// Read the process environment (see [`from_vars`](Self::from_vars)).
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Build from a variable lookup, with `huggingface_hub`'s names and defaults: `HF_HOME`
    /// (default `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`), `HF_HUB_CACHE` (or
    /// the legacy `HUGGINGFACE_HUB_CACHE`), `HF_ENDPOINT`, `HF_TOKEN` (or
    /// `HUGGING_FACE_HUB_TOKEN`, else the file `HF_TOKEN_PATH`, default `$HF_HOME/token`) and
    /// `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`; 1, on, yes or true).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| var(k).filter(|v| !v.is_empty());
        let hf_home = get("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let cache = get("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| match std::env::home_dir() {
                Some(home) => home.join(".cache"),
                None => std::env::temp_dir(),
            });
            cache.join("huggingface")
        });
        let cache_dir = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let endpoint = get("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let token_file = get("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home.join("token"));
        let token = get("HF_TOKEN")
            .or_else(|| get("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| fs::read_to_string(token_file).ok())
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        let truthy =
            |k: &str| get(k).is_some_and(|v| ["1", "on", "yes", "true"].contains(&v.to_ascii_lowercase().as_str()));
        Self {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            cache_dir,
            token,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
        }
    }
}

/// A repository at a revision, validated so that every part is safe to use in a cache path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    repo_id: String,
    repo_type: RepoType,
    revision: String,
}

impl RepoRef {
    /// Validate `repo_id` (`org/name` or a legacy bare `name`) and `revision` (a branch, tag,
    /// commit or `refs/pr/N`).
    pub fn new(repo_id: &str, repo_type: RepoType, revision: &str) -> Result<Self> {
        check_repo_id(repo_id)?;
        check_revision(revision)?;
        Ok(Self { repo_id: repo_id.to_owned(), repo_type, revision: revision.to_owned() })
    }

    /// Parse `org/name[@revision]` (revision `main` when absent).
    pub fn parse(s: &str, repo_type: RepoType) -> Result<Self> {
        match s.split_once('@') {
            Some((id, rev)) => Self::new(id, repo_type, rev),
            None => Self::new(s, repo_type, "main"),
        }
    }

    /// The repository id (`org/name`).
    pub fn repo_id(&self) -> &str {
        &self.repo_id
    }

    /// Model or dataset.
    pub fn repo_type(&self) -> RepoType {
        self.repo_type
    }

    /// The revision asked for.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The repository's folder in the cache: `models--org--name`.
    pub fn folder_name(&self) -> String {
        format!("{}--{}", self.repo_type.plural(), self.repo_id.replace('/', "--"))
    }
}

impl fmt::Display for RepoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.repo_id, self.revision)
    }
}

/// A relative `/`-separated path with no empty, `.` or `..` component: safe to join to a
/// snapshot directory.
pub(super) fn is_safe_relative(name: &str) -> bool {
    !name.is_empty() && !name.contains(['\\', '\0']) && name.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

fn check_repo_id(id: &str) -> Result<()> {
    let bad = |problem: &str| Error::InvalidInput { input: id.to_owned(), problem: problem.to_owned() };
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() > 2 || id.len() > 96 {
        return Err(bad("a repository id is org/name"));
    }
    for part in parts {
        let ok_chars = part.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        let ok_ends = !part.starts_with(['-', '.']) && !part.ends_with(['-', '.']);
        if part.is_empty() || !ok_chars || !ok_ends || part.contains("--") || part.contains("..") {
            return Err(bad("a repository id is org/name with letters, digits, '-', '_' and '.'"));
        }
    }
    Ok(())
}

fn check_revision(rev: &str) -> Result<()> {
    let ok = is_safe_relative(rev) && rev.len() <= 255 && !rev.chars().any(char::is_control);
    if ok { Ok(()) } else { Err(Error::InvalidInput { input: rev.to_owned(), problem: "not a valid revision".into() }) }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn config_from_vars_follows_huggingface_hub() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let c = HubConfig::from_vars(vars(&[("HF_HOME", "/h"), ("HF_ENDPOINT", "http://x:1/"), ("HF_TOKEN", " t ")]));
        assert_eq!(c.cache_dir, Path::new("/h/hub"));
        assert_eq!(c.endpoint, "http://x:1");
        assert_eq!(c.token.as_deref(), Some("t"));
        assert!(!c.offline);
        let c = HubConfig::from_vars(vars(&[("HF_HOME", "/h"), ("HF_HUB_CACHE", "/c"), ("HF_HUB_OFFLINE", "YES")]));
        assert_eq!((c.cache_dir.as_path(), c.endpoint.as_str(), c.offline), (Path::new("/c"), DEFAULT_ENDPOINT, true));
        let c = HubConfig::from_vars(vars(&[("XDG_CACHE_HOME", "/x"), ("HF_HUB_OFFLINE", "0")]));
        assert_eq!(c.cache_dir, Path::new("/x/huggingface/hub"));
        assert!(!c.offline);
    }

    #[test]
    fn repo_refs_are_validated() {
        let r = RepoRef::parse("org/name@refs/pr/1", RepoType::Dataset).unwrap();
        assert_eq!((r.repo_id(), r.revision()), ("org/name", "refs/pr/1"));
        assert_eq!(r.folder_name(), "datasets--org--name");
        assert_eq!(RepoRef::parse("gpt2", RepoType::Model).unwrap().folder_name(), "models--gpt2");
        for bad in ["../x", "a/b/c", "org/-x", "org//x", "org/a--b", "", "org/name@../../x", "org/name@"] {
            assert!(RepoRef::parse(bad, RepoType::Model).is_err(), "{bad}");
        }
    }
}
