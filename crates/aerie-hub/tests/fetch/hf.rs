//! Hub downloads against a hub-shaped loopback server: listing, `resolve` with the headers
//! `hf_hub_download` reads, an LFS file behind a 302 to a "CDN" path, then the cache layout and
//! offline resolution.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use aerie_hub::Error;
use aerie_hub::hf::{self, HubConfig, RepoRef, RepoType};

use crate::server::{Reply, Server};
use crate::sha256_hex;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64}"#;
const TOKENIZER: &str = r#"{"version": "1.0", "model": {"type": "BPE"}}"#;
const README: &str = "# tiny drafter\n";
// Git blob ids of the small files, as the hub sends in ETag.
const CONFIG_ETAG: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
const TOKENIZER_ETAG: &str = "b1b2c3d4e5f60718293a4b5c6d7e8f9012345678";

fn weights() -> Vec<u8> {
    (0..300_000u32).map(|i| (i % 251) as u8).collect()
}

/// `org/name` at `main` (and its commit): config.json, tokenizer.json and README.md served
/// directly, model.safetensors as an LFS file redirected to `/cdn/<sha256>`.
fn hub_routes(base: &str) -> HashMap<String, Reply> {
    let w = weights();
    let lfs_sha = sha256_hex(&w);
    let listing = serde_json::json!({
        "id": "org/name", "sha": COMMIT,
        "siblings": [
            {"rfilename": ".gitattributes", "size": 10},
            {"rfilename": "README.md", "size": README.len()},
            {"rfilename": "config.json", "size": CONFIG.len(), "blobId": CONFIG_ETAG},
            {"rfilename": "model.safetensors", "size": w.len(),
             "lfs": {"sha256": lfs_sha, "size": w.len(), "pointerSize": 134}},
            {"rfilename": "tokenizer.json", "size": TOKENIZER.len(), "blobId": TOKENIZER_ETAG},
        ]
    })
    .to_string();
    let small = |body: &str, etag: &str| {
        Reply::ok(body.as_bytes().to_vec())
            .header("ETag", &format!("\"{etag}\""))
            .header("X-Repo-Commit", COMMIT)
            .header("Content-Type", "application/json")
    };
    let mut routes = HashMap::new();
    for rev in ["main", COMMIT] {
        routes.insert(format!("/api/models/org/name/revision/{rev}"), Reply::ok(listing.clone()));
        routes.insert(format!("/org/name/resolve/{rev}/config.json"), small(CONFIG, CONFIG_ETAG));
        routes.insert(format!("/org/name/resolve/{rev}/tokenizer.json"), small(TOKENIZER, TOKENIZER_ETAG));
        routes.insert(format!("/org/name/resolve/{rev}/README.md"), small(README, "c0"));
        routes.insert(
            format!("/org/name/resolve/{rev}/model.safetensors"),
            Reply::redirect(&format!("{base}/cdn/{lfs_sha}"))
                .header("ETag", "\"pointer-etag\"")
                .header("X-Linked-Etag", &format!("\"{lfs_sha}\""))
                .header("X-Linked-Size", &w.len().to_string())
                .header("X-Repo-Commit", COMMIT),
        );
    }
    routes.insert(format!("/cdn/{lfs_sha}"), Reply::ok(w));
    // A dataset repository, to check the second namespace.
    routes.insert(
        "/api/datasets/org/data/revision/main".into(),
        Reply::ok(
            serde_json::json!({"sha": COMMIT, "siblings": [{"rfilename": "data/train.jsonl", "size": 3}]}).to_string(),
        ),
    );
    routes.insert(
        "/datasets/org/data/resolve/main/data/train.jsonl".into(),
        Reply::ok(b"{}\n".to_vec()).header("ETag", "\"d0\"").header("X-Repo-Commit", COMMIT),
    );
    routes
}

fn config(server: &Server, cache: &Path) -> HubConfig {
    HubConfig {
        endpoint: server.base().to_owned(),
        cache_dir: cache.to_owned(),
        token: Some("hf_test".into()),
        offline: false,
    }
}

fn repo(s: &str) -> RepoRef {
    RepoRef::parse(s, RepoType::Model).unwrap()
}

fn globs(g: &[&str]) -> Vec<String> {
    g.iter().map(|s| s.to_string()).collect()
}

#[test]
fn download_with_include_writes_the_python_cache_layout() {
    let server = Server::start(64, hub_routes);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&server, tmp.path());
    let mut seen_files = Vec::new();
    let snap = hf::download(&cfg, &repo("org/name"), &globs(&["*.json", "*.safetensors"]), &mut |f, done, total| {
        if done == total {
            seen_files.push(f.to_owned());
        }
    })
    .unwrap();

    let folder = tmp.path().join("models--org--name");
    let snapdir = folder.join("snapshots").join(COMMIT);
    assert_eq!(snap.path, snapdir);
    assert_eq!(snap.commit, COMMIT);
    assert_eq!(snap.files, ["config.json", "model.safetensors", "tokenizer.json"]);
    assert_eq!(snap.downloaded, snap.files);
    assert!(seen_files.contains(&"model.safetensors".to_owned()));

    // refs/main holds the commit; blobs are named by etag (the LFS sha256 for the big file);
    // snapshot entries are relative symlinks into blobs.
    assert_eq!(fs::read_to_string(folder.join("refs/main")).unwrap(), COMMIT);
    let lfs_sha = sha256_hex(&weights());
    assert_eq!(fs::read(folder.join("blobs").join(CONFIG_ETAG)).unwrap(), CONFIG.as_bytes());
    assert_eq!(fs::read(folder.join("blobs").join(&lfs_sha)).unwrap(), weights());
    for (file, blob) in
        [("config.json", CONFIG_ETAG), ("tokenizer.json", TOKENIZER_ETAG), ("model.safetensors", &lfs_sha)]
    {
        let link = snapdir.join(file);
        assert_eq!(fs::read_link(&link).unwrap(), PathBuf::from("../../blobs").join(blob), "{file}");
    }
    assert!(!snapdir.join("README.md").exists());
    assert!(!server.requests().iter().any(|r| r.contains("README")), "{:?}", server.requests());
    assert!(
        !folder.join("blobs").read_dir().unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".part"))
    );

    // The token goes with the listing request.
    let api = server.seen().into_iter().find(|s| s.path.starts_with("/api/")).unwrap();
    assert_eq!(api.header("authorization"), Some("Bearer hf_test"));

    // A second run asks for the listing only.
    let before = server.requests().len();
    let again = hf::download(&cfg, &repo("org/name"), &globs(&["*.json", "*.safetensors"]), &mut |_, _, _| {}).unwrap();
    assert!(again.downloaded.is_empty());
    assert_eq!(again.path, snapdir);
    assert_eq!(server.requests()[before..], ["GET /api/models/org/name/revision/main"]);
}

#[test]
fn offline_resolves_from_the_cache_and_fails_clearly_when_absent() {
    let server = Server::start(64, hub_routes);
    let tmp = tempfile::tempdir().unwrap();
    let online = config(&server, tmp.path());
    let offline = HubConfig { offline: true, endpoint: "http://127.0.0.1:9".into(), ..online.clone() };

    // Nothing cached yet.
    let err = hf::download(&offline, &repo("org/name"), &[], &mut |_, _, _| {}).unwrap_err();
    assert!(matches!(err, Error::Offline { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("org/name@main") && msg.contains("HF_HUB_OFFLINE"), "{msg}");
    assert!(msg.contains(&tmp.path().display().to_string()), "{msg}");
    assert!(server.requests().is_empty());

    let snap = hf::download(&online, &repo("org/name"), &globs(&["config.json"]), &mut |_, _, _| {}).unwrap();
    let n = server.requests().len();

    let cached = hf::download(&offline, &repo("org/name"), &[], &mut |_, _, _| {}).unwrap();
    assert_eq!(cached.path, snap.path);
    assert_eq!(cached.files, ["config.json"]);
    assert!(cached.downloaded.is_empty());
    // By commit too, and through resolve_model_ref.
    assert_eq!(hf::cached_snapshot(&offline, &repo(&format!("org/name@{COMMIT}"))).unwrap().path, snap.path);
    assert_eq!(hf::resolve_model_ref_with("org/name", &offline, &mut |_, _, _| {}).unwrap(), snap.path);
    assert_eq!(hf::resolve_model_ref_with("org/name@main", &offline, &mut |_, _, _| {}).unwrap(), snap.path);
    assert_eq!(server.requests().len(), n, "offline makes no request");

    // A file the snapshot lacks, another revision, another repository: clear errors.
    let err = hf::download(&offline, &repo("org/name"), &globs(&["*.safetensors"]), &mut |_, _, _| {}).unwrap_err();
    assert!(err.to_string().contains("no file matching \"*.safetensors\""), "{err}");
    let err = hf::resolve_model_ref_with("org/name@v2", &offline, &mut |_, _, _| {}).unwrap_err();
    assert!(matches!(err, Error::Offline { .. }), "{err}");
    let err = hf::resolve_model_ref_with("org/other", &offline, &mut |_, _, _| {}).unwrap_err();
    assert!(err.to_string().contains("org/other@main"), "{err}");
}

#[test]
fn resolve_model_ref_downloads_model_files_once() {
    let server = Server::start(64, hub_routes);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&server, tmp.path());
    let dir = hf::resolve_model_ref_with("org/name", &cfg, &mut |_, _, _| {}).unwrap();
    assert_eq!(dir, tmp.path().join("models--org--name/snapshots").join(COMMIT));
    assert!(dir.join("config.json").is_file() && dir.join("model.safetensors").is_file());
    assert!(!dir.join("README.md").exists() && !dir.join(".gitattributes").exists());

    // A cached commit is answered without asking the hub.
    let n = server.requests().len();
    assert_eq!(hf::resolve_model_ref_with(&format!("org/name@{COMMIT}"), &cfg, &mut |_, _, _| {}).unwrap(), dir);
    assert_eq!(server.requests().len(), n);

    // A local path stays as it is; a string that is neither is refused up front.
    let local = tmp.path().join("drafter");
    fs::create_dir(&local).unwrap();
    let local_str = local.to_str().unwrap();
    assert_eq!(hf::resolve_model_ref_with(local_str, &cfg, &mut |_, _, _| {}).unwrap(), local);
    for bad in ["no-such-dir", "a/b/c", "../x/y"] {
        let err = hf::resolve_model_ref_with(bad, &cfg, &mut |_, _, _| {}).unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{bad}: {err}");
    }
    assert_eq!(server.requests().len(), n);
}

#[test]
fn hub_errors_name_the_url_and_the_cause() {
    let server = Server::start(64, hub_routes);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&server, tmp.path());

    let err = hf::download(&cfg, &repo("org/name"), &globs(&["*.bin"]), &mut |_, _, _| {}).unwrap_err();
    assert!(matches!(&err, Error::NoMatch { pattern, .. } if pattern == "*.bin"), "{err}");

    let err = hf::download(&cfg, &repo("org/missing"), &[], &mut |_, _, _| {}).unwrap_err();
    assert!(matches!(err, Error::Http { status: Some(404), .. }), "{err}");
    assert!(err.to_string().contains("/api/models/org/missing/revision/main"), "{err}");
    assert!(err.to_string().contains("--repo-type"), "{err}");

    // The cache holds nothing from failed attempts but the repo folder hf-hub may create.
    assert!(!tmp.path().join("models--org--missing/snapshots").exists());
}

#[test]
fn datasets_use_their_own_namespace() {
    let server = Server::start(16, hub_routes);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&server, tmp.path());
    let repo = RepoRef::parse("org/data", RepoType::Dataset).unwrap();
    let snap = hf::download(&cfg, &repo, &globs(&["data/"]), &mut |_, _, _| {}).unwrap();
    assert_eq!(snap.path, tmp.path().join("datasets--org--data/snapshots").join(COMMIT));
    assert_eq!(snap.files, ["data/train.jsonl"]);
    assert_eq!(fs::read_link(snap.path.join("data/train.jsonl")).unwrap(), Path::new("../../../blobs/d0"));
    assert_eq!(fs::read_to_string(snap.path.join("data/train.jsonl")).unwrap(), "{}\n");
}
