//! The request and response fields beyond the reference contract: the seen filter
//! (`seen_filter`), the time bounds (`min_created_at`, `max_created_at`) and paging (`cursor`,
//! `next_cursor`). A request without them gets exactly the reference behaviour.

use thunder_engine::seen::SEEN_FILTER_MAX_BYTES;
use thunder_engine::{AnswerWindow, PagePosition, QueryOutcome, SeenFilter};
use thunder_proto::GetInNetworkPostsRequest;

use crate::error::ServiceError;
use crate::serve::cursor::{Cursor, CursorKey};

/// The checked extension fields of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extensions {
    /// The seen filter, if sent.
    pub seen: Option<SeenFilter>,
    /// Time bounds and the page position, ready for the engine (the cursor's `as_of` is
    /// folded into `max_created_at`).
    pub window: AnswerWindow,
    /// The cursor the request came with, if any.
    pub cursor: Option<Cursor>,
}

impl Extensions {
    /// Checks the extension fields of `req`; any malformed one is INVALID_ARGUMENT with a
    /// message naming the field.
    pub fn from_request(req: &GetInNetworkPostsRequest) -> Result<Self, ServiceError> {
        let invalid = |field: &str, why: &dyn std::fmt::Display| {
            ServiceError::InvalidArgument(format!("{field}: {why}"))
        };
        let seen = match &req.seen_filter {
            None => None,
            Some(f) => {
                // Checked before anything is copied.
                if f.bits.len() > SEEN_FILTER_MAX_BYTES {
                    return Err(invalid(
                        "seen_filter",
                        &format_args!(
                            "bits has {} bytes, more than the limit of {SEEN_FILTER_MAX_BYTES}",
                            f.bits.len()
                        ),
                    ));
                }
                let format = u32::try_from(f.format).unwrap_or(u32::MAX);
                Some(
                    SeenFilter::from_parts(format, f.seed, f.num_blocks, &f.bits)
                        .map_err(|e| invalid("seen_filter", &e))?,
                )
            }
        };
        let cursor = if req.cursor.is_empty() {
            None
        } else {
            Some(
                CursorKey::global()
                    .open(&req.cursor)
                    .map_err(|e| invalid("cursor", &e))?,
            )
        };
        if let (Some(min), Some(max)) = (req.min_created_at, req.max_created_at)
            && min > max
        {
            return Err(invalid(
                "min_created_at",
                &format_args!("{min} is after max_created_at {max}"),
            ));
        }
        let max_created_at = match (req.max_created_at, cursor) {
            (Some(max), Some(c)) => Some(max.min(c.as_of_secs)),
            (max, c) => max.or(c.map(|c| c.as_of_secs)),
        };
        Ok(Self {
            seen,
            window: AnswerWindow {
                min_created_at: req.min_created_at,
                max_created_at,
                after: cursor.and_then(|c| c.after),
            },
            cursor,
        })
    }
}

/// The `next_cursor` of an answer to a page of `max_results` posts read in `window`, for a
/// request that came with `cursor`: after its last post when the page is full; the page's own
/// start when the query ran out of time (asking again retries it); empty when the answer is
/// complete.
pub fn next_cursor(
    cursor: Option<Cursor>,
    window: &AnswerWindow,
    max_results: usize,
    outcome: &QueryOutcome,
) -> Vec<u8> {
    let as_of_secs = cursor.map_or(outcome.as_of_secs, |c| c.as_of_secs);
    let next = if outcome.timed_out {
        Cursor {
            as_of_secs,
            after: window.after,
        }
    } else {
        match outcome.posts.last() {
            Some(last) if max_results > 0 && outcome.posts.len() >= max_results => Cursor {
                as_of_secs,
                after: Some(PagePosition::of(last)),
            },
            _ => return Vec::new(),
        }
    };
    CursorKey::global().seal(&next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use thunder_engine::LightPost;
    use thunder_proto as pb;

    fn request() -> GetInNetworkPostsRequest {
        GetInNetworkPostsRequest {
            user_id: 1,
            following_user_ids: vec![2],
            ..Default::default()
        }
    }

    fn message(req: &GetInNetworkPostsRequest) -> String {
        match Extensions::from_request(req) {
            Err(ServiceError::InvalidArgument(m)) => m,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[test]
    fn absent_fields_change_nothing() {
        let ext = Extensions::from_request(&request()).expect("valid");
        assert_eq!(ext, Extensions::default());
        assert_eq!(ext.window, AnswerWindow::ALL);
    }

    #[test]
    fn malformed_filters_are_invalid_with_a_reason() {
        let filter = |format: i32, num_blocks: u32, bytes: usize| GetInNetworkPostsRequest {
            seen_filter: Some(pb::SeenFilter {
                format,
                seed: 0,
                num_blocks,
                bits: vec![0; bytes],
            }),
            ..request()
        };
        assert!(message(&filter(0, 1, 32)).contains("format 0 is not supported"));
        assert!(message(&filter(-1, 1, 32)).contains("is not supported"));
        assert!(message(&filter(1, 0, 0)).contains("num_blocks must be at least 1"));
        assert!(message(&filter(1, 2, 32)).contains("expected num_blocks * 32 = 64"));
        assert!(message(&filter(1, 32_769, 32_769 * 32)).contains("more than the limit"));
        let ok = Extensions::from_request(&filter(1, 2, 64)).expect("valid");
        assert_eq!(ok.seen.map(|f| f.num_blocks()), Some(2));
    }

    #[test]
    fn malformed_cursors_and_bounds_are_invalid() {
        let with_cursor = |cursor: Vec<u8>| GetInNetworkPostsRequest {
            cursor,
            ..request()
        };
        assert!(message(&with_cursor(vec![1, 2, 3])).starts_with("cursor: 3 bytes, expected 58"));
        let mut forged = CursorKey::global().seal(&Cursor {
            as_of_secs: 100,
            after: None,
        });
        forged[5] ^= 1;
        assert!(message(&with_cursor(forged)).contains("failed authentication"));
        let bounds = GetInNetworkPostsRequest {
            min_created_at: Some(10),
            max_created_at: Some(9),
            ..request()
        };
        assert!(message(&bounds).contains("after max_created_at"));
    }

    #[test]
    fn cursor_pins_the_window_and_next_cursor_follows_the_page() {
        let start = Cursor {
            as_of_secs: 500,
            after: Some(PagePosition {
                created_at: 400,
                post_id: 9,
            }),
        };
        let req = GetInNetworkPostsRequest {
            cursor: CursorKey::global().seal(&start),
            max_created_at: Some(600),
            ..request()
        };
        let ext = Extensions::from_request(&req).expect("valid");
        assert_eq!(ext.window.max_created_at, Some(500));
        assert_eq!(ext.window.after, start.after);

        let full = QueryOutcome {
            posts: vec![
                LightPost::original(8, 2, 390),
                LightPost::original(3, 2, 380),
            ],
            as_of_secs: 999,
            ..QueryOutcome::default()
        };
        let next = CursorKey::global()
            .open(&next_cursor(ext.cursor, &ext.window, 2, &full))
            .expect("own cursor");
        assert_eq!(
            next,
            Cursor {
                as_of_secs: 500,
                after: Some(PagePosition {
                    created_at: 380,
                    post_id: 3
                })
            }
        );
        // Short page: the answer is complete.
        assert!(next_cursor(ext.cursor, &ext.window, 3, &full).is_empty());
        // Timed out: retry the same page.
        let timed_out = QueryOutcome {
            timed_out: true,
            ..full
        };
        let retry = CursorKey::global()
            .open(&next_cursor(ext.cursor, &ext.window, 3, &timed_out))
            .expect("own cursor");
        assert_eq!(retry, start);
        // A first page takes the clock of its answer.
        let first = next_cursor(
            None,
            &AnswerWindow::ALL,
            2,
            &QueryOutcome {
                posts: timed_out.posts.clone(),
                as_of_secs: 999,
                ..QueryOutcome::default()
            },
        );
        assert_eq!(
            CursorKey::global().open(&first).map(|c| c.as_of_secs),
            Ok(999)
        );
    }
}
