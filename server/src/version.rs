//! What this binary is: the crate version, the git commit it was built from, the compiler and
//! the enabled features, stamped by `build.rs`. Exported as `thunder_build_info`, printed by
//! `--version`, logged at start-up and shown on the status page, so that during a rolling
//! upgrade each replica says what it runs.

/// The crate version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from (full hex), or `unknown` when the build had no git
/// checkout (a source tarball). Set `THUNDER_GIT_SHA` at build time to stamp one.
pub const GIT_SHA: &str = env!("THUNDER_GIT_SHA");

/// The compiler's version (`rustc --version` without the `rustc` word).
pub const RUSTC: &str = env!("THUNDER_RUSTC");

/// The crate's enabled cargo features, comma-separated, or `none`.
pub const FEATURES: &str = env!("THUNDER_FEATURES");

/// What `--version` prints after the program name: the version and the git commit.
pub const LONG_VERSION: &str = thunder_buildstamp::long_version!();

/// The first 12 hex digits of [`GIT_SHA`] (all of it when shorter, e.g. `unknown`).
pub fn short_sha() -> &'static str {
    GIT_SHA.get(..12).unwrap_or(GIT_SHA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamps_are_never_empty() {
        for stamp in [VERSION, GIT_SHA, RUSTC, FEATURES] {
            assert!(!stamp.trim().is_empty());
        }
        assert!(LONG_VERSION.starts_with(VERSION));
        assert!(LONG_VERSION.contains(short_sha()));
    }
}
