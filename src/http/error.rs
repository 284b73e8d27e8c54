//! The HTTP edge's one error type, [`HttpError`], and the extractors that turn every malformed
//! request into it: [`ApiJson`] (body), [`ApiPath`] and [`ApiQuery`].
//!
//! Owns: the mapping from protocol errors ([`ApiError`]) and request rejections to HTTP responses.
//! Invariant: every error response is `ApiError` JSON (`{"code": ..., "message": ...}`) — never
//! axum's plain-text rejection bodies — and a 5xx body never carries internals: its message is a
//! fixed text per code, while the original message (store error details, parse errors of stored
//! data) goes to the log. Malformed input is always rejected *before* the coordinator is called,
//! so a rejected request writes nothing.
//!
//! Status codes: protocol errors use [`ErrorCode::http_status`]. Request rejections carry code
//! `BAD_REQUEST` with 400 (syntax, types, unknown fields, bad path or query), 413 (body over the
//! limit) or 415 (missing or wrong `Content-Type`); unknown routes 404 and wrong methods 405, also
//! with code `BAD_REQUEST` (the protocol has no dedicated code for them).

use std::collections::BTreeMap;
use std::time::Duration;

use super::serve::BodyReadTimeout;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::core::protocol::{ApiError, ErrorCode};

/// Longest message echoed back to a client (parse errors can quote client input).
const MESSAGE_CHARS_MAX: usize = 512;

/// An error answer: an [`ApiError`] and the HTTP status it is sent with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpError {
    pub status: StatusCode,
    pub error: ApiError,
}

impl HttpError {
    /// A rejected request (`BAD_REQUEST` code) with the given 4xx status.
    pub fn rejected(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, error: ApiError::new(ErrorCode::BadRequest, truncate(message.into())) }
    }

    /// A 400 `BAD_REQUEST`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::rejected(StatusCode::BAD_REQUEST, message)
    }

    fn from_bytes_rejection(rejection: BytesRejection) -> Self {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            Self::rejected(status, "request body is larger than the configured limit")
        } else {
            Self::bad_request(format!("could not read the request body: {}", rejection.body_text()))
        }
    }
}

impl From<ApiError> for HttpError {
    fn from(error: ApiError) -> Self {
        let status = StatusCode::from_u16(error.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self { status, error }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let HttpError { status, error } = self;
        let body = if status.is_server_error() {
            log_server_error(status, &error);
            ApiError::new(error.code, public_message(error.code))
        } else {
            error
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        // Request bodies are read as sent: no content coding is accepted (RFC 9110 §12.5.3).
        if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            response.headers_mut().insert(header::ACCEPT_ENCODING, header::HeaderValue::from_static("identity"));
        }
        response
    }
}

/// `METADATA_MISSING` answers for groups only a client says existed (this instance holds nothing
/// of them and the index does not list them: [`crate::service::UNSEEN_MISSING`]) are logged at
/// ERROR at most once per this period per process; the others at DEBUG. Any client can ask about
/// a group it names with a version above 0 (and a producer still running after its group was
/// deleted does so every `refresh_retry_ms`): one ERROR line per request let it flood the log and
/// bury every other error. A group this instance holds or the index lists is logged every time.
/// `rsc_metadata_missing_total` still counts every one.
const MISSING_LOG_PERIOD: Duration = Duration::from_secs(10);

/// The answers whose log lines are rate-limited, each on its own turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Noisy {
    /// `METADATA_MISSING` for a group only a client says existed (see [`MISSING_LOG_PERIOD`]).
    UnseenMissing,
    /// `STORE_UNAVAILABLE`: during an outage every heartbeat of every member gets it, one WARN
    /// line each (N lines a second for N members); the metrics count them all.
    StoreUnavailable,
    /// `METADATA_INCOMPATIBLE`: every request of a corrupted group's members, two ERROR lines
    /// each until an operator acts; `rsc_metadata_schema_errors_total` counts them all.
    Incompatible,
}

/// When each kind of noisy answer was last logged at its full level, and how many were logged at
/// DEBUG since.
struct LogTurns(std::sync::Mutex<BTreeMap<Noisy, (tokio::time::Instant, u64)>>);

impl LogTurns {
    const fn new() -> Self {
        Self(std::sync::Mutex::new(BTreeMap::new()))
    }

    /// Whether an answer of kind `kind` at `now` is logged at its full level (once per
    /// [`MISSING_LOG_PERIOD`] per kind), and how many were not since the last that was.
    fn turn(&self, kind: Noisy, now: tokio::time::Instant) -> Option<u64> {
        let mut logged = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match logged.get_mut(&kind) {
            Some((at, quiet)) if now.saturating_duration_since(*at) < MISSING_LOG_PERIOD => {
                *quiet += 1;
                None
            }
            last => {
                let quiet = last.map_or(0, |(_, quiet)| *quiet);
                logged.insert(kind, (now, 0));
                Some(quiet)
            }
        }
    }
}

/// This process's turns (one per process: log lines, not behaviour).
static NOISY_LOGGED: LogTurns = LogTurns::new();

fn log_turn(kind: Noisy) -> Option<u64> {
    NOISY_LOGGED.turn(kind, tokio::time::Instant::now())
}

/// Logs the full message of a 5xx in the current request span; the client gets
/// [`public_message`] only.
fn log_server_error(status: StatusCode, error: &ApiError) {
    match error.code {
        ErrorCode::CoordinatorTerminating => {
            tracing::debug!(status = status.as_u16(), code = ?error.code, message = %error.message, "refused")
        }
        ErrorCode::MetadataMissing if !error.message.contains(crate::service::UNSEEN_MISSING) => {
            tracing::error!(status = status.as_u16(), code = ?error.code, message = %error.message, "server error")
        }
        ErrorCode::MetadataMissing => match log_turn(Noisy::UnseenMissing) {
            Some(quiet) => tracing::error!(
                status = status.as_u16(),
                code = ?error.code,
                message = %error.message,
                logged_at_debug_since = quiet,
                "server error (further such METADATA_MISSING answers in the next 10 s are logged at debug)"
            ),
            None => {
                tracing::debug!(status = status.as_u16(), code = ?error.code, message = %error.message, "server error")
            }
        },
        ErrorCode::StoreUnavailable => match log_turn(Noisy::StoreUnavailable) {
            Some(quiet) => tracing::warn!(
                status = status.as_u16(),
                code = ?error.code,
                message = %error.message,
                logged_at_debug_since = quiet,
                "store error (further STORE_UNAVAILABLE answers in the next 10 s are logged at debug)"
            ),
            None => {
                tracing::debug!(status = status.as_u16(), code = ?error.code, message = %error.message, "store error")
            }
        },
        ErrorCode::MetadataIncompatible => match log_turn(Noisy::Incompatible) {
            Some(quiet) => tracing::error!(
                status = status.as_u16(),
                code = ?error.code,
                message = %error.message,
                logged_at_debug_since = quiet,
                "server error (further METADATA_INCOMPATIBLE answers in the next 10 s are logged at debug)"
            ),
            None => {
                tracing::debug!(status = status.as_u16(), code = ?error.code, message = %error.message, "server error")
            }
        },
        _ => tracing::error!(status = status.as_u16(), code = ?error.code, message = %error.message, "server error"),
    }
}

/// The fixed client-facing message of a server-side error code.
pub fn public_message(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::StoreUnavailable => "the metadata store is unavailable or busy; retry later",
        ErrorCode::CoordinatorTerminating => "coordinator is terminating; retry against another instance",
        ErrorCode::MetadataMissing => "the group's metadata is missing; failing closed (nothing is rebuilt)",
        ErrorCode::MetadataIncompatible => "the group's stored metadata is incompatible with this coordinator",
        ErrorCode::Internal => "internal coordinator error; nothing was written",
        ErrorCode::UnknownMember
        | ErrorCode::FencedMemberEpoch
        | ErrorCode::GroupNotFound
        | ErrorCode::BadRequest
        | ErrorCode::RevisionConflict
        | ErrorCode::GroupExists
        | ErrorCode::GroupNotEmpty
        | ErrorCode::Unauthorized
        | ErrorCode::Forbidden
        | ErrorCode::SessionMismatch
        | ErrorCode::MemberIdInUse => "request failed",
    }
}

fn truncate(mut message: String) -> String {
    if let Some((at, _)) = message.char_indices().nth(MESSAGE_CHARS_MAX) {
        message.truncate(at);
        message.push('…');
    }
    message
}

/// A JSON request body, strictly parsed: `Content-Type: application/json` (or `application/*+json`)
/// is required (415), the body limit applies (413), and syntax errors, wrong types, missing fields
/// and *unknown fields at any depth* are 400 ([`parse_strict`]: some nested protocol types do not
/// deny unknown fields themselves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json_content_type(req.headers()) {
            return Err(HttpError::rejected(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "expected a request body with Content-Type: application/json",
            ));
        }
        if let Some(coding) = content_coding(req.headers()) {
            return Err(HttpError::rejected(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("request bodies with Content-Encoding {coding:?} are not accepted: send plain JSON"),
            ));
        }
        // Bounded in time: a stalled body would otherwise hold its concurrency slot forever.
        let limit = req.extensions().get::<BodyReadTimeout>().map_or(BODY_READ_TIMEOUT_DEFAULT, |t| t.0);
        let bytes = match crate::time::timeout(limit, Bytes::from_request(req, state)).await {
            Ok(read) => read.map_err(HttpError::from_bytes_rejection)?,
            Err(_) => {
                return Err(HttpError::rejected(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body did not arrive in time",
                ));
            }
        };
        parse_strict(&bytes).map(ApiJson)
    }
}

/// Body read bound when the request did not come through [`super::serve::serve`] (tests).
pub(super) const BODY_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Parses `bytes` as `T`, rejecting unknown fields at any depth: the parse reports every key it
/// ignored (`serde_ignored`), so a key is refused exactly when no declared field took it. (An
/// earlier check compared the input with the parsed value encoded again, and so refused declared
/// fields spelled out at a default the encoding leaves out, `"memberSession": null` or
/// `"fenced": []`.) Blind spot: serde parses an internally tagged enum's (`#[serde(tag)]`)
/// buffered content out of sight; no request body holds one.
pub fn parse_strict<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    let invalid = |e: serde_json::Error| HttpError::bad_request(format!("invalid request body: {e}"));
    let mut ignored: Option<String> = None;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_ignored::deserialize(&mut de, |path| {
        ignored.get_or_insert_with(|| path_text(&path));
    })
    .map_err(invalid)?;
    de.end().map_err(invalid)?;
    match ignored {
        Some(path) => Err(HttpError::bad_request(format!("invalid request body: unknown field `{path}`"))),
        None => Ok(value),
    }
}

/// `group.extra`, `revoking[0].x`: a key's path as the body spells it.
fn path_text(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", path_text(parent)),
        Path::Map { parent, key } => match path_text(parent) {
            at if at.is_empty() => key.clone(),
            at => format!("{at}.{key}"),
        },
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => path_text(parent),
    }
}

/// The first content coding of the request other than `identity` (`gzip`, `br`, ...), if any: the
/// body would be parsed as if it were not encoded, so it is refused instead (RFC 9110 §8.4: 415,
/// with `Accept-Encoding: identity`).
fn content_coding(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::CONTENT_ENCODING).iter().find_map(|value| {
        let Ok(text) = value.to_str() else { return Some(String::from_utf8_lossy(value.as_bytes()).into_owned()) };
        text.split(',')
            .map(str::trim)
            .find(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"))
            .map(str::to_string)
    })
}

fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let Some((kind, subtype)) = essence.split_once('/') else { return false };
    kind == "application" && (subtype == "json" || subtype.ends_with("+json"))
}

/// Path parameters; a rejection (e.g. a segment that is not UTF-8 after percent-decoding) is a
/// 400 `BAD_REQUEST` (a 5xx rejection means the route table and the handler disagree: a bug).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(path_rejection(rejection)),
        }
    }
}

fn path_rejection(rejection: PathRejection) -> HttpError {
    if rejection.status().is_server_error() {
        HttpError::from(ApiError::new(ErrorCode::Internal, format!("path extraction: {}", rejection.body_text())))
    } else {
        HttpError::bad_request(format!("invalid path: {}", rejection.body_text()))
    }
}

/// Query parameters; any rejection is a 400 `BAD_REQUEST`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(query_rejection(rejection)),
        }
    }
}

fn query_rejection(rejection: QueryRejection) -> HttpError {
    HttpError::bad_request(format!("invalid query: {}", rejection.body_text()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::protocol::HeartbeatRequest;

    /// Of the answers that come once per request (METADATA_MISSING for unseen groups; during an
    /// outage STORE_UNAVAILABLE, N WARN lines a second for N members; METADATA_INCOMPATIBLE for a
    /// corrupted group), only the first of a period is logged at full level, per kind; the count
    /// of the others is reported with the next. (On its own turns: the process's are shared by
    /// every test running at once.)
    #[tokio::test]
    async fn noisy_answers_take_one_full_line_per_period_and_kind() {
        let turns = LogTurns::new();
        let t0 = tokio::time::Instant::now();
        for kind in [Noisy::UnseenMissing, Noisy::StoreUnavailable, Noisy::Incompatible] {
            assert_eq!(turns.turn(kind, t0), Some(0), "{kind:?}: the first is logged");
            for i in 1..=100 {
                assert_eq!(
                    turns.turn(kind, t0 + Duration::from_millis(i)),
                    None,
                    "{kind:?}: at debug within the period"
                );
            }
        }
        let later = t0 + MISSING_LOG_PERIOD + Duration::from_millis(1);
        assert_eq!(
            turns.turn(Noisy::StoreUnavailable, later),
            Some(100),
            "the next period's first reports the quiet ones"
        );
        assert_eq!(turns.turn(Noisy::StoreUnavailable, later), None);
    }

    #[test]
    fn strict_parse_rejects_unknown_fields_at_any_depth() {
        let ok = r#"{"group":{"streamPrefix":"o","consumerGroup":"g"},"memberId":"a","memberEpoch":0,
            "metadataVersion":0,"assignmentEpoch":0}"#;
        assert!(parse_strict::<HeartbeatRequest>(ok.as_bytes()).is_ok());
        let nested = ok.replace(r#""consumerGroup":"g""#, r#""consumerGroup":"g","extra":1"#);
        let err = parse_strict::<HeartbeatRequest>(nested.as_bytes()).unwrap_err();
        assert_eq!((err.status, err.error.code), (StatusCode::BAD_REQUEST, ErrorCode::BadRequest));
        assert!(err.error.message.contains("group.extra"), "{}", err.error.message);
        let revoke =
            ok.replace(r#""memberId""#, r#""revoking":[{"shard":1,"inFlight":0,"revoked":true,"x":2}],"memberId""#);
        let err = parse_strict::<HeartbeatRequest>(revoke.as_bytes()).unwrap_err();
        assert!(err.error.message.contains("revoking[0].x"), "{}", err.error.message);
        let null_extra = ok.replace(r#""consumerGroup":"g""#, r#""consumerGroup":"g","extra":null"#);
        let err = parse_strict::<HeartbeatRequest>(null_extra.as_bytes()).unwrap_err();
        assert!(err.error.message.contains("group.extra"), "{}", err.error.message);
        let top = ok.replace(r#""memberId""#, r#""extra":[],"memberId""#);
        assert!(parse_strict::<HeartbeatRequest>(top.as_bytes()).unwrap_err().error.message.contains("extra"));
        let trailing = format!("{ok} {{}}");
        assert!(parse_strict::<HeartbeatRequest>(trailing.as_bytes()).is_err());
    }

    /// A JSON client may spell out a declared field at its default, including the defaults our
    /// own encoding leaves out (`skip_serializing_if`): the body means what it would mean without
    /// them (review finding: these were refused as unknown fields).
    #[test]
    fn strict_parse_accepts_declared_fields_spelled_out_at_their_default() {
        let plain = r#"{"group":{"streamPrefix":"o","consumerGroup":"g"},"memberId":"a","memberEpoch":3,
            "metadataVersion":2,"assignmentEpoch":1,"revoking":[{"shard":1,"inFlight":0,"revoked":true}]}"#;
        let spelled = r#"{"group":{"streamPrefix":"o","consumerGroup":"g"},"memberId":"a","memberEpoch":3,
            "metadataVersion":2,"assignmentEpoch":1,"owned":[],"leave":false,"memberSession":null,"fenced":[],
            "metadataVersionProof":null,"revoking":[{"shard":1,"inFlight":0,"revoked":true,"revokeId":null}]}"#;
        let expected = parse_strict::<HeartbeatRequest>(plain.as_bytes()).expect("plain body");
        assert_eq!(parse_strict::<HeartbeatRequest>(spelled.as_bytes()).expect("spelled-out defaults"), expected);
    }

    async fn body_of(error: HttpError) -> (StatusCode, ApiError, HeaderMap) {
        use http_body_util::BodyExt;
        let response = error.into_response();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.expect("body").to_bytes();
        (parts.status, serde_json::from_slice(&bytes).expect("ApiError JSON"), parts.headers)
    }

    #[tokio::test]
    async fn server_errors_hide_their_message_and_client_errors_keep_it() {
        let leaky = ApiError::new(ErrorCode::StoreUnavailable, "redis at /var/run/redis.sock: boom");
        let (status, body, _) = body_of(HttpError::from(leaky)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, ApiError::new(ErrorCode::StoreUnavailable, public_message(ErrorCode::StoreUnavailable)));
        let conflict = ApiError::new(ErrorCode::RevisionConflict, "expected revision 1, stored revision is 2");
        let (status, body, _) = body_of(HttpError::from(conflict.clone())).await;
        assert_eq!((status, body), (StatusCode::CONFLICT, conflict));
        let (status, _, headers) = body_of(HttpError::from(ApiError::new(ErrorCode::Unauthorized, "no"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(headers.get(header::WWW_AUTHENTICATE).map(|v| v.as_bytes()), Some(b"Bearer".as_slice()));
    }

    #[test]
    fn json_content_types() {
        let mut headers = HeaderMap::new();
        assert!(!is_json_content_type(&headers));
        for (value, expected) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/merge-patch+json", true),
            ("text/plain", false),
            ("application/jsonx", false),
        ] {
            headers.insert(header::CONTENT_TYPE, value.parse().expect("header"));
            assert_eq!(is_json_content_type(&headers), expected, "{value}");
        }
    }

    #[test]
    fn only_identity_request_bodies_are_read() {
        let mut headers = HeaderMap::new();
        assert_eq!(content_coding(&headers), None);
        for (value, expected) in [
            ("identity", None),
            ("Identity", None),
            ("gzip", Some("gzip")),
            ("identity, br", Some("br")),
            (" GZIP ", Some("GZIP")),
        ] {
            headers.insert(header::CONTENT_ENCODING, value.parse().expect("header"));
            assert_eq!(content_coding(&headers).as_deref(), expected, "{value}");
        }
        // A second Content-Encoding header counts too.
        headers.insert(header::CONTENT_ENCODING, "identity".parse().expect("header"));
        headers.append(header::CONTENT_ENCODING, "deflate".parse().expect("header"));
        assert_eq!(content_coding(&headers).as_deref(), Some("deflate"));
    }

    #[tokio::test]
    async fn an_unsupported_media_type_names_the_accepted_coding() {
        let (status, _, headers) =
            body_of(HttpError::rejected(StatusCode::UNSUPPORTED_MEDIA_TYPE, "expected JSON")).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(headers.get(header::ACCEPT_ENCODING).map(|v| v.as_bytes()), Some(b"identity".as_slice()));
    }

    #[test]
    fn long_messages_are_truncated() {
        let error = HttpError::bad_request("x".repeat(5_000));
        assert_eq!(error.error.message.chars().count(), MESSAGE_CHARS_MAX + 1);
    }
}
