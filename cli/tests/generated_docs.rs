//! docs/configuration.md and docs/metrics.md are generated from the code: the flags from clap
//! (`thunder-server`'s [`Args`] and the help of every `thunder-cli` subcommand) and the metrics
//! from the registry's catalogue. These tests render both and fail when the committed files
//! differ; `THUNDER_REGENERATE_DOCS=1` rewrites them instead. They live in thunder-cli, the one
//! crate whose tests have the `thunder-cli` binary and the server's library both.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use clap::CommandFactory;
use thunder_server::Args;
use thunder_server::admin::metrics::Metrics;

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
             {REGENERATE}=1 cargo test -p thunder-cli --test generated_docs\n\
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
    let output = Command::new(env!("CARGO_BIN_EXE_thunder-cli"))
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
         <!-- Generated from the code (clap) by cli/tests/generated_docs.rs; do not edit.\n     \
         Regenerate: THUNDER_REGENERATE_DOCS=1 cargo test -p thunder-cli --test generated_docs -->\n\n\
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
         <!-- Generated from the registry (server/src/admin/metrics.rs) by cli/tests/generated_docs.rs;\n     \
         do not edit. Regenerate: THUNDER_REGENERATE_DOCS=1 cargo test -p thunder-cli --test generated_docs -->\n\n\
         `thunder-server` exports these on the admin port at `/metrics` (Prometheus text format).\n\
         A histogram's series are `<name>_bucket{le}`, `<name>_sum` and `<name>_count`. A labelled\n\
         family appears once a label set is used, except those exported at zero from start-up (the\n\
         drop reasons, the degrade levels); the Kafka ones appear only with Kafka ingestion.\n\n\
         | Name | Type | Labels | Meaning |\n|---|---|---|---|\n",
    );
    for metric in Metrics::catalogue() {
        let labels = metric
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            out,
            "| `{}` | {} | {labels} | {} |",
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
    assert!(rendered.contains("| `kafka_partition_lag` | gauge | `topic`, `partition` |"));
    check_or_write("metrics.md", &rendered);
}
