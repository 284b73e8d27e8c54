//! `coordinator admin <command>`: one HTTP/1 request to a running coordinator per command, on a
//! hyper client connection (the same stack as `rsc::http::client`). Paths come from the route
//! table (`rsc::http::routes`), so the CLI and the router cannot drift apart.
//!
//! `--url https://...` speaks TLS, trusting only `--tls-ca-file` and presenting
//! `--tls-client-cert-file` / `--tls-client-key-file` to a coordinator that requires mutual TLS;
//! the coordinator's certificate must name the URL's host.
//!
//! Success prints the answer's JSON to stdout (exit 0). An error answer prints its code and
//! message to stderr (exit 1); so does an unreachable coordinator. Bad arguments exit 2.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1;
use hyper::{header, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};

use super::cli::{AdminArgs, AdminCommand, GroupArgs};
use rsc::core::model::{GroupConfig, GroupId};
use rsc::core::protocol::ApiError;
use rsc::http::routes::{group_path, spec, RouteId};
use rsc::http::tls::ClientTls;

/// Largest answer read.
const BODY_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The arguments are unusable (bad URL, bad config JSON).
    #[error("{0}")]
    Usage(String),
    /// The coordinator could not be reached.
    #[error("cannot reach the coordinator at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    /// The request was sent and no answer came (in time, or before the connection failed): it
    /// may have been received, and a change applied.
    #[error(
        "no answer from the coordinator at {url} ({detail}): the request may have been applied; \
         run `describe` before retrying a change (a retried create then answers GROUP_EXISTS, a retried change \
         REVISION_CONFLICT)"
    )]
    NoAnswer { url: String, detail: String },
    /// The coordinator answered with an error.
    #[error("{} (HTTP {status}): {}", serde_json::to_value(.error.code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(), .error.message)]
    Api { status: StatusCode, error: ApiError },
    /// The coordinator answered something that is neither the expected JSON nor an `ApiError`.
    #[error("unexpected answer (HTTP {status}): {body}")]
    Unexpected { status: StatusCode, body: String },
}

impl AdminError {
    fn exit_code(&self) -> u8 {
        match self {
            AdminError::Usage(_) => 2,
            AdminError::Unreachable { .. }
            | AdminError::NoAnswer { .. }
            | AdminError::Api { .. }
            | AdminError::Unexpected { .. } => 1,
        }
    }
}

/// Runs one admin command and maps the outcome to an exit code.
pub async fn main(args: AdminArgs) -> u8 {
    match run(args).await {
        Ok(answer) => {
            use std::io::Write;
            let text = serde_json::to_string_pretty(&answer).unwrap_or_else(|_| answer.to_string());
            // A closed stdout (`| head`) is not this command's failure: the request succeeded.
            let _ = writeln!(std::io::stdout(), "{text}");
            0
        }
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    }
}

async fn run(args: AdminArgs) -> Result<Value, AdminError> {
    let client = Client::new(&args.url, args.token.clone(), Duration::from_millis(args.timeout_ms))?.with_tls(&args)?;
    match args.command {
        AdminCommand::CreateGroup { group, shards, config_json } => {
            let config = wire_config(merged_config(default_config()?, config_json.as_deref())?);
            let body = json!({"group": group_id(&group), "shardCount": shards, "config": config});
            client.send(Method::POST, spec(RouteId::CreateGroup).path.to_owned(), Some(body)).await
        }
        AdminCommand::AddShards { group, expected_revision, shards } => {
            let body = json!({"expectedRevision": expected_revision, "newShardCount": shards});
            client.send(Method::POST, group_path(RouteId::AddShards, &group_id(&group)), Some(body)).await
        }
        AdminCommand::SetConfig { group, expected_revision, config_json } => {
            // Start from the recorded config; the server's revision check rejects the change if
            // the group moved past `expected_revision` meanwhile.
            let described = client.send(Method::GET, group_path(RouteId::Describe, &group_id(&group)), None).await?;
            let current = described["metadata"]["config"].clone();
            check_fencing_known(&current, &config_json)?;
            let config = wire_config(merged_config(current, Some(&config_json))?);
            let body = json!({"expectedRevision": expected_revision, "config": config});
            client.send(Method::PUT, group_path(RouteId::ChangeConfig, &group_id(&group)), Some(body)).await
        }
        AdminCommand::Describe { group } => {
            client.send(Method::GET, group_path(RouteId::Describe, &group_id(&group)), None).await
        }
        AdminCommand::RebuildIndex => {
            client.send(Method::POST, spec(RouteId::RebuildIndex).path.to_owned(), None).await
        }
        AdminCommand::Delete { group, expected_revision } => {
            let path =
                format!("{}?expectedRevision={expected_revision}", group_path(RouteId::DeleteGroup, &group_id(&group)));
            client.send(Method::DELETE, path, None).await
        }
    }
}

fn group_id(args: &GroupArgs) -> GroupId {
    GroupId::new(args.prefix.clone(), args.group.clone())
}

fn default_config() -> Result<Value, AdminError> {
    serde_json::to_value(GroupConfig::default()).map_err(|e| AdminError::Usage(format!("encoding defaults: {e}")))
}

/// `base` with the keys of `overrides` (a JSON object) replaced; unknown keys are an error.
fn merged_config(base: Value, overrides: Option<&str>) -> Result<Value, AdminError> {
    let Value::Object(mut config) = base else {
        return Err(AdminError::Usage("the recorded config is not a JSON object".into()));
    };
    if let Some(text) = overrides {
        let parsed: Value =
            serde_json::from_str(text).map_err(|e| AdminError::Usage(format!("--config-json is not JSON: {e}")))?;
        let Value::Object(changes) = parsed else {
            return Err(AdminError::Usage("--config-json must be a JSON object".into()));
        };
        let known: Map<String, Value> = match default_config()? {
            Value::Object(known) => known,
            _ => Map::new(),
        };
        for (key, value) in changes {
            if !known.contains_key(&key) {
                let keys: Vec<&String> = known.keys().collect();
                return Err(AdminError::Usage(format!("unknown config key {key:?}; known keys: {keys:?}")));
            }
            config.insert(key, value);
        }
    }
    let config = Value::Object(config);
    let checked: GroupConfig =
        serde_json::from_value(config.clone()).map_err(|e| AdminError::Usage(format!("invalid config: {e}")))?;
    checked.validate().map_err(|e| AdminError::Usage(format!("invalid config: {e}")))?;
    Ok(config)
}

/// Refuses a change built on a described config without `fencing` that does not name it: every
/// coordinator that knows the field describes it, so the answer came from an older one, which
/// leaves it out whatever the record holds. Merged from that, the change would be sent with
/// fencing on (absent means on) and, through an upgraded coordinator, turn a group's
/// `fencing: false` back on, with applications whose Redis user cannot run the fence scripts.
fn check_fencing_known(described: &Value, overrides: &str) -> Result<(), AdminError> {
    let named = |config: &Value| config.as_object().is_some_and(|c| c.contains_key("fencing"));
    // Unparsable overrides are `merged_config`'s to report, with what is wrong with them.
    let Ok(overrides) = serde_json::from_str::<Value>(overrides) else { return Ok(()) };
    if named(described) || named(&overrides) {
        return Ok(());
    }
    Err(AdminError::Usage(
        "the coordinator that described the group does not know its `fencing` setting (an older release): \
         run set-config through an upgraded coordinator, or name \"fencing\" in --config-json"
            .into(),
    ))
}

/// `config` as sent: without `fencing` when it is on. Absent means on to every coordinator that
/// knows the field, and a coordinator older than it refuses a body naming it (it rejects unknown
/// fields at any depth), so during a rolling update the default config reaches either version.
/// `fencing: false` is still sent: an older coordinator refuses it, rather than recording a config
/// that every newer one would read as fencing on (docs/DESIGN.md §6).
fn wire_config(mut config: Value) -> Value {
    if let Value::Object(map) = &mut config {
        if map.get("fencing") == Some(&Value::Bool(true)) {
            map.remove("fencing");
        }
    }
    config
}

/// An HTTP/1 client for one coordinator base URL.
struct Client {
    url: String,
    authority: String,
    host: String,
    port: u16,
    token: Option<String>,
    timeout: Duration,
    /// `https://` URL.
    https: bool,
    tls: Option<ClientTls>,
}

impl Client {
    fn new(url: &str, token: Option<String>, timeout: Duration) -> Result<Self, AdminError> {
        let uri: Uri = url.parse().map_err(|e| AdminError::Usage(format!("invalid --url {url:?}: {e}")))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(AdminError::Usage(format!(
                    "--url must be http://host:port or https://host:port (got {url:?})"
                )))
            }
        };
        let authority = uri.authority().ok_or_else(|| AdminError::Usage(format!("--url {url:?} has no host")))?;
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        // Trimmed as the server trims what it reads: a token from a file ends with a newline,
        // which no header may carry.
        let token = token.map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
        let authority = authority.to_string();
        Ok(Self { url: url.to_owned(), authority, host, port, token, timeout, https, tls: None })
    }

    /// TLS for an `https://` URL from the `--tls-*` files: a CA is required (the coordinator's
    /// certificate is checked against it and the URL's host), a client certificate is optional;
    /// TLS files with an `http://` URL are refused rather than silently unused.
    fn with_tls(mut self, args: &AdminArgs) -> Result<Self, AdminError> {
        let usage = |message: &str| Err(AdminError::Usage(message.into()));
        let identity = match (&args.tls_client_cert_file, &args.tls_client_key_file) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            _ => return usage("--tls-client-cert-file and --tls-client-key-file go together"),
        };
        match (self.https, &args.tls_ca_file) {
            (false, None) if identity.is_none() => Ok(self),
            (false, _) => usage("TLS files are set, so --url must be https://..."),
            (true, None) => usage("an https:// --url needs --tls-ca-file (the CA of the coordinator's certificate)"),
            (true, Some(ca_file)) => {
                let tls = ClientTls::new(ca_file, identity, Some(&self.host));
                self.tls = Some(tls.map_err(|e| AdminError::Usage(e.to_string()))?);
                Ok(self)
            }
        }
    }

    /// Sends one request; `Ok` only for a 2xx with a JSON body.
    async fn send(&self, method: Method, path: String, body: Option<Value>) -> Result<Value, AdminError> {
        // Set once the request is handed to the connection: a failure or timeout after that may
        // follow a request the coordinator received.
        let sent = std::sync::atomic::AtomicBool::new(false);
        let failed = |detail: String| {
            let url = self.url.clone();
            if sent.load(std::sync::atomic::Ordering::SeqCst) {
                AdminError::NoAnswer { url, detail }
            } else {
                AdminError::Unreachable { url, detail }
            }
        };
        let exchange = self.exchange(method, &path, body, &sent);
        let (status, bytes) = rsc::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| failed(format!("nothing within {:?}", self.timeout)))?
            .map_err(failed)?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|_| AdminError::Unexpected {
                status,
                body: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
            });
        }
        match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(error) => Err(AdminError::Api { status, error }),
            Err(_) => Err(AdminError::Unexpected {
                status,
                body: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
            }),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        sent: &std::sync::atomic::AtomicBool,
    ) -> Result<(StatusCode, Bytes), String> {
        let stream =
            tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await.map_err(|e| e.to_string())?;
        match &self.tls {
            None => self.exchange_on(stream, method, path, body, sent).await,
            Some(tls) => {
                let peer = stream.peer_addr().map_err(|e| e.to_string())?;
                let stream = tls.connect(peer, stream).await.map_err(|e| format!("TLS handshake: {e}"))?;
                self.exchange_on(stream, method, path, body, sent).await
            }
        }
    }

    async fn exchange_on<S>(
        &self,
        stream: S,
        method: Method,
        path: &str,
        body: Option<Value>,
        sent: &std::sync::atomic::AtomicBool,
    ) -> Result<(StatusCode, Bytes), String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "admin connection ended with an error");
            }
        });
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json");
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let payload = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let request = request.body(Full::new(payload)).map_err(|e| e.to_string())?;
        sent.store(true, std::sync::atomic::Ordering::SeqCst);
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let collected =
            Limited::new(response.into_body(), BODY_BYTES_MAX).collect().await.map_err(|e| e.to_string())?;
        Ok((status, collected.to_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A described config without `fencing` came from a coordinator older than the field, which
    /// leaves it out whatever the record holds: a set-config built on it was sent with fencing on,
    /// and through an upgraded coordinator turned a group's `fencing: false` back on.
    #[test]
    fn a_set_config_built_on_a_describe_without_fencing_must_name_it() {
        let mut recorded = default_config().expect("defaults");
        recorded["fencing"] = json!(false);
        check_fencing_known(&recorded, r#"{"heartbeatIntervalMs": 2000}"#).expect("described by an upgraded one");
        let mut old = recorded.clone();
        old.as_object_mut().expect("object").remove("fencing");
        let error = check_fencing_known(&old, r#"{"heartbeatIntervalMs": 2000}"#).unwrap_err();
        assert!(matches!(&error, AdminError::Usage(m) if m.contains("fencing")), "{error}");
        check_fencing_known(&old, r#"{"fencing": false}"#).expect("named by the operator");
    }

    /// A coordinator that took the request and did not answer in time may have applied it: the
    /// CLI said "cannot reach the coordinator", and the operator's retry then met GROUP_EXISTS or
    /// REVISION_CONFLICT for a change that had in fact been made.
    #[tokio::test]
    async fn no_answer_in_time_says_the_change_may_have_been_applied() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let client = Client::new(&url, None, Duration::from_millis(200)).expect("client");
        let error = client.send(Method::POST, "/v1/groups".into(), Some(json!({}))).await.unwrap_err();
        assert!(matches!(error, AdminError::NoAnswer { .. }), "{error}");
        assert!(error.to_string().contains("may have been applied"), "{error}");
        assert_eq!(error.exit_code(), 1);
        silent.abort();
        // Nothing listening: nothing was sent, so nothing can have been applied.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", closed.local_addr().expect("addr"));
        drop(closed);
        let client = Client::new(&url, None, Duration::from_millis(200)).expect("client");
        let error = client.send(Method::POST, "/v1/groups".into(), Some(json!({}))).await.unwrap_err();
        assert!(matches!(error, AdminError::Unreachable { .. }), "{error}");
    }

    #[test]
    fn config_overrides_merge_over_the_base_and_are_validated() {
        let merged =
            merged_config(default_config().expect("defaults"), Some(r#"{"assignmentLeaseMs":5000}"#)).expect("merges");
        assert_eq!(merged["assignmentLeaseMs"], 5000);
        assert_eq!(merged["memberLeaseTtlMs"], GroupConfig::default().member_lease_ttl_ms);
        let unknown = merged_config(default_config().expect("defaults"), Some(r#"{"leaseMs":1}"#)).unwrap_err();
        assert!(matches!(unknown, AdminError::Usage(ref m) if m.contains("leaseMs")), "{unknown}");
        let invalid =
            merged_config(default_config().expect("defaults"), Some(r#"{"assignmentLeaseMs":99999}"#)).unwrap_err();
        assert!(matches!(invalid, AdminError::Usage(ref m) if m.contains("assignmentLeaseMs")), "{invalid}");
    }

    #[test]
    fn fencing_on_is_sent_as_absent_and_fencing_off_as_written() {
        let on = wire_config(merged_config(default_config().expect("defaults"), None).expect("merges"));
        assert_eq!(on.get("fencing"), None, "absent reads as on, and older coordinators accept it");
        let base = default_config().expect("defaults");
        let off = wire_config(merged_config(base, Some(r#"{"fencing":false}"#)).expect("merges"));
        assert_eq!(off["fencing"], false);
        let decoded: GroupConfig = serde_json::from_value(on).expect("decodes");
        assert!(decoded.fencing);
    }

    #[test]
    fn urls() {
        let client = Client::new("http://[::1]:7420", None, Duration::from_secs(1)).expect("ipv6");
        assert_eq!((client.host.as_str(), client.port), ("::1", 7420));
        assert!(matches!(Client::new("ftp://x:1", None, Duration::from_secs(1)), Err(AdminError::Usage(_))));
        let https = Client::new("https://coordinator.internal", None, Duration::from_secs(1)).expect("https");
        assert_eq!((https.port, https.https), (443, true));
        assert!(matches!(Client::new("not a url", None, Duration::from_secs(1)), Err(AdminError::Usage(_))));
        let client = Client::new("http://localhost", Some(" ".into()), Duration::from_secs(1)).expect("default port");
        assert_eq!((client.port, client.token.is_none()), (80, true));
    }

    #[test]
    fn https_needs_a_ca_file_and_tls_files_need_https() {
        use clap::Parser;

        let usage = |args: &[&str]| {
            let mut argv = vec!["coordinator", "admin", "rebuild-index"];
            argv.extend_from_slice(args);
            let cli = super::super::cli::Cli::try_parse_from(argv).expect("parses");
            let super::super::cli::Command::Admin(admin) = cli.command else { panic!("admin") };
            let client = Client::new(&admin.url, None, Duration::from_secs(1)).expect("url");
            match client.with_tls(&admin) {
                Ok(client) => Ok(client.tls.is_some()),
                Err(AdminError::Usage(message)) => Err(message),
                Err(other) => panic!("{other}"),
            }
        };
        assert_eq!(usage(&["--url", "http://127.0.0.1:7420"]), Ok(false));
        let https = usage(&["--url", "https://127.0.0.1:7420"]).unwrap_err();
        assert!(https.contains("--tls-ca-file"), "{https}");
        let plain = usage(&["--url", "http://127.0.0.1:7420", "--tls-ca-file", "/ca.pem"]).unwrap_err();
        assert!(plain.contains("https://"), "{plain}");
        let half = usage(&["--url", "https://h:1", "--tls-ca-file", "/ca.pem", "--tls-client-cert-file", "/c.pem"]);
        assert!(half.unwrap_err().contains("together"));
        let missing = usage(&["--url", "https://h:1", "--tls-ca-file", "/nonexistent/ca.pem"]).unwrap_err();
        assert!(missing.contains("/nonexistent/ca.pem"), "the unreadable file is named: {missing}");
    }
}
