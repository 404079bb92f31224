//! The module graphs of the server and of the engine, read from `server/src`'s and
//! `engine/src`'s `crate::`, `super::` and `self::` paths (files only, nothing built): no two
//! modules import each other, directly or round a longer loop, and every arrow between the
//! top-level modules points to the same floor or one below ([`FLOORS`], [`ENGINE_FLOORS`]). A
//! module's arrows to its own ancestors (its `mod.rs` scopes) are not counted, nor the code of
//! its test modules (`#[cfg(test)]`, or `#[cfg(all(test, ...))]`, inline or in a file of their
//! own); a name re-exported by a `pub use` counts as the module that defines it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules, top floor first. A module imports from its own floor or below;
/// side by side on one floor is fine as long as no loop forms. A new top-level module must be
/// placed here.
const FLOORS: &[&[&str]] = &[
    // Flags into every wing's options, the lifecycle's included.
    &["config"],
    &["lifecycle"],
    // The admin HTTP port reads every wing.
    &["admin"],
    &["serve", "kafka", "snapshot", "demo", "maintenance", "shard"],
    // Every wing records into it.
    &["telemetry"],
    &["error", "version"],
];

/// The engine's top-level modules, top floor first (the same rules as [`FLOORS`]).
const ENGINE_FLOORS: &[&[&str]] = &[
    // The `Store` contract every store implements, the engine's face among them.
    &["contract"],
    // The face: each method hands over to a path.
    &["store"],
    // Writing a store as a base file, and loading one under a store.
    &["base_io"],
    &["snapshot"],
    // The explain path: the query run with an observer that keeps each rule's decision.
    &["explain"],
    // The paths: they talk to the owners and to the orderings between them; `observe` holds
    // the hooks the query reports each rule's decision through.
    &["query", "observe", "write", "bulk"],
    // The orderings that span two tables.
    &["tables"],
    // The base tier under the head: the file's format, its mapped bytes and what a query reads
    // of them (its file holds the facts and waiting reposts of the owners below).
    &["base"],
    // The owners, one a table; no owner reaches another.
    &["posts", "authors", "tombstones", "waiting", "directory"],
    // The structures the owners are made of.
    &[
        "arena",
        "author_index",
        "index",
        "timeline",
        "tombstone_filter",
        "guards",
        "retention",
    ],
    &["counter", "huge_memory", "prefetch", "sync", "parallel"],
    // Values and rules every floor above may use.
    &[
        "feed_query",
        "file_header",
        "report",
        "shard",
        "page",
        "post",
        "seen",
        "clock",
        "config",
    ],
];

/// A module path below the crate root (`["kafka", "ingest"]`).
type Module = Vec<String>;

struct Source {
    /// The file's module.
    module: Module,
    /// The file, for the messages.
    file: PathBuf,
    /// Its code without comments and without its `#[cfg(test)]` module.
    code: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("server/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The library's files of the crate at `root` (a `src` directory) without the test modules
/// that have a file of their own (`main.rs` is a binary, a crate of its own).
fn sources(root: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    let mut test_files = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let dir = match file.file_name().and_then(|name| name.to_str()) {
            Some("mod.rs" | "lib.rs") => file.parent().expect("in a directory").to_path_buf(),
            _ => file.with_extension(""),
        };
        for name in test_module_names(&text) {
            test_files.insert(dir.join(format!("{name}.rs")));
            test_files.insert(dir.join(name).join("mod.rs"));
        }
    }
    files
        .into_iter()
        .filter(|file| file != &root.join("main.rs") && !test_files.contains(file))
        .map(|file| {
            let relative = file.strip_prefix(root).expect("under src");
            let mut module: Module = relative
                .with_extension("")
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if module
                .last()
                .is_some_and(|last| last == "mod" || last == "lib")
            {
                module.pop();
            }
            let text = std::fs::read_to_string(&file).expect("a readable source file");
            Source {
                module,
                file: relative.to_path_buf(),
                code: code_of(&text),
            }
        })
        .collect()
}

/// True for an attribute that compiles what follows only in tests.
fn is_test_cfg(line: &str) -> bool {
    let line = line.trim();
    line == "#[cfg(test)]" || line.starts_with("#[cfg(all(test,")
}

/// The modules `text` declares in files of their own for tests only (`#[cfg(test)] mod x;`).
fn test_module_names(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|pair| is_test_cfg(pair[0]))
        .filter_map(|pair| {
            let name = pair[1].trim().strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_owned())
        })
        .collect()
}

/// The text without line comments, without test module declarations and without the inline
/// test module (everything from the first test-only attribute followed by `mod x {`: inline
/// test modules come last in a file).
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if is_test_cfg(line)
            && let Some(next) = lines.peek()
            && next.trim_start().starts_with("mod ")
        {
            if next.trim_end().ends_with(';') {
                lines.next();
                continue;
            }
            break;
        }
        let line = line.split("//").next().unwrap_or("");
        code.push_str(line);
        code.push('\n');
    }
    code
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths of a use tree starting at `text` (`a::b::{c, d::{e, f}}`), each with `prefix`
/// before it; an alias (`x as y`) is kept as the path's last element after a `=`.
fn use_tree(text: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut rest = text.trim_start();
    loop {
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        path.push(rest[..end].to_owned());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 1;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' | ',' if depth == 1 => {
                    let item = group[start..i].trim();
                    if !item.is_empty() {
                        use_tree(item, &path, out);
                    }
                    start = i + 1;
                    if c == '}' {
                        return;
                    }
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
    } else if !path.is_empty() {
        if let Some(alias) = rest.trim_start().strip_prefix("as ") {
            let alias: String = alias
                .trim_start()
                .chars()
                .take_while(|&c| is_ident(c))
                .collect();
            path.push(format!("={alias}"));
        }
        out.push(path);
    }
}

/// Every path in `code` that starts with `start` (`crate::`, `super::`, `self::`), from the
/// segment after it.
fn paths_after(code: &str, start: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices(start) {
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        use_tree(&code[at + start.len()..], &[], &mut out);
    }
    out
}

/// Absolute paths (from the crate root) that `source` names.
fn named_paths(source: &Source) -> Vec<Vec<String>> {
    let parent = &source.module[..source.module.len().saturating_sub(1)];
    let mut paths = paths_after(&source.code, "crate::");
    for (start, base) in [("super::", parent), ("self::", &source.module[..])] {
        for path in paths_after(&source.code, start) {
            paths.push(base.iter().cloned().chain(path).collect());
        }
    }
    paths
}

struct Crate {
    modules: BTreeSet<Module>,
    /// Per module: the names it re-exports (`pub use`), to the absolute path they stand for.
    reexports: BTreeMap<Module, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn new(sources: &[Source]) -> Self {
        let modules: BTreeSet<Module> = sources.iter().map(|s| s.module.clone()).collect();
        let mut reexports = BTreeMap::new();
        for source in sources {
            let mut names = BTreeMap::new();
            for statement in source.code.split(';') {
                let statement = statement.trim_start();
                let Some(tree) = ["pub use ", "pub(crate) use "]
                    .iter()
                    .find_map(|start| statement.strip_prefix(start))
                else {
                    continue;
                };
                let mut paths = Vec::new();
                use_tree(tree, &[], &mut paths);
                for mut path in paths {
                    let name = match path.last() {
                        Some(last) if last.starts_with('=') => {
                            let alias = last[1..].to_owned();
                            path.pop();
                            alias
                        }
                        Some(last) => last.clone(),
                        None => continue,
                    };
                    let base: &[String] = match path[0].as_str() {
                        "crate" => &[],
                        "super" => &source.module[..source.module.len().saturating_sub(1)],
                        "self" => &source.module,
                        _ => {
                            // Relative to this module, if it names a child of it.
                            let mut child = source.module.clone();
                            child.push(path[0].clone());
                            if !modules.contains(&child) {
                                continue;
                            }
                            path.insert(0, "self".to_owned());
                            &source.module
                        }
                    };
                    let absolute = base.iter().cloned().chain(path[1..].iter().cloned());
                    names.insert(name, absolute.collect());
                }
            }
            reexports.insert(source.module.clone(), names);
        }
        Self { modules, reexports }
    }

    /// The module a path names: its longest module prefix, following re-exports.
    fn resolve(&self, path: &[String]) -> Module {
        let mut path: Vec<String> = path
            .iter()
            .filter(|p| !p.starts_with('='))
            .cloned()
            .collect();
        for _ in 0..8 {
            let known = (0..=path.len())
                .rev()
                .find(|&n| self.modules.contains(&path[..n]))
                .unwrap_or(0);
            let module = path[..known].to_vec();
            let target = path
                .get(known)
                .and_then(|name| self.reexports.get(&module)?.get(name));
            match target {
                Some(target) if target.as_slice() != path.as_slice() => {
                    path = target.iter().chain(&path[known + 1..]).cloned().collect();
                }
                _ => return module,
            }
        }
        panic!("a re-export loop at {path:?}")
    }

    /// Every arrow between two modules, with the file it is written in; the crate root's
    /// arrows, and arrows to the crate root, to the module itself or to its ancestors, are
    /// left out.
    fn arrows(&self, sources: &[Source]) -> BTreeMap<(Module, Module), PathBuf> {
        let mut arrows = BTreeMap::new();
        for source in sources.iter().filter(|s| !s.module.is_empty()) {
            for path in named_paths(source) {
                let target = self.resolve(&path);
                if target.is_empty() || source.module.starts_with(&target) {
                    continue;
                }
                arrows
                    .entry((source.module.clone(), target))
                    .or_insert_with(|| source.file.clone());
            }
        }
        arrows
    }
}

fn name(module: &[String]) -> String {
    module.join("::")
}

/// The arrows that lie on a loop: `from -> to` where `to` reaches `from` back.
fn arrows_on_loops(arrows: &BTreeSet<(String, String)>) -> Vec<(String, String)> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in arrows {
        next.entry(from).or_default().push(to);
    }
    let reaches = |start: &str, goal: &str| {
        let mut seen = BTreeSet::from([start]);
        let mut stack = vec![start];
        while let Some(at) = stack.pop() {
            if at == goal {
                return true;
            }
            for &to in next.get(at).into_iter().flatten() {
                if seen.insert(to) {
                    stack.push(to);
                }
            }
        }
        false
    };
    arrows
        .iter()
        .filter(|(from, to)| reaches(to, from))
        .cloned()
        .collect()
}

#[test]
fn the_use_tree_reader_reads_groups_aliases_and_nesting() {
    let mut paths = Vec::new();
    use_tree("a::{b, c::{d, e as f}, g::*}", &[], &mut paths);
    let expected: Vec<Vec<&str>> = vec![
        vec!["a", "b"],
        vec!["a", "c", "d"],
        vec!["a", "c", "e", "=f"],
        vec!["a", "g"],
    ];
    assert_eq!(paths, expected);
    let code = code_of(
        "use crate::x::Y; // crate::z\nfn f() { crate::w::go() }\n#[cfg(test)]\nmod tests {\n use crate::t;\n}\n",
    );
    assert_eq!(
        paths_after(&code, "crate::"),
        vec![vec!["x", "Y"], vec!["w", "go"]]
    );
}

#[test]
fn a_loop_is_found() {
    let arrows: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .into_iter()
        .map(|(from, to)| (from.to_owned(), to.to_owned()))
        .collect();
    let on_loops = arrows_on_loops(&arrows);
    assert_eq!(on_loops.len(), 3, "{on_loops:?}");
    assert!(!on_loops.contains(&("c".to_owned(), "d".to_owned())));
}

/// The problems of the crate at `root` (its `src`): arrows on a loop, arrows up a floor of
/// `floors` (named `floors_name` in the messages), top-level modules `floors` does not place.
fn problems(root: &Path, floors: &[&[&str]], floors_name: &str) -> Vec<String> {
    let sources = sources(root);
    let krate = Crate::new(&sources);
    let arrows = krate.arrows(&sources);
    assert!(
        arrows.len() > 50,
        "too few arrows read in {} ({}): is the reader broken?",
        root.display(),
        arrows.len()
    );
    let mut problems = Vec::new();

    let files: BTreeSet<(String, String)> = arrows
        .keys()
        .map(|(from, to)| (name(from), name(to)))
        .collect();
    for (from, to) in arrows_on_loops(&files) {
        problems.push(format!("{from} -> {to} is on a loop"));
    }

    let floor_of = |top: &str| floors.iter().position(|floor| floor.contains(&top));
    let mut wings = BTreeSet::new();
    for ((from, to), file) in &arrows {
        let (from_top, to_top) = (&from[0], &to[0]);
        for top in [from_top, to_top] {
            if floor_of(top).is_none() {
                problems.push(format!("`{top}` has no floor in {floors_name}"));
            }
        }
        if from_top == to_top {
            continue;
        }
        wings.insert((from_top.clone(), to_top.clone()));
        if let (Some(a), Some(b)) = (floor_of(from_top), floor_of(to_top))
            && b < a
        {
            problems.push(format!(
                "{} -> {} points up a floor ({})",
                name(from),
                name(to),
                file.display()
            ));
        }
    }
    for (from, to) in arrows_on_loops(&wings) {
        problems.push(format!("the wings {from} -> {to} are on a loop"));
    }
    problems.sort();
    problems.dedup();
    problems
}

#[test]
fn no_module_loop_and_no_upward_arrow() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = problems(&root, FLOORS, "FLOORS");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_engine_has_no_module_loop_and_no_upward_arrow() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/src");
    let problems = problems(&root, ENGINE_FLOORS, "ENGINE_FLOORS");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn test_modules_are_left_out_inline_and_in_files_of_their_own() {
    let text = "use crate::a::A;\n#[cfg(all(test, thunder_loom))]\nmod loom_tests;\nuse crate::b::B;\n#[cfg(all(test, not(thunder_loom)))]\nmod tests {\n use crate::c::C;\n}\n";
    assert_eq!(test_module_names(text), ["loom_tests"]);
    assert_eq!(
        paths_after(&code_of(text), "crate::"),
        vec![vec!["a", "A"], vec!["b", "B"]]
    );
}
