//! `thunder-cli --version` names the version and the git commit. (The CLI's tests against a
//! server are in thunder-testbed's `tests/cli_*.rs`, so that the CLI needs no server even
//! among its dev-dependencies.)

use std::process::Command;

#[test]
fn version_names_the_version_and_the_git_commit() {
    let output = Command::new(env!("CARGO_BIN_EXE_thunder-cli"))
        .arg("--version")
        .output()
        .expect("run thunder-cli");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.starts_with(&format!(
            "thunder-cli {} (git {}",
            // The stamp of this crate's build script, as the server's (thunder-buildstamp).
            env!("CARGO_PKG_VERSION"),
            env!("THUNDER_GIT_SHA")
        )),
        "{text}"
    );
}
