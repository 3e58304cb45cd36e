//! Request bodies, read whole into memory only for an authenticated caller with a turn to spare:
//! each caller may be sending at most `--bodies-per-caller` bodies at once (a body is held in memory
//! until its last byte arrives, and a sender that stops sending holds what it sent), so one token
//! cannot make a server buffer `burst x 16 MiB`. The turn is held until the request is done with
//! the body (parsed, and the handler finished), and given back at once if it does not arrive
//! within 25 s.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use bytes::BytesMut;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use jobtrail_service::{Held, Kind, Principal, Service, ServiceError, Slot};

use crate::{Problem, REQUEST_TIMEOUT};

/// How long a body may take to arrive: under the routes' own bound, so a slow one is answered as
/// this module says (400), not cut off by it.
const BODY_TIMEOUT: Duration = REQUEST_TIMEOUT.saturating_sub(Duration::from_secs(5));

/// The largest body of a request that only carries a decision or a reason (cancel, decide): what
/// a person writes, not a provider's request.
pub const SMALL_REQUEST_BYTES: usize = 64 * 1024;

/// A body refused by the strict JSON reader: too large (413) when it is refused for what it would
/// take parsed (send it in parts, or bulk data as a string), else bad input.
pub fn refused_json(e: jobtrail_core::json::BodyError) -> Problem {
    let kind = if e.too_large {
        Kind::TooLarge
    } else {
        Kind::BadInput
    };
    Problem::new(kind, format!("the body is not acceptable JSON: {e}"))
}

/// `body` read whole (at most `limit` bytes) with one of `p`'s turns, which the caller holds
/// for as long as it holds what it made of the body (a parsed JSON value can be many times the
/// size of its text, and a submit holds one while it waits for the database).
pub async fn read(
    service: &Arc<Service>,
    p: &Principal,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<(Bytes, (Slot, Held)), Problem> {
    let (bytes, (slot, mut held)) = read_holding(
        |bytes| Ok((service.body_slot(p)?, service.hold(p.caller(), bytes)?)),
        headers,
        body,
        limit,
        BODY_TIMEOUT,
    )
    .await?;
    held.shrink_to(bytes.len());
    Ok((bytes, (slot, held)))
}

/// `body` read whole (at most `limit` bytes, within `within`) with the turn `turn` gives for the
/// bytes it may hold (the declared length, or `limit` when none is declared), handed back with
/// it; a declared length over `limit` is refused before a turn is taken or a byte read.
pub async fn read_holding<T>(
    turn: impl FnOnce(usize) -> Result<T, ServiceError>,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    within: Duration,
) -> Result<(Bytes, T), Problem> {
    let too_large = || {
        Problem::new(
            Kind::TooLarge,
            format!("the request body is over {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let turn = turn(declared.map_or(limit, |n| n as usize))?;
    // Into one buffer: collecting keeps every chunk (and the read buffer it was cut from), so a
    // body sent a byte at a time would cost many times its size.
    let mut body = Limited::new(body, limit);
    let mut whole = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    let read = async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                whole.extend_from_slice(&data);
            }
        }
        Ok::<_, axum::BoxError>(())
    };
    match tokio::time::timeout(within, read).await {
        Err(_) => Err(Problem::new(
            Kind::BadInput,
            format!(
                "the request body did not arrive within {} s",
                within.as_secs()
            ),
        )),
        Ok(Ok(())) => Ok((whole.freeze(), turn)),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(Problem::new(
            Kind::BadInput,
            format!("reading the request body: {e}"),
        )),
    }
}
