//! Request bodies, read whole into memory only for an authenticated caller with a turn to spare:
//! each caller may be sending at most `--bodies-per-caller` bodies at once (a body is held in memory
//! until its last byte arrives, and a sender that stops sending holds what it sent), so one token
//! cannot make a server buffer `burst x 16 MiB`. A body that does not arrive within
//! [`crate::REQUEST_TIMEOUT`] is refused, and its turn given back.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use jobtrail_service::{Kind, Principal, Service};

use crate::{Problem, REQUEST_TIMEOUT};

/// The largest body of a request that only carries a decision or a reason (cancel, decide): what
/// a person writes, not a provider's request.
pub const SMALL_REQUEST_BYTES: usize = 64 * 1024;

/// `body` read whole (at most `limit` bytes) while holding one of `p`'s turns.
pub async fn read(
    service: &Arc<Service>,
    p: &Principal,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, Problem> {
    let too_large = || {
        Problem::new(
            Kind::TooLarge,
            format!("the request body is over {limit} bytes"),
        )
    };
    // A declared length over the limit is refused before a byte of it is read.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let _turn = service.body_slot(p)?;
    let collected = tokio::time::timeout(REQUEST_TIMEOUT, Limited::new(body, limit).collect())
        .await
        .map_err(|_| {
            Problem::new(
                Kind::BadInput,
                format!(
                    "the request body did not arrive within {} s",
                    REQUEST_TIMEOUT.as_secs()
                ),
            )
        })?;
    match collected {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => Err(Problem::new(
            Kind::BadInput,
            format!("reading the request body: {e}"),
        )),
    }
}
