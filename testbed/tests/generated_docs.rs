//! docs/configuration.md, docs/metrics.md and the file map of docs/architecture.md are
//! generated from the code: the flags from clap (`thunder-server`'s [`Args`] and the help of
//! every `thunder-cli` subcommand, as the built binary prints it), the metrics from the
//! registry's catalogue, the file map from each crate's description and each file's module
//! docs. These tests render them and fail when the committed files differ;
//! `THUNDER_REGENERATE_DOCS=1` rewrites them instead (`scripts/regenerate-docs.sh` builds
//! `thunder-cli` first and runs them so). They live in the testbed, which links the server's
//! library, so that the CLI needs no server even among its dev-dependencies.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use clap::CommandFactory;
use thunder_server::Args;
use thunder_server::lifecycle::metrics::catalogue;
use thunder_server::telemetry::reference_names::{PROMTOOL_OBJECTS_TO, REFERENCE_NAMES};
use thunder_testbed::process::binary;

const REGENERATE: &str = "THUNDER_REGENERATE_DOCS";

/// The repository's `docs/` directory.
fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// Compares `rendered` with the committed `docs/<name>`, or rewrites it when asked.
fn check_or_write(name: &str, rendered: &str) {
    let path = docs_dir().join(name);
    if std::env::var_os(REGENERATE).is_some_and(|v| v == "1") {
        std::fs::write(&path, rendered).expect("write the generated doc");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != rendered {
        let line = committed
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || committed.lines().count().min(rendered.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "docs/{name} is out of date with the code (first difference at line {line}).\n\
             Regenerate it with:\n    \
             scripts/regenerate-docs.sh\n\
             and commit the result."
        );
    }
}

/// A markdown table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// One table row per flag of `command`: flag, environment variable, default, help.
fn flag_table(command: &clap::Command) -> String {
    let mut out =
        String::from("| Flag | Environment variable | Default | Meaning |\n|---|---|---|---|\n");
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if arg.is_hide_set() || long == "help" || long == "version" {
            continue;
        }
        let mut flag = format!("`--{long}");
        if let Some(short) = arg.get_short() {
            flag = format!("`-{short}`, {flag}");
        }
        let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
        if takes_value {
            let value = arg
                .get_value_names()
                .and_then(|names| names.first())
                .map_or_else(
                    || arg.get_id().to_string().to_uppercase(),
                    ToString::to_string,
                );
            write!(flag, " <{value}>").expect("write to a String");
        }
        flag.push('`');
        let env = arg
            .get_env()
            .map_or_else(String::new, |e| format!("`{}`", e.to_string_lossy()));
        let default = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(", ");
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        writeln!(out, "| {flag} | {env} | {default} | {} |", cell(&help))
            .expect("write to a String");
    }
    out
}

/// The help `thunder-cli` prints for `args`, as the binary prints it.
fn cli_help(args: &[&str]) -> String {
    let output = Command::new(binary("thunder-cli"))
        .args(args)
        .env_clear()
        .env("COLUMNS", "100")
        .output()
        .expect("run thunder-cli");
    assert!(output.status.success(), "thunder-cli {args:?} failed");
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

fn render_configuration() -> String {
    let mut out = String::from(
        "# Configuration\n\n\
         <!-- Generated from the code (clap) by testbed/tests/generated_docs.rs; do not edit.\n     \
         Regenerate: scripts/regenerate-docs.sh -->\n\n\
         Every flag of `thunder-server` also reads the environment variable next to it; a flag on\n\
         the command line wins over the variable. `thunder-server --check-config` parses and checks\n\
         a configuration without serving and prints it with secrets masked.\n\n\
         ## thunder-server\n\n",
    );
    let mut server = Args::command();
    server.build();
    if let Some(about) = server.get_about() {
        writeln!(out, "{about}.\n").expect("write to a String");
    }
    out.push_str(&flag_table(&server));
    out.push_str(
        "\n## thunder-cli\n\n\
         The command-line client. Its subcommands and their flags, as `--help` prints them.\n",
    );
    let top = cli_help(&["--help"]);
    let subcommands: Vec<String> = top
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect();
    assert!(
        subcommands.iter().any(|s| s == "produce"),
        "no subcommands found in:\n{top}"
    );
    for name in subcommands {
        let help = cli_help(&[&name, "--help"]);
        write!(out, "\n### thunder-cli {name}\n\n```text\n{help}```\n").expect("write to a String");
    }
    out
}

fn render_metrics() -> String {
    let mut out = String::from(
        "# Metrics\n\n\
         <!-- Generated from the registry (each wing's metrics.rs, listed in\n     \
         server/src/lifecycle/metrics.rs) by testbed/tests/generated_docs.rs; do not edit.\n     \
         Regenerate: scripts/regenerate-docs.sh -->\n\n\
         `thunder-server` exports these on the admin port at `/metrics` (Prometheus text format).\n\
         A histogram's series are `<name>_bucket{le}`, `<name>_sum` and `<name>_count`. A labelled\n\
         family appears once a label set is used, except those exported at zero from start-up (the\n\
         drop reasons, the degrade levels); the Kafka ones appear only with Kafka ingestion.\n\n\
         The names marked *reference* are the reference service's (X's Thunder), kept with their\n\
         meaning so that dashboards and alerts written for it read the same series.\n",
    );
    let objected: Vec<String> = PROMTOOL_OBJECTS_TO
        .iter()
        .map(|n| format!("`{n}`"))
        .collect();
    writeln!(
        out,
        "`promtool check metrics` objects to {}: gauges whose names end in `_count`, a suffix\n\
         Prometheus keeps for the sample count of a histogram or a summary. They keep the\n\
         reference's names all the same.\n\n\
         | Name | Type | Labels | Meaning |\n|---|---|---|---|",
        objected.join(" and ")
    )
    .expect("write to a String");
    for metric in catalogue() {
        let reference = if REFERENCE_NAMES.contains(&metric.name.as_str()) {
            " (*reference*)"
        } else {
            ""
        };
        let labels = metric
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            out,
            "| `{}`{reference} | {} | {labels} | {} |",
            metric.name,
            metric.kind,
            cell(&metric.help)
        )
        .expect("write to a String");
    }
    out
}

#[test]
fn configuration_doc_matches_the_flags() {
    let rendered = render_configuration();
    // Every flag and variable of the server is in it.
    for arg in Args::command().get_arguments() {
        if let Some(env) = arg.get_env() {
            assert!(rendered.contains(&*env.to_string_lossy()), "{env:?}");
        }
    }
    check_or_write("configuration.md", &rendered);
}

#[test]
fn metrics_doc_matches_the_registry() {
    let rendered = render_metrics();
    assert!(
        rendered.contains("| `kafka_partition_lag` (*reference*) | gauge | `topic`, `partition` |")
    );
    check_or_write("metrics.md", &rendered);
}

/// The repository's root.
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The crates of the repository in the workspace's order (`members` of the root Cargo.toml),
/// then the fuzz crate (a workspace of its own).
fn crate_dirs() -> Vec<String> {
    let manifest =
        std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("the root Cargo.toml");
    let members = manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("members = ["))
        .expect("a one-line `members = [...]` in the root Cargo.toml");
    let mut dirs: Vec<String> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    dirs.push("fuzz".to_owned());
    dirs
}

/// The value of the first `key = "..."` line of a Cargo.toml.
fn manifest_field(dir: &str, key: &str) -> String {
    let path = repo_root().join(dir).join("Cargo.toml");
    let manifest = std::fs::read_to_string(&path).expect("a crate's Cargo.toml");
    manifest
        .lines()
        .find_map(|line| {
            let value = line.strip_prefix(key)?.trim_start().strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| panic!("{} has no {key}", path.display()))
}

/// The `.rs` files below `dir`, sorted, as paths relative to the repository root.
fn rust_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.expect("dir entry").path()).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first sentence of a file's module docs (`//!`), intra-doc link brackets removed.
fn module_summary(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).expect("a source file");
    let paragraph: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("//!"))
        .map_while(|line| line.strip_prefix("//!"))
        .map(str::trim)
        .take_while(|line| !line.is_empty())
        .collect();
    assert!(
        !paragraph.is_empty(),
        "{} has no module docs (`//!`): its first sentence is its line in docs/architecture.md",
        path.display()
    );
    let paragraph = paragraph.join(" ");
    let end = paragraph
        .match_indices(". ")
        .map(|(i, _)| i + 1)
        .find(|&i| {
            let before = &paragraph[..i];
            !before.ends_with("e.g.") && !before.ends_with("i.e.") && !before.ends_with("..")
        })
        .unwrap_or(paragraph.len());
    // Intra-doc links keep their text: `[`name`](path)` and `[`name`]` become `name`.
    let mut sentence = paragraph[..end].to_owned();
    while let Some(start) = sentence.find("`](") {
        let Some(close) = sentence[start..].find(')') else {
            break;
        };
        sentence.replace_range(start + 1..start + close + 1, "");
    }
    // A first paragraph that leads into a list ends the row's sentence there.
    if let Some(lead) = sentence.strip_suffix(':') {
        sentence = format!("{lead}.");
    }
    cell(&sentence.replace("[`", "`").replace("`]", "`"))
}

const LAYOUT_BEGIN: &str = "<!-- layout:begin";
const LAYOUT_END: &str = "<!-- layout:end -->";

/// The file map of docs/architecture.md: per crate its description (Cargo.toml), then a row a
/// source file with the first sentence of the file's own module docs.
fn render_layout() -> String {
    let mut out = String::from(
        "<!-- layout:begin: generated from each crate's Cargo.toml description and each file's\n     \
         first module-doc sentence by testbed/tests/generated_docs.rs; do not edit. Regenerate:\n     \
         scripts/regenerate-docs.sh -->\n",
    );
    for dir in crate_dirs() {
        let name = manifest_field(&dir, "name");
        let description = manifest_field(&dir, "description");
        write!(
            out,
            "\n### `{dir}/`: {name}\n\n{description}\n\n| File | What it holds |\n|---|---|\n"
        )
        .expect("write to a String");
        let mut files = Vec::new();
        for sub in ["src", "fuzz_targets"] {
            rust_files(&repo_root().join(&dir).join(sub), &mut files);
        }
        for file in files {
            let relative = file
                .strip_prefix(repo_root().join(&dir))
                .expect("below the crate")
                .display()
                .to_string();
            writeln!(
                out,
                "| [{relative}](../{dir}/{relative}) | {} |",
                module_summary(&file)
            )
            .expect("write to a String");
        }
    }
    out.push('\n');
    out.push_str(LAYOUT_END);
    out
}

#[test]
fn architecture_layout_matches_the_module_docs() {
    let path = docs_dir().join("architecture.md");
    let committed = std::fs::read_to_string(&path).expect("docs/architecture.md");
    let begin = committed
        .find(LAYOUT_BEGIN)
        .expect("docs/architecture.md has a layout:begin marker");
    let end = committed[begin..]
        .find(LAYOUT_END)
        .map(|i| begin + i + LAYOUT_END.len())
        .expect("docs/architecture.md has a layout:end marker");
    let rendered = render_layout();
    assert!(rendered.contains("| [src/store.rs](../engine/src/store.rs) |"));
    let whole = format!("{}{rendered}{}", &committed[..begin], &committed[end..]);
    check_or_write("architecture.md", &whole);
}
