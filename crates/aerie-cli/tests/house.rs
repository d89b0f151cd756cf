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
        "aerie-data" | "aerie-plot" => 0,
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
    assert_eq!(seen, 9, "expected the nine aerie crates under crates/");
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

/// The string literals of Rust source `text` outside comments and its `#[cfg(test)] mod tests`
/// (plain, byte and raw strings; char literals and lifetimes skipped), each with its line.
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    let b: Vec<char> = text.chars().collect();
    let line_of = |i: usize| b[..i].iter().filter(|&&c| c == '\n').count() + 1;
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            '/' if b.get(i + 1) == Some(&'/') => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            '/' if b.get(i + 1) == Some(&'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == '*' && b[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            'r' if matches!(b.get(i + 1), Some('"' | '#'))
                && (i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == '#').count();
                if b.get(i + 1 + hashes) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let start = i + 2 + hashes;
                let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let rest: String = b[start..].iter().collect();
                let len = rest.find(&close).unwrap_or(rest.len());
                out.push((line_of(i), rest[..len].to_string()));
                i = start + rest[..len].chars().count() + close.len();
            }
            '"' => {
                let start = i + 1;
                i += 1;
                while i < b.len() && b[i] != '"' {
                    i += if b[i] == '\\' { 2 } else { 1 };
                }
                out.push((line_of(start), b[start..i.min(b.len())].iter().collect()));
                i += 1;
            }
            // A char literal (`'"'`, `'\''`); a lifetime (`'a`) is left as code.
            '\'' if b.get(i + 1) == Some(&'\\') => {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            '\'' if b.get(i + 2) == Some(&'\'') => i += 3,
            _ => i += 1,
        }
    }
    out
}

/// Engine names and engine flags in string literals of `text`, as `LINE: "literal" (why)`: a
/// literal that is exactly a serving engine's name (the identity of an engine, parsed in one
/// place: `aerie_engine::Engine`), one of the command-line flags or environment variables of an
/// engine aerie starts (built in one place: `aerie_engine::launch`). Prose that mentions an
/// engine (an error saying what vLLM does) is not an identity and passes.
fn engine_names(text: &str, names_allowed: bool) -> Vec<String> {
    const NAMES: [&str; 3] = ["vllm", "sglang", "openai"];
    const FLAGS: [&str; 13] = [
        "--speculative-config",
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--served-model-name",
        "--enable-metrics",
        "--context-length",
        "--model-path",
        "--kv-cache-memory-bytes",
        "--max-total-tokens",
        "--mem-fraction-static",
    ];
    string_literals(text)
        .into_iter()
        .filter_map(|(line, s)| {
            let why = if !names_allowed && NAMES.iter().any(|n| s.eq_ignore_ascii_case(n)) {
                "an engine's name"
            } else if FLAGS.contains(&s.as_str()) {
                "an engine's flag"
            } else if s.starts_with("VLLM_") || s.starts_with("SGLANG_") {
                "an engine's environment"
            } else {
                return None;
            };
            Some(format!("{line}: \"{s}\" ({why})"))
        })
        .collect()
}

/// Only the engine room names an engine. Outside aerie-engine no library or CLI source (tests
/// aside) holds an engine's name as a string literal, or an engine's flag or environment
/// variable: a flag that names an engine parses into `aerie_engine::Engine`, and an engine's
/// command line is `aerie_engine::launch`'s. The drafter layouts named after the engines (`export
/// --to sglang|speculators`: aerie-model's checkpoint `Dialect`, aerie-hub's `export`, `served`
/// and `inspect`) may name them, never their flags.
#[test]
fn only_the_engine_room_names_an_engine() {
    let root = workspace();
    let layouts = [
        "aerie-model/src/checkpoint/",
        "aerie-hub/src/export.rs",
        "aerie-hub/src/served.rs",
        "aerie-hub/src/inspect.rs",
    ];
    let mut files = Vec::new();
    files_under(&root.join("crates"), "rs", &mut files);
    let mut found = Vec::new();
    let mut scanned = 0;
    for f in &files {
        let rel = f.strip_prefix(root.join("crates")).unwrap().to_string_lossy().into_owned();
        if rel.starts_with("aerie-engine/") || !rel.contains("/src/") {
            continue;
        }
        scanned += 1;
        let allowed = layouts.iter().any(|l| rel.starts_with(l));
        found.extend(
            engine_names(&std::fs::read_to_string(f).unwrap(), allowed).into_iter().map(|m| format!("{rel}:{m}")),
        );
    }
    assert!(scanned > 100, "scanned only {scanned} files");
    assert!(found.is_empty(), "engine names outside aerie-engine: {found:#?}");
}

/// The rule on planted code: what it catches and what it lets pass.
#[test]
fn the_engine_rule_catches_a_planted_name_and_passes_prose() {
    let planted = r##"
// "vllm" in a comment is not code
/// Doc: `--engine vllm`.
fn api(s: &str) -> u8 { match s { "vLLM" => 1, "sglang" => 2, _ => 0 } }
fn args() -> [&'static str; 2] { ["--speculative-config", r#"x"#] }
fn env() -> &'static str { if '"' == '\'' { "x" } else { "VLLM_CPU_KVCACHE_SPACE" } }
fn say() -> String { "speculation was expected but vLLM's counters did not move".into() }
#[cfg(test)]
mod tests { const A: &str = "vllm"; }
"##;
    assert_eq!(
        engine_names(planted, false),
        [
            "4: \"vLLM\" (an engine's name)",
            "4: \"sglang\" (an engine's name)",
            "5: \"--speculative-config\" (an engine's flag)",
            "6: \"VLLM_CPU_KVCACHE_SPACE\" (an engine's environment)",
        ]
    );
    // A drafter layout may say `sglang`, never an engine's flag.
    assert_eq!(engine_names(planted, true).len(), 2);
}
