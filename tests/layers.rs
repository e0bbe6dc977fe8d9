//! The shape of `src/` (README, "Architecture"): every `crate::` path in the library is read
//! from the sources, resolved to the module it names, and checked against the layers:
//! imports only point down (core, then runtime and kernels, then ops, then the
//! torch.backends facades, then the report), no two units import each other, however
//! indirectly, and no file grows past 1000 lines.
//!
//! A unit is a folder of a layer (`ops::sdpa`, `runtime::cuda`, `core::tensor`) or a facade
//! (`cuda`, `cpu`): files inside one unit may use each other. One unit is wider by design:
//! core's vocabulary (`dtype`, `device`, `flag`'s option parser, `sdp`'s backend names and
//! reasons) and the `Error` that names them are mutually referential, as a parse of a
//! `Device` fails with an `Error` that can carry `Device`s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const VOCABULARY: &[&str] = &["dtype", "device", "error", "flag", "sdp"];

/// The module path of each library source file (`src/ops/sdpa/mod.rs` is `ops::sdpa`).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("src/main.rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            found.insert(parts, path);
        }
    }
    found
}

/// The text without `//` comments (doc links are not imports).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split_once("//").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

fn identifier(text: &str) -> usize {
    text.find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len())
}

/// The paths after `crate::` in `text`, with `crate::{a, b::{c, d}}` groups expanded.
fn crate_paths(text: &str) -> Vec<String> {
    fn parse(text: &str, prefix: &str, out: &mut Vec<String>) -> usize {
        // One path: segments, then maybe a group.
        let mut at = 0;
        let mut path = prefix.to_string();
        loop {
            let rest = &text[at..];
            if let Some(group) = rest.strip_prefix('{') {
                let mut used = 1;
                loop {
                    let inner = &group[used - 1..];
                    let skip = inner.len() - inner.trim_start().len();
                    used += skip;
                    if group[used - 1..].starts_with('}') {
                        return at + used + 1;
                    }
                    used += parse(&group[used - 1..], &path, out);
                    let inner = &group[used - 1..];
                    let skip = inner.len() - inner.trim_start().len();
                    used += skip;
                    if group[used - 1..].starts_with(',') {
                        used += 1;
                    }
                }
            }
            let len = identifier(rest);
            if len == 0 {
                break;
            }
            let name = &rest[..len];
            at += len;
            if name != "self" {
                if !path.is_empty() {
                    path.push_str("::");
                }
                path.push_str(name);
            }
            if text[at..].starts_with("::") {
                at += 2;
            } else {
                break;
            }
        }
        // `as alias` is not part of the path.
        out.push(path);
        let rest = &text[at..];
        let trimmed = rest.trim_start();
        if let Some(alias) = trimmed.strip_prefix("as ") {
            let alias = alias.trim_start();
            at = text.len() - alias.len() + identifier(alias);
        }
        at
    }
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(found) = rest.find("crate::") {
        let before = rest[..found].chars().last();
        rest = &rest[found + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        parse(rest, "", &mut out);
    }
    out
}

/// The layer-folder unit of a module (`ops::sdpa::select` is `ops::sdpa`).
fn unit(module: &[String]) -> String {
    match module {
        [] => "crate".into(),
        [layer, name, ..] if ["core", "runtime", "kernels", "ops"].contains(&layer.as_str()) => {
            if layer == "core" && VOCABULARY.contains(&name.as_str()) {
                "core::vocabulary".into()
            } else {
                format!("{layer}::{name}")
            }
        }
        [first, ..] => first.clone(),
    }
}

/// Lower ranks are lower layers: a unit may import units of its rank or below.
fn rank(unit: &str) -> u8 {
    match unit.split("::").next().unwrap() {
        "core" => 0,
        "runtime" | "kernels" => 1,
        "ops" => 2,
        "info" | "selfcheck" => 4,
        _ => 3,
    }
}

/// `pub use crate::x::y::{A, B}` and `pub use crate::x::y::A;` at the crate root: name ->
/// the module it comes from.
fn root_reexports(lib: &str) -> BTreeMap<String, Vec<String>> {
    let mut names = BTreeMap::new();
    for statement in code(lib).split(';') {
        let statement = statement.trim();
        let Some(path) = statement.strip_prefix("pub use crate::") else {
            continue;
        };
        let (module, items) = match path.split_once("::{") {
            Some((module, items)) => (module.to_string(), items.trim_end_matches('}').to_string()),
            None => {
                let (module, item) = path.rsplit_once("::").unwrap_or(("", path));
                (module.to_string(), item.to_string())
            }
        };
        for item in items.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (name, alias) = item.split_once(" as ").unwrap_or((item, item));
            let mut source: Vec<String> = module.split("::").map(String::from).collect();
            source.push(name.trim().to_string());
            names.insert(alias.trim().to_string(), source);
        }
    }
    names
}

#[test]
fn imports_point_down_the_layers_and_no_units_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let resolve = |path: &str| -> Option<Vec<String>> {
        let mut parts: Vec<String> = path.split("::").map(String::from).collect();
        if let Some(source) = parts.first().and_then(|first| reexports.get(first)) {
            parts.splice(0..1, source.iter().cloned());
        }
        (1..=parts.len())
            .rev()
            .map(|n| parts[..n].to_vec())
            .find(|prefix| modules.contains_key(prefix))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    for (module, file) in &modules {
        let from = unit(module);
        if from == "crate" {
            continue;
        }
        for path in crate_paths(&code(&std::fs::read_to_string(file).unwrap())) {
            let Some(target) = resolve(&path) else {
                continue;
            };
            let to = unit(&target);
            if to == from || to == "crate" {
                continue;
            }
            if rank(&to) > rank(&from) {
                upward.push(format!("{} uses crate::{path} ({to})", file.display()));
            }
            edges.entry(from.clone()).or_default().insert(to);
        }
    }
    assert!(
        modules.len() > 40 && edges.len() > 20,
        "the scan found the modules and their imports"
    );
    assert!(
        upward.is_empty(),
        "imports pointing up:\n{}",
        upward.join("\n")
    );
    // A cycle: a unit that reaches itself.
    let reach = |start: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&String> = edges.get(start).into_iter().flatten().collect();
        while let Some(next) = stack.pop() {
            if seen.insert(next.clone()) {
                stack.extend(edges.get(next).into_iter().flatten());
            }
        }
        seen
    };
    let cycles: Vec<String> = edges
        .keys()
        .filter(|u| reach(u).contains(*u))
        .map(|u| format!("{u} -> {:?}", edges[u]))
        .collect();
    assert!(
        cycles.is_empty(),
        "units in a cycle:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn no_source_file_is_over_1000_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long: Vec<String> = modules(&src)
        .values()
        .chain([&src.join("main.rs")])
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file).unwrap().lines().count();
            (lines > 1000).then(|| format!("{}: {lines} lines", file.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "split these by concept:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_scanner_reads_grouped_and_nested_imports() {
    let paths =
        crate_paths("use crate::{a::{b, c::D}, e as f, self}; x = crate::g::h(1); $crate::i");
    assert_eq!(paths, ["a::b", "a::c::D", "e", "", "g::h", "i"]);
}
