//! Stamps the build (`src/version.rs`): see thunder-buildstamp.

fn main() {
    thunder_buildstamp::stamp();
}
