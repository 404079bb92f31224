//! The repository's own files, as the deployment tests read them.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository (workspace) root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The YAML documents of the file at `path` as JSON, through Python's yaml module (the YAML
/// must parse).
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let output = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)",
        ])
        .arg(path)
        .output()
        .expect("python3 runs (with its yaml module: Debian python3-yaml or pip PyYAML)");
    assert!(
        output.status.success(),
        "{} does not parse as YAML: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("python printed a list of documents")
}
