//! Credentials at the HTTP edge: the admin token and the data plane's client tokens.
//!
//! Owns: parsing client-token specifications, matching a request's bearer token against them in
//! constant time, and the group scope a token may touch. Never: logs or prints a token (`Debug`
//! shows only how many there are and their scopes), or lets an unauthenticated request reach the
//! coordinator. Invariant: with client tokens configured, a data-plane request without a valid,
//! in-scope token is refused here (401 / 403) and writes nothing — in particular it cannot record
//! loss evidence (`knownVersion`, `knownShardCount`, a heartbeat's version) or touch a member.
//!
//! Specification of one client token (`--client-token`, `COORDINATOR_CLIENT_TOKENS`, the config
//! file's `client_tokens`): `TOKEN` (every group), or `SCOPE=TOKEN` where `SCOPE` is
//! `<streamPrefix>:<consumerGroup>` and either part may be `*` (`orders:*`, `*:billing`); it is
//! split at its last `:` (a prefix may contain `:`, as in `orders:eu:billing`), and each part
//! must be one a group id can have. A token is 16 to 512 visible ASCII characters without `=`,
//! `,` or whitespace (base64url and hex fit).

use std::fmt;

use axum::http::{header, HeaderMap};
use subtle::ConstantTimeEq;

use crate::core::model::GroupId;
use crate::core::protocol::{ApiError, ErrorCode};

/// Shortest and longest client token accepted, in bytes.
pub const CLIENT_TOKEN_LEN_MIN: usize = 16;
pub const CLIENT_TOKEN_LEN_MAX: usize = 512;

/// The groups a client token may touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupScope {
    /// `None`: any stream prefix.
    pub stream_prefix: Option<String>,
    /// `None`: any consumer group.
    pub consumer_group: Option<String>,
}

impl GroupScope {
    pub const ALL: GroupScope = GroupScope { stream_prefix: None, consumer_group: None };

    pub fn admits(&self, group: &GroupId) -> bool {
        self.stream_prefix.as_ref().is_none_or(|p| *p == group.stream_prefix)
            && self.consumer_group.as_ref().is_none_or(|g| *g == group.consumer_group)
    }
}

impl fmt::Display for GroupScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |p: &Option<String>| p.clone().unwrap_or_else(|| "*".into());
        write!(f, "{}:{}", part(&self.stream_prefix), part(&self.consumer_group))
    }
}

/// One configured client token and its scope.
#[derive(Clone, PartialEq, Eq)]
struct ClientToken {
    secret: String,
    scope: GroupScope,
}

/// The data plane's client tokens (several may be valid at once, for rotation). Empty: the data
/// plane is open (the binary warns at startup).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientTokens {
    tokens: Vec<ClientToken>,
}

impl fmt::Debug for ClientTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scopes: Vec<String> = self.tokens.iter().map(|t| t.scope.to_string()).collect();
        f.debug_struct("ClientTokens").field("scopes", &scopes).finish()
    }
}

/// Why a client-token specification was refused (the token itself is never echoed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenSpecError {
    #[error("client token #{index}: a token is {CLIENT_TOKEN_LEN_MIN}..={CLIENT_TOKEN_LEN_MAX} visible ASCII characters without '=', ',' or spaces")]
    Token { index: usize },
    #[error("client token #{index}: the scope must be <streamPrefix>:<consumerGroup> (split at the last ':'), each part a valid one of a group id or '*'")]
    Scope { index: usize },
}

impl ClientTokens {
    /// Parses specifications (see the module docs). Blank entries are skipped.
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<Self, TokenSpecError> {
        let mut tokens = Vec::new();
        for (index, spec) in specs.iter().map(AsRef::as_ref).map(str::trim).enumerate() {
            if spec.is_empty() {
                continue;
            }
            let (scope, secret) = match spec.split_once('=') {
                Some((scope, secret)) => (parse_scope(scope).ok_or(TokenSpecError::Scope { index })?, secret),
                None => (GroupScope::ALL, spec),
            };
            let well_formed = (CLIENT_TOKEN_LEN_MIN..=CLIENT_TOKEN_LEN_MAX).contains(&secret.len())
                && secret.bytes().all(|b| b.is_ascii_graphic() && b != b'=' && b != b',');
            if !well_formed {
                return Err(TokenSpecError::Token { index });
            }
            tokens.push(ClientToken { secret: secret.to_owned(), scope });
        }
        Ok(Self { tokens })
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether `secret` is one of the configured client tokens (configuration checks only).
    pub fn contains_secret(&self, secret: &str) -> bool {
        self.tokens.iter().any(|token| token.secret == secret)
    }

    /// `Ok` when no token is configured, or the request's bearer token is one of them and its
    /// scope admits `group`. Every configured token is compared (in constant time each), so the
    /// time taken does not tell which one matched.
    pub fn check(&self, headers: &HeaderMap, group: &GroupId) -> Result<(), ApiError> {
        self.check_presented(bearer(headers), group)
    }

    /// [`check`](Self::check) for a token presented outside HTTP headers (the simulation's
    /// datagram protocol).
    pub fn check_presented(&self, presented: Option<&str>, group: &GroupId) -> Result<(), ApiError> {
        if self.tokens.is_empty() {
            return Ok(());
        }
        let Some(presented) = presented else {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                "data-plane routes need Authorization: Bearer <client token>",
            ));
        };
        let mut matched: Option<&ClientToken> = None;
        for token in &self.tokens {
            if bool::from(presented.as_bytes().ct_eq(token.secret.as_bytes())) && matched.is_none() {
                matched = Some(token);
            }
        }
        match matched {
            None => Err(ApiError::new(ErrorCode::Unauthorized, "the client token is not valid")),
            Some(token) if token.scope.admits(group) => Ok(()),
            Some(_) => {
                Err(ApiError::new(ErrorCode::Forbidden, format!("the client token may not touch group {group}")))
            }
        }
    }
}

/// `<prefix>:<group>` with `*` wildcards; each part a valid one of a [`GroupId`] (so a prefix may
/// contain ':', split at the last one: a prefix such as `orders:eu` could not be named before,
/// only over-granted with `*`, and a part no group can have, such as `ord*`, admitted nothing).
fn parse_scope(scope: &str) -> Option<GroupScope> {
    let (prefix, group) = scope.trim().rsplit_once(':')?;
    let part = |p: &str, valid: &dyn Fn(&str) -> bool| -> Option<Option<String>> {
        match p {
            "*" => Some(None),
            p if valid(p) => Some(Some(p.to_owned())),
            _ => None,
        }
    };
    Some(GroupScope {
        stream_prefix: part(prefix, &|p| GroupId::new(p, "g").validate().is_ok())?,
        consumer_group: part(group, &|g| GroupId::new("p", g).validate().is_ok())?,
    })
}

/// The bearer token of `Authorization: Bearer <token>` (scheme case-insensitive).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// `Ok` when no admin token is configured or the request carries it (compared in constant time).
pub fn check_admin_token(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = expected else { return Ok(()) };
    match bearer(headers) {
        Some(token) if bool::from(token.as_bytes().ct_eq(expected.as_bytes())) => Ok(()),
        Some(_) => Err(ApiError::new(ErrorCode::Unauthorized, "admin token is wrong")),
        None => Err(ApiError::new(ErrorCode::Unauthorized, "admin routes need Authorization: Bearer <token>")),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbb";

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).expect("header"));
        h
    }

    fn orders() -> GroupId {
        GroupId::new("orders", "billing")
    }

    #[test]
    fn no_tokens_is_open_and_any_configured_token_admits_its_scope_only() {
        assert!(ClientTokens::default().check(&HeaderMap::new(), &orders()).is_ok());
        let tokens = ClientTokens::parse(&[A.to_string(), format!("payments:*={B}")]).expect("valid");
        assert_eq!(tokens.len(), 2);
        assert!(tokens.check(&headers(&format!("Bearer {A}")), &orders()).is_ok());
        assert!(tokens.check(&headers(&format!("bearer {B}")), &GroupId::new("payments", "x")).is_ok());
        let code = |h: HeaderMap| tokens.check(&h, &orders()).expect_err("refused").code;
        assert_eq!(code(headers(&format!("Bearer {B}"))), ErrorCode::Forbidden, "valid token, other scope");
        assert_eq!(code(headers("Bearer cccccccccccccccccccc")), ErrorCode::Unauthorized);
        assert_eq!(code(headers(&format!("Basic {A}"))), ErrorCode::Unauthorized);
        assert_eq!(code(HeaderMap::new()), ErrorCode::Unauthorized);
        assert_eq!(code(headers(&format!("Bearer {A}x"))), ErrorCode::Unauthorized, "a prefix is not the token");
    }

    #[test]
    fn scopes_and_tokens_are_validated_and_never_echoed() {
        let scoped = ClientTokens::parse(&[format!("*:billing={A}")]).expect("valid");
        assert!(scoped.check(&headers(&format!("Bearer {A}")), &orders()).is_ok());
        assert!(scoped.check(&headers(&format!("Bearer {A}")), &GroupId::new("orders", "audit")).is_err());
        // A prefix with ':' (split at the last one), as group ids allow.
        let eu = ClientTokens::parse(&[format!("orders:eu:billing={A}")]).expect("valid");
        assert!(eu.check(&headers(&format!("Bearer {A}")), &GroupId::new("orders:eu", "billing")).is_ok());
        assert!(eu.check(&headers(&format!("Bearer {A}")), &GroupId::new("orders", "billing")).is_err());
        let any_eu = ClientTokens::parse(&[format!("orders:eu:*={A}")]).expect("valid");
        assert!(any_eu.check(&headers(&format!("Bearer {A}")), &GroupId::new("orders:eu", "audit")).is_ok());
        for bad in [
            "short",
            "has space in it, and more",
            ":x=aaaaaaaaaaaaaaaaaaaa",
            "x:=aaaaaaaaaaaaaaaaaaaa",
            "ord*:x=aaaaaaaaaaaaaaaaaaaa",
            "orders:bill ing=aaaaaaaaaaaaaaaaaaaa",
        ] {
            let error = ClientTokens::parse(&[bad]).expect_err(bad);
            assert!(!error.to_string().contains(bad), "{error}");
        }
        assert!(ClientTokens::parse(&["", "  "]).expect("blank entries skipped").is_empty());
        assert!(!format!("{scoped:?}").contains(A), "Debug never shows a token");
    }

    #[test]
    fn the_admin_token_is_checked_in_constant_time() {
        assert!(check_admin_token(None, &HeaderMap::new()).is_ok());
        assert!(check_admin_token(Some("t0k"), &headers("Bearer t0k")).is_ok());
        assert!(check_admin_token(Some("t0k"), &headers("bearer t0k")).is_ok());
        for bad in ["Bearer t0", "Bearer t0k0", "Basic t0k", "Bearer"] {
            assert_eq!(check_admin_token(Some("t0k"), &headers(bad)).unwrap_err().code, ErrorCode::Unauthorized);
        }
        assert!(check_admin_token(Some("t0k"), &HeaderMap::new()).is_err());
    }
}
