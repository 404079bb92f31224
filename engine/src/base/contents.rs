//! A base file decoded whole into plain values ([`BaseContents`]): what a model store is built
//! from to check that a store serving from the file answers as the file says.

use super::file::BaseBytes;
use super::format::*;
use super::tier::Base;
use crate::file_header::{SnapshotError, SnapshotHeader};
use crate::post::LightPost;

/// Everything a base file holds, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BaseContents {
    /// The header.
    pub header: Option<SnapshotHeader>,
    /// Each author's originals, secondary and videos timelines, newest first.
    pub authors: Vec<(i64, [Vec<LightPost>; 3])>,
    /// Tombstones: `(post_id, basis_secs)`.
    pub tombstones: Vec<(i64, i64)>,
    /// Reposts waiting for their source: `(source post_id, repost post_id, created_at)`.
    pub waiting: Vec<(i64, i64, i64)>,
}

/// Decodes the base file in `bytes` for a store whose timelines hold at most `cap` entries,
/// after checking it whole (checksums, structure, every record): what it holds, or why it is
/// refused.
pub fn decode_contents(bytes: &[u8], cap: usize) -> Result<BaseContents, SnapshotError> {
    let base = Base::open(BaseBytes::copy_of(bytes), 1, cap)?;
    base.check_records(1)?;
    let file = &base.file;
    let mut contents = BaseContents {
        header: Some(file.header.clone()),
        ..BaseContents::default()
    };
    for at in 0..file.lines {
        let line = file.line(at);
        if !line.used {
            continue;
        }
        let mut kinds: [Vec<LightPost>; 3] = Default::default();
        for (kind, posts) in kinds.iter_mut().enumerate() {
            for index in 0..usize::from(line.lens[kind]) {
                let granule = base.entry_granule(&line, kind, index);
                posts.push(base.record(&line, granule).post.to_light());
            }
        }
        contents.authors.push((line.author_id, kinds));
    }
    for tombstone in file
        .section(Section::Tombstones)
        .chunks_exact(TOMBSTONE_BYTES)
    {
        contents
            .tombstones
            .push((le_i64(tombstone, 0), le_i64(tombstone, 8)));
    }
    for waiting in file.section(Section::Waiting).chunks_exact(WAITING_BYTES) {
        contents.waiting.push((
            le_i64(waiting, 0),
            le_i64(waiting, 8),
            i64::from(le_u32(waiting, 24)),
        ));
    }
    Ok(contents)
}
