//! The house rules of `docs/architecture.md`, checked on the source tree so that they stay true:
//! crate dependencies point down the pipeline's layers only, no two sibling modules of a crate
//! (or of the Python worker's package) import each other (directly or round a loop), and no source
//! file outside `tests/` runs past 600 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// The layer of each crate: a crate may depend only on crates of a lower layer. aerie-model
/// (burn) and aerie-engine (serving engines) share a layer, so neither uses the other: the model
/// never talks HTTP or starts Python, the engine room never runs a tensor.
fn layer(krate: &str) -> Option<u32> {
    Some(match krate {
        "aerie-data" => 0,
        "aerie-model" | "aerie-engine" => 1,
        "aerie-hub" | "aerie-capture" | "aerie-train" | "aerie-eval" => 2,
        "aerie-cli" => 3,
        _ => return None,
    })
}

/// cli → {hub, capture, train, eval} → {model, engine} → data, as `[dependencies]` (and build and
/// dev-dependencies) of each crate's Cargo.toml name them.
#[test]
fn crate_dependencies_point_down_the_layers() {
    let root = workspace();
    let mut seen = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        let own = layer(&name).unwrap_or_else(|| panic!("{name}: a crate with no layer in this test (add it)"));
        seen += 1;
        let mut in_deps = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_deps = line.contains("dependencies");
                continue;
            }
            let key = line.split(['=', '.', ' ']).next().unwrap_or_default();
            if in_deps && let Some(dep) = layer(key) {
                assert!(dep < own, "{}: {name} depends on {key}, which is not below it", manifest.display());
            }
        }
    }
    assert_eq!(seen, 8, "expected the eight aerie crates under crates/");
}

/// Source files outside `tests/` (Rust and Python) stay readable in one sitting.
#[test]
fn no_source_file_outside_tests_passes_600_lines() {
    let root = workspace();
    let mut files = Vec::new();
    for (dir, ext) in [("crates", "rs"), ("python", "py"), ("scripts", "py")] {
        files_under(&root.join(dir), ext, &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .filter(|p| !p.components().any(|c| c.as_os_str() == "tests"))
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).ok()?.lines().count();
            (n > 600).then(|| format!("{} ({n} lines)", p.strip_prefix(&root).unwrap().display()))
        })
        .collect();
    assert!(files.len() > 100, "found only {} source files: is the tree where this test looks?", files.len());
    assert!(long.is_empty(), "source files over 600 lines: {long:?}");
}

/// A crate's modules as paths from the crate root (`["shard", "reader"]`), with their files.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut files = Vec::new();
    files_under(src, "rs", &mut files);
    files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(src).unwrap().with_extension("");
            let mut path: Vec<String> =
                rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                path.pop();
            }
            (path, f)
        })
        .collect()
}

/// Every module `file` (module `path`) names through `crate::`, `super::` or `self::` paths,
/// outside its `#[cfg(test)] mod tests` and comments.
fn references(path: &[String], file: &Path, known: &BTreeMap<Vec<String>, PathBuf>) -> BTreeSet<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap();
        let bytes = code.as_bytes();
        for start in ["crate::", "super::", "self::"].iter().flat_map(|s| code.match_indices(s).map(|(i, _)| i)) {
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let words: Vec<&str> = code[start..]
                .split("::")
                .map(|w| w.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or_default())
                .take_while(|w| !w.is_empty())
                .collect();
            let mut target: Vec<String> = path.to_vec();
            let mut rest = &words[..];
            if rest.first() == Some(&"crate") {
                target.clear();
                rest = &rest[1..];
            } else {
                while let Some(&w) = rest.first().filter(|w| **w == "super" || **w == "self") {
                    if w == "super" {
                        target.pop();
                    }
                    rest = &rest[1..];
                }
            }
            target.extend(rest.iter().map(|w| w.to_string()));
            while !target.is_empty() && !known.contains_key(&target) {
                target.pop();
            }
            if target != path {
                out.insert(target);
            }
        }
    }
    out
}

/// The loops among sibling modules of `edges` (module → the modules it names): each as
/// `LABEL parent::module`.
fn sibling_loops(label: &str, edges: &[(Vec<String>, BTreeSet<Vec<String>>)]) -> Vec<String> {
    let mut loops = Vec::new();
    let parents: BTreeSet<Vec<String>> =
        edges.iter().map(|(m, _)| m).filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).collect();
    for parent in parents {
        let unit = |m: &[String]| (m.len() > parent.len() && m.starts_with(&parent)).then(|| m[parent.len()].clone());
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, targets) in edges {
            let Some(from) = unit(m) else { continue };
            for t in targets {
                if let Some(to) = unit(t).filter(|to| *to != from) {
                    graph.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        // A loop: some unit reaches itself.
        for start in graph.keys() {
            let mut stack: Vec<&String> = graph[start].iter().collect();
            let mut seen = BTreeSet::new();
            while let Some(u) = stack.pop() {
                if u == start {
                    loops.push(format!("{label} {}::{start}", parent.join("::")));
                    break;
                }
                if seen.insert(u.clone()) {
                    stack.extend(graph.get(u).into_iter().flatten());
                }
            }
        }
    }
    loops
}

/// No two sibling modules (children of one parent, a folder module counting with everything
/// under it) reach each other through their imports: a loop means a helper sits in the wrong file.
#[test]
fn no_import_loops_between_sibling_modules() {
    let root = workspace();
    let mut loops = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mods = modules(&src);
        let edges: Vec<(Vec<String>, BTreeSet<Vec<String>>)> =
            mods.iter().map(|(m, f)| (m.clone(), references(m, f, &mods))).collect();
        loops.extend(sibling_loops(&entry.file_name().to_string_lossy(), &edges));
    }
    assert!(loops.is_empty(), "modules on an import loop with a sibling: {loops:?}");
}

/// A Python package's modules as paths from the package (`["engines", "hf"]`; a package's
/// `__init__.py` is the package itself), with their files.
fn python_modules(package: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut files = Vec::new();
    files_under(package, "py", &mut files);
    files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(package).unwrap().with_extension("");
            let mut path: Vec<String> =
                rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if path.last().is_some_and(|l| l == "__init__") {
                path.pop();
            }
            (path, f)
        })
        .collect()
}

/// The modules of `package` (named `name`) that `file` (module `path`) imports, relatively
/// (`from .x import y`, `from .. import z`) or by the package's name, anywhere in the file (an
/// import inside a function closes a loop just the same once it runs).
fn python_references(
    name: &str,
    path: &[String],
    file: &Path,
    known: &BTreeMap<Vec<String>, PathBuf>,
) -> BTreeSet<Vec<String>> {
    let is_package = file.file_name().is_some_and(|f| f == "__init__.py");
    let here: Vec<String> = if is_package { path.to_vec() } else { path[..path.len().saturating_sub(1)].to_vec() };
    let mut out = BTreeSet::new();
    for line in std::fs::read_to_string(file).unwrap().lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("from ") else { continue };
        let Some((from, names)) = rest.split_once(" import ") else { continue };
        let dots = from.chars().take_while(|&c| c == '.').count();
        let mut target = if dots > 0 {
            here[..here.len().saturating_sub(dots - 1)].to_vec()
        } else if from == name || from.starts_with(&format!("{name}.")) {
            Vec::new()
        } else {
            continue;
        };
        let module =
            if dots > 0 { &from[dots..] } else { from.strip_prefix(name).unwrap_or("").trim_start_matches('.') };
        target.extend(module.split('.').filter(|w| !w.is_empty()).map(String::from));
        // `from . import a, b`: each name may be a module of its own.
        for n in names.trim_matches(|c| c == '(' || c == ')').split(',') {
            let n = n.split_whitespace().next().unwrap_or_default();
            let mut t = target.clone();
            t.push(n.to_string());
            while !t.is_empty() && !known.contains_key(&t) {
                t.pop();
            }
            if t != path {
                out.insert(t);
            }
        }
    }
    out
}

/// The Python worker keeps the rule too: no sibling modules of `python/aerie_capture` import
/// each other (worker.py and selftest.py once did, over `build_engine`).
#[test]
fn no_import_loops_between_sibling_python_modules() {
    let package = workspace().join("python/aerie_capture");
    let mods = python_modules(&package);
    assert!(mods.contains_key(&vec!["worker".to_string()]), "{mods:?}");
    let edges: Vec<(Vec<String>, BTreeSet<Vec<String>>)> =
        mods.iter().map(|(m, f)| (m.clone(), python_references("aerie_capture", m, f, &mods))).collect();
    // The check sees imports inside functions: the worker starts the self-test from `main`.
    let worker = edges.iter().find(|(p, _)| *p == ["worker"]).map(|(_, t)| t.clone()).unwrap();
    assert!(worker.contains(&vec!["selftest".to_string()]), "{worker:?}");
    let loops = sibling_loops("aerie_capture", &edges);
    assert!(loops.is_empty(), "Python modules on an import loop with a sibling: {loops:?}");
}
