//! The build stamp of thunder's binaries, for `thunder_build_info`, `--version`, the start-up
//! log and the status page. A crate's `build.rs` calls [`stamp`], which sets, for that crate's
//! code: the git commit (`THUNDER_GIT_SHA`: the variable of that name when set, as the
//! Dockerfile sets it, else `git rev-parse HEAD`, else "unknown", e.g. a source tarball), the
//! compiler (`THUNDER_RUSTC`) and the crate's enabled features (`THUNDER_FEATURES`, "none"
//! when there are none). The crate's code reads them with `env!`; [`long_version!`] is the
//! `--version` text made of them.

use std::path::PathBuf;
use std::process::Command;

/// What `--version` prints after the program name: the calling crate's version, the git commit
/// and the compiler, from the stamp its `build.rs` set with [`stamp`]. (A macro, so that `env!`
/// reads the calling crate's build.)
#[macro_export]
macro_rules! long_version {
    () => {
        concat!(
            env!("CARGO_PKG_VERSION"),
            " (git ",
            env!("THUNDER_GIT_SHA"),
            ", rustc ",
            env!("THUNDER_RUSTC"),
            ")"
        )
    };
}

/// Prints the `cargo:rustc-env` lines of the stamp (and when to run again): call it from a
/// build script, whose crate then reads them with `env!`.
pub fn stamp() {
    println!("cargo:rerun-if-env-changed=THUNDER_GIT_SHA");
    let sha = std::env::var("THUNDER_GIT_SHA")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=THUNDER_GIT_SHA={sha}");
    // Rebuild when HEAD moves: HEAD itself (a checkout) and the branch it points to (a commit).
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        rerun_if_changed(&head);
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &branch])
    {
        rerun_if_changed(&path);
        if let Some(packed) = git(&["rev-parse", "--git-path", "packed-refs"]) {
            rerun_if_changed(&packed);
        }
    }

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| v.trim().trim_start_matches("rustc ").to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=THUNDER_RUSTC={version}");

    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(str::to_owned))
        .map(|f| f.to_ascii_lowercase().replace('_', "-"))
        .collect();
    features.sort();
    let features = if features.is_empty() {
        "none".to_owned()
    } else {
        features.join(",")
    };
    println!("cargo:rustc-env=THUNDER_FEATURES={features}");
}

/// The trimmed output of `git ARGS` run in the crate's directory, `None` when git fails (no git,
/// or not a checkout).
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from)?;
    let output = Command::new("git")
        .args(args)
        .current_dir(&dir)
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn rerun_if_changed(path: &str) {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let path = PathBuf::from(path);
    let path = match dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path,
    };
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
