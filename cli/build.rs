//! Stamps the build (`--version`): see thunder-buildstamp.

fn main() {
    thunder_buildstamp::stamp();
}
