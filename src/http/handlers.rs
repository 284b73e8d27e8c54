//! Handlers of the group and admin routes: each parses its input strictly (see
//! [`super::error::ApiJson`]), names the group and member in the request span, calls exactly one
//! [`Coordinator`] method and answers with its result.
//!
//! Owns: the JSON shapes of the admin request bodies (the protocol's [`AdminRequest`] split per
//! route), and refusing requests that break the input bounds ([`crate::core::input`]: numbers
//! above `CLIENT_NUMBER_MAX`, bad member ids or shard lists, out-of-range shard counts, invalid
//! configs) with a 400 before the coordinator is called, so they touch nothing. Never: decides or
//! retries anything; the terminating gate, validation of group names and revision checks are the
//! coordinator's (so `COORDINATOR_TERMINATING` comes through unchanged). The coordinator and the
//! core run the same input checks again: they are called without this edge too.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use super::router::AppState;
use crate::core::input::{check_admin_request, check_heartbeat_request, check_routing_report, InputError};
use crate::core::model::{GroupConfig, GroupId};
use crate::core::proof::ViewProof;
use crate::core::protocol::{AdminRequest, AdminResponse, HeartbeatRequest, RoutingReport};
use crate::store::MetadataStore;

/// `GET /v1/groups/{streamPrefix}/{consumerGroup}/routing` query: the metadataVersion of the
/// producer's cached view, if it has one (reporting it lets the coordinator detect lost writes);
/// at most `CLIENT_NUMBER_MAX`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingQuery {
    #[serde(default)]
    pub known_version: Option<u64>,
    /// The highest shard count the producer published with (at most `SHARD_COUNT_MAX`); sent
    /// only to coordinators whose answers carry `acceptsKnownShardCount`.
    #[serde(default)]
    pub known_shard_count: Option<u32>,
    /// The proofs an answer gave of those numbers (`metadataVersionProof`, `shardCountProof`):
    /// a number above the recorded one is evidence only with its proof (DESIGN §8).
    #[serde(default)]
    pub known_version_proof: Option<ViewProof>,
    #[serde(default)]
    pub known_shard_count_proof: Option<ViewProof>,
}

/// `POST /v1/admin/groups` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateGroupBody {
    pub group: GroupId,
    pub shard_count: u32,
    /// Defaults to [`GroupConfig::default`] when absent.
    #[serde(default)]
    pub config: Option<GroupConfig>,
}

/// `POST /v1/admin/groups/{streamPrefix}/{consumerGroup}/shards` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddShardsBody {
    pub expected_revision: u64,
    /// The new total shard count (shards are only ever added).
    pub new_shard_count: u32,
}

/// `PUT /v1/admin/groups/{streamPrefix}/{consumerGroup}/config` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangeConfigBody {
    pub expected_revision: u64,
    pub config: GroupConfig,
}

/// `DELETE /v1/admin/groups/{streamPrefix}/{consumerGroup}` query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteQuery {
    pub expected_revision: u64,
}

/// `POST /v1/admin/index/rebuild` response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebuildIndexResponse {
    pub groups: Vec<GroupId>,
}

type Result<T> = std::result::Result<T, HttpError>;

fn refused(error: InputError) -> HttpError {
    HttpError::bad_request(error.to_string())
}

/// Checks an admin mutation's input and passes it to the coordinator.
async fn admin<S: MetadataStore>(app: &AppState<S>, req: AdminRequest) -> Result<AdminResponse> {
    check_admin_request(&req).map_err(refused)?;
    Ok(app.coordinator.admin(req).await?)
}

/// The group named by the path, recorded in the request span.
fn path_group((stream_prefix, consumer_group): (String, String)) -> GroupId {
    let group = GroupId::new(stream_prefix, consumer_group);
    tracing::Span::current().record("group", tracing::field::display(&group));
    group
}

pub(super) async fn heartbeat<S: MetadataStore>(
    State(app): State<AppState<S>>,
    ApiPath(path): ApiPath<(String, String)>,
    ApiJson(req): ApiJson<HeartbeatRequest>,
) -> Result<Response> {
    let group = path_group(path);
    tracing::Span::current().record("member", req.member_id.as_str());
    if req.group != group {
        return Err(HttpError::bad_request(format!("body names group {} but the path names {group}", req.group)));
    }
    check_heartbeat_request(&req).map_err(refused)?;
    Ok(Json(app.coordinator.heartbeat(req).await?).into_response())
}

pub(super) async fn routing<S: MetadataStore>(
    State(app): State<AppState<S>>,
    ApiPath(path): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<RoutingQuery>,
) -> Result<Response> {
    let group = path_group(path);
    let report = RoutingReport {
        known_version: query.known_version.unwrap_or(0),
        known_shard_count: query.known_shard_count.unwrap_or(0),
        known_version_proof: query.known_version_proof,
        known_shard_count_proof: query.known_shard_count_proof,
    };
    check_routing_report(&report).map_err(refused)?;
    Ok(Json(app.coordinator.routing(&group, report).await?).into_response())
}

pub(super) async fn describe<S: MetadataStore>(
    State(app): State<AppState<S>>,
    ApiPath(path): ApiPath<(String, String)>,
) -> Result<Response> {
    let group = path_group(path);
    Ok(Json(app.coordinator.describe(&group).await?).into_response())
}

pub(super) async fn create_group<S: MetadataStore>(
    State(app): State<AppState<S>>,
    ApiJson(body): ApiJson<CreateGroupBody>,
) -> Result<Response> {
    tracing::Span::current().record("group", tracing::field::display(&body.group));
    let req = AdminRequest::CreateGroup {
        group: body.group,
        shard_count: body.shard_count,
        config: body.config.unwrap_or_default(),
    };
    let response = admin(&app, req).await?;
    tracing::info!(revision = response.store_revision, "group created");
    Ok((StatusCode::CREATED, Json(response)).into_response())
}

pub(super) async fn add_shards<S: MetadataStore>(
    State(app): State<AppState<S>>,
    ApiPath(path): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<AddShardsBody>,
) -> Result<Response> {
    let group = path_group(path);
    let req = AdminRequest::AddShards {
        group,
        expected_revision: body.expected_revision,
        new_shard_count: body.new_shard_count,
    };
    let response = admin(&app, req).await?;
    tracing::info!(shards = body.new_shard_count, revision = response.store_revision, "shards added");
    Ok(Json(response).into_response())
}

pub(super) async fn change_config<S: MetadataStore>(
    State(app): State<AppState<S>>,
    ApiPath(path): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<ChangeConfigBody>,
) -> Result<Response> {
    let group = path_group(path);
    let req = AdminRequest::ChangeConfig { group, expected_revision: body.expected_revision, config: body.config };
    let response = admin(&app, req).await?;
    tracing::info!(revision = response.store_revision, "config changed");
    Ok(Json(response).into_response())
}

pub(super) async fn delete_group<S: MetadataStore>(
    State(app): State<AppState<S>>,
    ApiPath(path): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<DeleteQuery>,
) -> Result<Response> {
    let group = path_group(path);
    let req = AdminRequest::DeleteGroup { group, expected_revision: query.expected_revision };
    let response = admin(&app, req).await?;
    tracing::info!("group deleted");
    Ok(Json(response).into_response())
}

pub(super) async fn rebuild_index<S: MetadataStore>(State(app): State<AppState<S>>) -> Result<Response> {
    let groups = app.coordinator.rebuild_index().await?;
    tracing::info!(groups = groups.len(), "index rebuilt");
    Ok(Json(RebuildIndexResponse { groups }).into_response())
}
