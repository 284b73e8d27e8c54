//! The coordinator's HTTP route table: the single list of (method, path template) pairs that the
//! router serves ([`super::router::app`]), that `docs/openapi.json` documents, and that the API
//! test (`tests/http_api.rs`) checks against both. Adding a route means adding a row here, a
//! handler arm in the router, and an operation in the OpenAPI file; the test fails if the three
//! disagree.
//!
//! This module owns names and paths only; it never handles a request. It also builds request paths
//! for clients (the `coordinator admin` CLI), percent-encoding each segment so a group name can
//! never change which route a request reaches.

use crate::core::model::GroupId;

/// The HTTP methods the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Delete,
}

impl HttpMethod {
    /// Upper-case method name (`GET`).
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Delete => "DELETE",
        }
    }

    /// The `http` crate's method.
    pub fn to_method(self) -> axum::http::Method {
        match self {
            HttpMethod::Get => axum::http::Method::GET,
            HttpMethod::Post => axum::http::Method::POST,
            HttpMethod::Put => axum::http::Method::PUT,
            HttpMethod::Delete => axum::http::Method::DELETE,
        }
    }
}

/// Which handler serves a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteId {
    /// Consumer heartbeat (join, steady, revoke reports, leave).
    Heartbeat,
    /// Producer routing view.
    Routing,
    /// Operator view of a group's recorded metadata.
    Describe,
    /// Admin: create a group.
    CreateGroup,
    /// Admin: add shards (expected revision).
    AddShards,
    /// Admin: replace the group config (expected revision).
    ChangeConfig,
    /// Admin: delete a group (expected revision).
    DeleteGroup,
    /// Admin: rebuild the group index from a SCAN.
    RebuildIndex,
    /// Liveness probe: the process is up.
    Healthz,
    /// Readiness probe: not terminating and the startup store probe passed.
    Readyz,
    /// Prometheus metrics.
    Metrics,
    /// This API's OpenAPI description.
    OpenApi,
}

/// One row of the route table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub id: RouteId,
    pub method: HttpMethod,
    /// Path template in axum / OpenAPI syntax (`{streamPrefix}`).
    pub path: &'static str,
    /// The credential the route requires (when one is configured).
    pub auth: RouteAuth,
}

/// Which credential a route requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteAuth {
    /// None (health, metrics, the API description).
    Open,
    /// A client token whose scope admits the path's group (data plane).
    Client,
    /// The admin token.
    Admin,
}

const GROUP: &str = "/v1/groups/{streamPrefix}/{consumerGroup}";
const ADMIN_GROUP: &str = "/v1/admin/groups/{streamPrefix}/{consumerGroup}";

/// Every route the coordinator serves.
pub const ROUTES: &[RouteSpec] = &[
    route(
        RouteId::Heartbeat,
        HttpMethod::Post,
        "/v1/groups/{streamPrefix}/{consumerGroup}/heartbeat",
        RouteAuth::Client,
    ),
    route(RouteId::Routing, HttpMethod::Get, "/v1/groups/{streamPrefix}/{consumerGroup}/routing", RouteAuth::Client),
    route(RouteId::Describe, HttpMethod::Get, GROUP, RouteAuth::Admin),
    route(RouteId::CreateGroup, HttpMethod::Post, "/v1/admin/groups", RouteAuth::Admin),
    route(
        RouteId::AddShards,
        HttpMethod::Post,
        "/v1/admin/groups/{streamPrefix}/{consumerGroup}/shards",
        RouteAuth::Admin,
    ),
    route(
        RouteId::ChangeConfig,
        HttpMethod::Put,
        "/v1/admin/groups/{streamPrefix}/{consumerGroup}/config",
        RouteAuth::Admin,
    ),
    route(RouteId::DeleteGroup, HttpMethod::Delete, ADMIN_GROUP, RouteAuth::Admin),
    route(RouteId::RebuildIndex, HttpMethod::Post, "/v1/admin/index/rebuild", RouteAuth::Admin),
    route(RouteId::Healthz, HttpMethod::Get, "/healthz", RouteAuth::Open),
    route(RouteId::Readyz, HttpMethod::Get, "/readyz", RouteAuth::Open),
    route(RouteId::Metrics, HttpMethod::Get, "/metrics", RouteAuth::Open),
    route(RouteId::OpenApi, HttpMethod::Get, "/v1/openapi.json", RouteAuth::Open),
];

const fn route(id: RouteId, method: HttpMethod, path: &'static str, auth: RouteAuth) -> RouteSpec {
    RouteSpec { id, method, path, auth }
}

/// The row of `id`.
pub fn spec(id: RouteId) -> &'static RouteSpec {
    // safe: every RouteId has a row; `tests/http_api.rs` and the unit test below check it.
    ROUTES.iter().find(|r| r.id == id).expect("every RouteId has a row in ROUTES")
}

/// The concrete path of a group route: `template` with `{streamPrefix}` and `{consumerGroup}`
/// replaced by the percent-encoded parts of `group`.
pub fn group_path(id: RouteId, group: &GroupId) -> String {
    spec(id)
        .path
        .replace("{streamPrefix}", &encode_segment(&group.stream_prefix))
        .replace("{consumerGroup}", &encode_segment(&group.consumer_group))
}

/// Percent-encodes a path segment: everything but RFC 3986 unreserved characters and ':'.
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_id_has_exactly_one_row_and_rows_are_unique() {
        let ids = [
            RouteId::Heartbeat,
            RouteId::Routing,
            RouteId::Describe,
            RouteId::CreateGroup,
            RouteId::AddShards,
            RouteId::ChangeConfig,
            RouteId::DeleteGroup,
            RouteId::RebuildIndex,
            RouteId::Healthz,
            RouteId::Readyz,
            RouteId::Metrics,
            RouteId::OpenApi,
        ];
        for id in ids {
            assert_eq!(ROUTES.iter().filter(|r| r.id == id).count(), 1, "{id:?}");
        }
        assert_eq!(ROUTES.len(), ids.len());
        let mut pairs: Vec<_> = ROUTES.iter().map(|r| (r.method, r.path)).collect();
        pairs.sort();
        pairs.dedup();
        assert_eq!(pairs.len(), ROUTES.len(), "a (method, path) pair appears twice");
    }

    #[test]
    fn group_paths_encode_segments() {
        let group = GroupId::new("orders/eu", "billing team");
        assert_eq!(group_path(RouteId::Heartbeat, &group), "/v1/groups/orders%2Feu/billing%20team/heartbeat");
        assert_eq!(group_path(RouteId::DeleteGroup, &GroupId::new("a:b", "c")), "/v1/admin/groups/a:b/c");
    }
}
