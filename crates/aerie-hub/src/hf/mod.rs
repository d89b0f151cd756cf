//! Hugging Face Hub downloads into the very cache Python `huggingface_hub` uses, so a model
//! fetched by `aerie hub download` is found by transformers, SGLang or vLLM and the other way
//! round: `$HF_HUB_CACHE` (default `$HF_HOME/hub`) holding
//! `models--org--name/{blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>, refs/<rev>}`.
//!
//! Transfers go through the `hf-hub` crate's blocking API (0.5: ureq with rustls), which writes
//! that layout. Around it this module adds what `hf-hub` lacks: the full environment of
//! `huggingface_hub` ([`HubConfig::from_env`]: `HF_HUB_CACHE`, `HF_TOKEN`, `HF_HUB_OFFLINE`,
//! ...), `--include` globs over the repository listing (fnmatch semantics, as `allow_patterns`),
//! skipping files the snapshot already holds, a size check against the listing, offline
//! resolution, and validation of every name that becomes a path (repository ids, revisions, the
//! commit and file names the server returns).
//!
//! [`resolve_model_ref`] is the one entry point the other commands use: a local path stays a
//! path, `org/name[@rev]` becomes a snapshot directory.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use globset::{Glob, GlobMatcher};
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod config;

use config::is_safe_relative;
pub use config::{DEFAULT_ENDPOINT, HubConfig, RepoRef, RepoType};

/// What [`resolve_model_ref`] downloads of a model repository: configs, safetensors weights and
/// tokenizer files, not the duplicate `.bin`, ONNX or GGUF exports many repositories also carry.
pub const MODEL_REF_INCLUDE: [&str; 6] = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja"];

/// A snapshot directory in the cache and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// The repository id.
    pub repo: String,
    /// Model or dataset.
    pub repo_type: RepoType,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// `<cache>/<folder>/snapshots/<commit>`.
    pub path: PathBuf,
    /// Files of the snapshot selected by the include globs (all of them without globs), relative,
    /// `/`-separated, sorted.
    pub files: Vec<String>,
    /// Those this call downloaded (the rest were already cached).
    pub downloaded: Vec<String>,
}

/// `--include` globs with `huggingface_hub`'s `allow_patterns` semantics: fnmatch, where `*`
/// also crosses `/`, and a pattern ending in `/` means everything below it.
struct Include {
    patterns: Vec<String>,
    globs: Vec<GlobMatcher>,
}

impl Include {
    fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self> {
        let mut out = Self { patterns: Vec::new(), globs: Vec::new() };
        for p in patterns {
            let p = p.as_ref();
            let full = if p.ends_with('/') { format!("{p}*") } else { p.to_owned() };
            let glob = Glob::new(&full)
                .map_err(|e| Error::InvalidInput { input: p.to_owned(), problem: format!("not a glob: {e}") })?;
            out.patterns.push(p.to_owned());
            out.globs.push(glob.compile_matcher());
        }
        Ok(out)
    }

    fn matches(&self, file: &str) -> bool {
        self.globs.is_empty() || self.globs.iter().any(|g| g.is_match(file))
    }

    /// The first pattern that matches none of `files`.
    fn unmatched<'a>(&'a self, files: &[String]) -> Option<&'a str> {
        let idx = self.globs.iter().position(|g| !files.iter().any(|f| g.is_match(f.as_str())))?;
        Some(&self.patterns[idx])
    }
}

/// Download the files of `repo` selected by `include` (every file when empty) into the cache and
/// return the snapshot. Files already in the snapshot with the listed size are not downloaded
/// again. Offline, answers from the cache alone. An include glob that matches nothing is an
/// error. `progress(file, done, total)` reports bytes per file.
pub fn download(
    cfg: &HubConfig,
    repo: &RepoRef,
    include: &[String],
    progress: &mut dyn FnMut(&str, u64, u64),
) -> Result<Snapshot> {
    let include = Include::new(include)?;
    if cfg.offline {
        return cached(cfg, repo, &include);
    }
    fetch(cfg, repo, &include, true, progress)
}

/// The cached snapshot of `repo`, without any network access; the error says how to fill it.
pub fn cached_snapshot(cfg: &HubConfig, repo: &RepoRef) -> Result<Snapshot> {
    cached(cfg, repo, &Include::new::<&str>(&[])?)
}

/// Resolve a model or drafter argument: an existing local path is returned as is; otherwise
/// `org/name[@revision]` is resolved to its snapshot directory in the hub cache, downloading
/// [`MODEL_REF_INCLUDE`] when missing (unless offline). Configuration comes from the
/// environment, see [`HubConfig::from_env`].
pub fn resolve_model_ref(s: &str) -> Result<PathBuf> {
    resolve_model_ref_with(s, &HubConfig::from_env(), &mut |_, _, _| {})
}

/// [`resolve_model_ref`] with an explicit configuration and a download progress callback.
pub fn resolve_model_ref_with(s: &str, cfg: &HubConfig, progress: &mut dyn FnMut(&str, u64, u64)) -> Result<PathBuf> {
    let path = Path::new(s);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    if let Some(problem) = missing_local_path(path) {
        return Err(Error::InvalidInput { input: s.to_owned(), problem });
    }
    let not_ref = |problem: String| Error::InvalidInput {
        input: s.to_owned(),
        problem: format!("no such file or directory, nor a hub reference org/name[@revision]: {problem}"),
    };
    let repo = RepoRef::parse(s, RepoType::Model).map_err(|e| not_ref(e.to_string()))?;
    if !repo.repo_id().contains('/') {
        return Err(not_ref("a hub reference names an owner (org/name)".into()));
    }
    // A commit never changes: once cached, no need to ask the hub what it resolves to.
    if is_commit(repo.revision())
        && let Ok(snap) = cached_snapshot(cfg, &repo)
    {
        return Ok(snap.path);
    }
    if cfg.offline {
        return Ok(cached_snapshot(cfg, &repo)?.path);
    }
    match fetch(cfg, &repo, &Include::new(&MODEL_REF_INCLUDE)?, false, progress) {
        Ok(snap) => Ok(snap.path),
        // Hub unreachable but the snapshot is cached: use it, as huggingface_hub does.
        Err(err @ Error::Http { status: None, .. }) => cached_snapshot(cfg, &repo).map(|s| s.path).map_err(|_| err),
        Err(err) => Err(err),
    }
}

/// A mistyped local path is not a hub id: when the parent of `path` is an existing local
/// directory (`runs/` of `runs/chkpoint`, or `./x`), `path` names a path that is missing, and
/// asking the Hub for it would only turn a typo into a network or cache error. Says what the
/// parent holds that is nearest by name. Hub ids whose owner is not a local directory pass.
fn missing_local_path(path: &Path) -> Option<String> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty() && p.is_dir())?;
    let name = path.file_name()?.to_string_lossy().into_owned();
    let nearest = std::fs::read_dir(parent)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .map(|n| (strsim::levenshtein(&name.to_lowercase(), &n.to_lowercase()), n))
        .filter(|(d, _)| *d <= (name.chars().count() / 3).max(2))
        .min();
    let hint = match nearest {
        Some((_, n)) => format!("; did you mean `{}`?", parent.join(n).display()),
        None => String::new(),
    };
    Some(format!(
        "no such file or directory (its parent `{}` is a local directory, so this is a path, not a hub id){hint}",
        parent.display()
    ))
}

/// The listing of a repository at a revision (`/api/{models,datasets}/{id}/revision/{rev}`).
#[derive(Debug, Deserialize)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Debug, Deserialize)]
struct LfsInfo {
    size: u64,
}

fn cached(cfg: &HubConfig, repo: &RepoRef, include: &Include) -> Result<Snapshot> {
    let cache = absolute(&cfg.cache_dir)?;
    let folder = cache.join(repo.folder_name());
    let offline = |problem: String| Error::Offline {
        repo: repo.repo_id().to_owned(),
        revision: repo.revision().to_owned(),
        cache: cache.clone(),
        problem,
    };
    let commit = local_commit(&folder, repo.revision()).ok_or_else(|| offline("no snapshot".into()))?;
    let dir = folder.join("snapshots").join(&commit);
    if !dir.is_dir() {
        return Err(offline(format!("snapshot {commit} is missing")));
    }
    let mut all = Vec::new();
    walk(&dir, "", &mut all)?;
    all.sort();
    if let Some(p) = include.unmatched(&all) {
        return Err(offline(format!("no file matching {p:?}")));
    }
    Ok(Snapshot {
        repo: repo.repo_id().to_owned(),
        repo_type: repo.repo_type(),
        revision: repo.revision().to_owned(),
        commit,
        path: dir,
        files: all.into_iter().filter(|f| include.matches(f)).collect(),
        downloaded: Vec::new(),
    })
}

/// The commit a revision points to in the cache: the revision itself when it is a cached commit,
/// else `refs/<revision>`.
fn local_commit(folder: &Path, revision: &str) -> Option<String> {
    if is_commit(revision) && folder.join("snapshots").join(revision).is_dir() {
        return Some(revision.to_owned());
    }
    let commit = fs::read_to_string(folder.join("refs").join(revision)).ok()?;
    let commit = commit.trim();
    let safe = !commit.is_empty() && !commit.contains(['/', '\\']) && commit != "." && commit != "..";
    safe.then(|| commit.to_owned())
}

fn fetch(
    cfg: &HubConfig,
    repo: &RepoRef,
    include: &Include,
    strict: bool,
    progress: &mut dyn FnMut(&str, u64, u64),
) -> Result<Snapshot> {
    // hf-hub computes relative symlink targets and asserts the cache path is absolute.
    let cache = absolute(&cfg.cache_dir)?;
    let api_url = format!(
        "{}/api/{}/{}/revision/{}",
        cfg.endpoint,
        repo.repo_type().plural(),
        repo.repo_id(),
        repo.revision().replace('/', "%2F")
    );
    if !(cfg.endpoint.starts_with("https://") || cfg.endpoint.starts_with("http://")) {
        return Err(Error::InvalidInput {
            input: cfg.endpoint.clone(),
            problem: "HF_ENDPOINT must be an http(s) URL".into(),
        });
    }
    let api = ApiBuilder::from_cache(hf_hub::Cache::new(cache.clone()))
        .with_endpoint(cfg.endpoint.clone())
        .with_token(cfg.token.clone())
        .with_progress(false)
        .with_retries(3)
        .with_user_agent("aerie", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|e| api_error(&cfg.endpoint, e))?;
    let hf_repo = api.repo(hf_hub::Repo::with_revision(
        repo.repo_id().to_owned(),
        repo.repo_type().hf(),
        repo.revision().to_owned(),
    ));

    let info = repo_info(&hf_repo, &api_url)?;
    let bad = |problem: String| Error::BadResponse { url: api_url.clone(), problem };
    if !is_commit(&info.sha) {
        return Err(bad(format!("sha {:?} is not a commit id", info.sha)));
    }
    let selected: Vec<&Sibling> = info.siblings.iter().filter(|s| include.matches(&s.rfilename)).collect();
    let names: Vec<String> = selected.iter().map(|s| s.rfilename.clone()).collect();
    if let Some(pattern) = include.unmatched(&names).filter(|_| strict) {
        return Err(Error::NoMatch {
            repo: repo.repo_id().to_owned(),
            revision: repo.revision().to_owned(),
            pattern: pattern.to_owned(),
        });
    }
    if selected.is_empty() && !strict {
        return Err(Error::NoMatch {
            repo: repo.repo_id().to_owned(),
            revision: repo.revision().to_owned(),
            pattern: include.patterns.join(" "),
        });
    }
    for name in &names {
        if !is_safe_relative(name) {
            return Err(bad(format!("unsafe file name {name:?}")));
        }
    }

    let folder = cache.join(repo.folder_name());
    let snapshot = folder.join("snapshots").join(&info.sha);
    let mut downloaded = Vec::new();
    for sib in selected {
        let name = sib.rfilename.as_str();
        let pointer = snapshot.join(name);
        let expected = sib.lfs.as_ref().map(|l| l.size).or(sib.size);
        let present = fs::metadata(&pointer).is_ok_and(|m| m.is_file() && expected.is_none_or(|e| e == m.len()));
        if present {
            continue;
        }
        // A dangling link or a file of the wrong size: replace it.
        if fs::symlink_metadata(&pointer).is_ok() {
            fs::remove_file(&pointer).map_err(|source| Error::Io { path: pointer.clone(), source })?;
        }
        let url = hf_repo.url(name);
        let reporter = Reporter { file: name, done: 0, total: 0, cb: &mut *progress };
        let got = hf_repo.download_with_progress(name, reporter).map_err(|e| api_error(&url, e))?;
        if got != pointer {
            return Err(Error::BadResponse {
                url,
                problem: format!(
                    "served from another commit than the listing's {} (the revision moved while downloading; run again)",
                    info.sha
                ),
            });
        }
        if let Some(expected) = expected {
            let len = fs::metadata(&got).map_err(|source| Error::Io { path: got.clone(), source })?.len();
            if len != expected {
                // Drop the blob and its link so the next run downloads it afresh.
                if let Ok(blob) = fs::canonicalize(&got) {
                    let _ = fs::remove_file(blob);
                }
                let _ = fs::remove_file(&got);
                return Err(Error::Truncated { url, expected, got: len });
            }
        }
        downloaded.push(name.to_owned());
    }
    write_ref(&folder, repo.revision(), &info.sha)?;
    let mut files = names;
    files.sort();
    downloaded.sort();
    Ok(Snapshot {
        repo: repo.repo_id().to_owned(),
        repo_type: repo.repo_type(),
        revision: repo.revision().to_owned(),
        commit: info.sha,
        path: snapshot,
        files,
        downloaded,
    })
}

fn repo_info(hf_repo: &ApiRepo, url: &str) -> Result<RepoInfo> {
    let mut resp = hf_repo.info_request().query("blobs", "true").call().map_err(|e| hub_http_error(url, e))?;
    serde_json::from_reader(resp.body_mut().as_reader().take(256 << 20))
        .map_err(|e| Error::BadResponse { url: url.to_owned(), problem: format!("not a repository listing: {e}") })
}

/// `refs/<revision>` holds the commit, as huggingface_hub writes it; hf-hub writes it too, but
/// not when every file was already cached, and also for a commit revision, which
/// huggingface_hub never does.
fn write_ref(folder: &Path, revision: &str, commit: &str) -> Result<()> {
    let path = folder.join("refs").join(revision);
    if revision == commit {
        if fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
            fs::remove_file(&path).map_err(|source| Error::Io { path, source })?;
        }
        return Ok(());
    }
    if fs::read_to_string(&path).is_ok_and(|c| c == commit) {
        return Ok(());
    }
    let io_err = |source| Error::Io { path: path.clone(), source };
    fs::create_dir_all(path.parent().unwrap_or(folder)).map_err(io_err)?;
    fs::write(&path, commit).map_err(io_err)
}

/// Forwards hf-hub's byte counts for one file to the caller's callback.
struct Reporter<'a> {
    file: &'a str,
    done: u64,
    total: u64,
    cb: &'a mut dyn FnMut(&str, u64, u64),
}

impl hf_hub::api::Progress for Reporter<'_> {
    fn init(&mut self, size: usize, _filename: &str) {
        self.total = size as u64;
        self.done = 0;
        (self.cb)(self.file, 0, self.total);
    }

    fn update(&mut self, size: usize) {
        self.done += size as u64;
        (self.cb)(self.file, self.done, self.total);
    }

    fn finish(&mut self) {}
}

fn hub_http_error(url: &str, err: ureq::Error) -> Error {
    let problem = match &err {
        ureq::Error::StatusCode(401) => {
            "HTTP 401 unauthorized: the repository does not exist, or is private or gated; set HF_TOKEN".to_owned()
        }
        ureq::Error::StatusCode(403) => {
            "HTTP 403 forbidden: a gated repository whose terms this token has not accepted".to_owned()
        }
        ureq::Error::StatusCode(404) => {
            "HTTP 404 not found: check the repository id, --repo-type and --revision".to_owned()
        }
        ureq::Error::StatusCode(c) => format!("HTTP status {c}"),
        other => other.to_string(),
    };
    let status = match err {
        ureq::Error::StatusCode(c) => Some(c),
        _ => None,
    };
    Error::Http { url: url.to_owned(), status, problem }
}

fn api_error(url: &str, err: ApiError) -> Error {
    match err {
        ApiError::RequestError(e) => hub_http_error(url, *e),
        ApiError::TooManyRetries(e) => api_error(url, *e),
        ApiError::MissingHeader(h) => Error::BadResponse {
            url: url.to_owned(),
            problem: format!("missing header {h} (is the endpoint a Hugging Face Hub?)"),
        },
        ApiError::InvalidHeader(h) => {
            Error::BadResponse { url: url.to_owned(), problem: format!("invalid header {h}") }
        }
        other => Error::Http { url: url.to_owned(), status: None, problem: other.to_string() },
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|source| Error::Io { path: path.to_owned(), source })
}

/// All files below `dir` (following symlinks), as `/`-joined paths relative to it.
fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
    let io_err = |source: io::Error| Error::Io { path: dir.to_owned(), source };
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        match fs::metadata(entry.path()) {
            Ok(m) if m.is_dir() => walk(&entry.path(), &rel, out)?,
            Ok(_) => out.push(rel),
            Err(_) => {} // a dangling link is not a file of the snapshot
        }
    }
    Ok(())
}

fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_globs_cross_slashes_like_fnmatch() {
        let inc = Include::new(&["*.json", "onnx/"]).unwrap();
        assert!(inc.matches("config.json") && inc.matches("sub/x.json") && inc.matches("onnx/model.onnx"));
        assert!(!inc.matches("model.safetensors"));
        assert_eq!(inc.unmatched(&["a.json".into()]), Some("onnx/"));
        assert!(Include::new(&["a[".to_string()]).is_err());
    }
}
