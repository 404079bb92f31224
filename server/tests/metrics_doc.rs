//! docs/metrics.md against what a running server exports: every metric family a demo server's
//! `/metrics` shows is in the file, with its type, and every drop reason of
//! `kafka_events_dropped_total` is named in its help. (testbed/tests/generated_docs.rs checks the
//! file against the registry's catalogue; this catches a family the catalogue misses.)

use std::collections::BTreeMap;
use std::path::PathBuf;

use thunder_testbed::server_process::ServerProcess;

/// `name -> type` of every `# TYPE` line of a scrape.
fn scraped_types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.trim().to_owned()))
        .collect()
}

/// `name -> (type, help)` of every row of docs/metrics.md's table.
fn documented() -> BTreeMap<String, (String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let text = std::fs::read_to_string(&path).expect("docs/metrics.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let (name, rest) = l.split_once('`')?;
            // A reference name is marked after the name: "`name` (*reference*) | ...".
            let rest = rest
                .trim_start_matches(" (*reference*)")
                .strip_prefix(" | ")?;
            let mut cells = rest.split(" | ");
            let kind = cells.next()?.trim().to_owned();
            let _labels = cells.next()?;
            let help = cells.next()?.trim_end_matches(" |").to_owned();
            Some((name.to_owned(), (kind, help)))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exported_family_is_in_docs_metrics_md() {
    let server =
        ServerProcess::demo(&["--demo-scale", "1000", "--demo-events-per-sec", "10"]).await;
    // One call, so the per-call labelled families have samples.
    thunder_testbed::server_process::one_call(server.grpc).await;
    let scrape = thunder_testbed::http_get(server.admin, "/metrics").await;
    assert_eq!(scrape.status, 200);
    let text = scrape.text();
    let live = scraped_types(&text);
    assert!(live.len() > 40, "a scrape of {} families", live.len());
    let doc = documented();
    let mut problems = Vec::new();
    for (name, kind) in &live {
        match doc.get(name) {
            None => problems.push(format!("`{name}` ({kind}) is exported but not documented")),
            Some((documented, _)) if documented != kind => problems.push(format!(
                "`{name}` is a {kind}, documented as a {documented}"
            )),
            Some(_) => {}
        }
    }
    assert!(
        problems.is_empty(),
        "docs/metrics.md is out of date with what the server exports (regenerate it: \
         scripts/regenerate-docs.sh):\n{}",
        problems.join("\n")
    );

    // Every reason the server exports, and every reason it knows, is in the help.
    let (_, help) = &doc["kafka_events_dropped_total"];
    let exported_reasons: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("kafka_events_dropped_total{reason=\""))
        .filter_map(|l| l.split_once('"').map(|(reason, _)| reason))
        .collect();
    assert!(
        exported_reasons.contains(&"no_slot"),
        "{exported_reasons:?}"
    );
    let known: Vec<&str> = thunder_server::kafka::metrics::drop_reasons().collect();
    for reason in exported_reasons.iter().chain(&known) {
        assert!(
            help.contains(reason),
            "`{reason}` missing from the help: {help}"
        );
    }
}
