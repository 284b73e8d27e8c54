//! Redis Sentinel discovery for [`RedisStore`](super::RedisStore): which sentinels to ask, for
//! which master, and how the `redis` crate's [`SentinelClient`] is built from them.
//!
//! Owns: [`RedisSentinelOptions`], their validation, and the check that the store's URL names the
//! master (`redis://[user:password@]<master name>[/db]`) instead of a server, so a configuration
//! can never say "this server" and "whatever Sentinel says" at once.
//! Never: caches the master's address (every connection asks Sentinel again, so the store follows
//! a failover on its next connection), connects to a replica (the crate checks `ROLE` of the
//! master it was given), mixes TLS and plain TCP (`rediss://<master name>`: TLS to the sentinels
//! and to the master, with the same certificates; `redis://`: neither), or puts a password into
//! an error or `Debug` output.
//! Invariant: every error is a typed [`StoreError`] (`Config` for bad settings).

use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{ConnectionAddr, ConnectionInfo, TlsCertificates, TlsMode};

use super::errors::Redactor;
use crate::store::StoreError;

/// Where the store finds its master through Redis Sentinel
/// ([`RedisStoreOptions::sentinel`](super::RedisStoreOptions::sentinel)).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSentinelOptions {
    /// Sentinel addresses, `host:port` each (`[v6addr]:port` for IPv6); at least one. They are
    /// asked in this order for the current master.
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the master under (`sentinel monitor <name> ...`).
    pub master_name: String,
    /// Password of the sentinels themselves (their `requirepass`), when they require AUTH. The
    /// master's credentials come from the store URL's userinfo.
    pub sentinel_password: Option<String>,
}

impl std::fmt::Debug for RedisSentinelOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSentinelOptions")
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .field("sentinel_password", &self.sentinel_password.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// Splits `host:port` (or `[v6]:port`); `None` when either part is missing or the port is not a
/// non-zero u16.
pub fn parse_sentinel_address(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.trim().rsplit_once(':')?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let valid_host = !host.is_empty() && !host.contains(['/', '@', ' ', '[', ']']);
    valid_host.then(|| (host.to_string(), port))
}

/// True when `url` names the master `master_name` the way Sentinel mode needs:
/// `redis[s]://[user:password@]<master name>[/db]`, no port (a host or port would name a server).
pub fn url_names_master(url: &str, master_name: &str) -> bool {
    let scheme_ok = url
        .split_once("://")
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("redis") || scheme.eq_ignore_ascii_case("rediss"));
    scheme_ok && authority_host_port(url) == master_name.trim()
}

/// The part of `url` between `://` (after any userinfo) and the path: `host[:port]`.
fn authority_host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority.rsplit_once('@').map_or(authority, |(_, host)| host)
}

/// Checks `options` and `url` (see [`RedisStore::open`](super::RedisStore::open)) and builds the
/// client that asks the sentinels for the master on every connection. `certificates`: TLS to the
/// sentinels and to the master (the URL is `rediss://`, see `tls::sentinel_certificates`).
pub(super) fn client(
    url: &str,
    info: &ConnectionInfo,
    options: &RedisSentinelOptions,
    certificates: Option<TlsCertificates>,
    redactor: &Redactor,
) -> Result<SentinelClient, StoreError> {
    let name = options.master_name.trim();
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(StoreError::Config("the Sentinel master name must be non-empty, without whitespace".into()));
    }
    if options.sentinels.is_empty() {
        return Err(StoreError::Config("Sentinel needs at least one sentinel address (host:port)".into()));
    }
    let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if tls != certificates.is_some() {
        return Err(StoreError::Config("TLS through Sentinel needs a rediss:// URL and its certificates".into()));
    }
    let mut addresses = Vec::with_capacity(options.sentinels.len());
    for (index, address) in options.sentinels.iter().enumerate() {
        // Named by position, not echoed: an address written as a URL may carry a password.
        let (host, port) = parse_sentinel_address(address)
            .ok_or_else(|| StoreError::Config(format!("sentinel address #{} is not host:port", index + 1)))?;
        addresses.push(if tls {
            ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None }
        } else {
            ConnectionAddr::Tcp(host, port)
        });
    }
    if !matches!(info.addr(), ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }) {
        return Err(StoreError::Config(
            "with Sentinel the Redis URL must be redis[s]://[user:password@]<master name>[/db]".into(),
        ));
    }
    if authority_host_port(url) != name {
        return Err(StoreError::Config(format!(
            "with Sentinel the Redis URL names the master, not a server: expected \
             redis[s]://[user:password@]{name}[/db] (no host or port; Sentinel chooses the server)"
        )));
    }
    let settings = info.redis_settings();
    let build = || {
        let mut builder = SentinelClientBuilder::new(addresses, name, SentinelServerType::Master)?
            .set_client_to_redis_db(settings.db());
        if let Some(username) = settings.username() {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(password) = options.sentinel_password.as_deref().filter(|p| !p.is_empty()) {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(certificates) = &certificates {
            builder = builder
                .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_certificates(certificates.clone())
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certificates.clone());
        }
        builder.build()
    };
    // The category only: the crate's texts may echo settings.
    build()
        .map_err(|e| StoreError::Config(redactor.clean(format!("cannot create the Sentinel client: {:?}", e.kind()))))
}

#[cfg(test)]
mod tests {
    use ::redis::IntoConnectionInfo;

    use super::*;

    fn options(sentinels: &[&str]) -> RedisSentinelOptions {
        RedisSentinelOptions {
            sentinels: sentinels.iter().map(|s| s.to_string()).collect(),
            master_name: "mymaster".into(),
            sentinel_password: Some("sentinel-secret".into()),
        }
    }

    fn build(url: &str, options: &RedisSentinelOptions) -> Result<SentinelClient, StoreError> {
        let info = url.into_connection_info().map_err(|e| StoreError::Config(format!("{:?}", e.kind())))?;
        let certificates = matches!(info.addr(), ConnectionAddr::TcpTls { .. })
            .then(|| TlsCertificates { client_tls: None, root_cert: None });
        client(url, &info, options, certificates, &Redactor::default())
    }

    #[test]
    fn sentinel_addresses_parse_as_host_and_port() {
        assert_eq!(parse_sentinel_address("10.0.0.1:26379"), Some(("10.0.0.1".into(), 26379)));
        assert_eq!(parse_sentinel_address(" sentinel-a:26379 "), Some(("sentinel-a".into(), 26379)));
        assert_eq!(parse_sentinel_address("[::1]:26379"), Some(("::1".into(), 26379)));
        for bad in ["sentinel-a", ":26379", "a:0", "a:99999", "redis://a:26379", "a:x"] {
            assert_eq!(parse_sentinel_address(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_url_must_name_the_master_and_not_a_server() {
        let ok = options(&["127.0.0.1:26379", "127.0.0.1:26380"]);
        assert!(build("redis://mymaster", &ok).is_ok());
        assert!(build("redis://user:pw@mymaster/2", &ok).is_ok());
        for url in ["redis://127.0.0.1:6379", "redis://mymaster:6379", "redis://other/0"] {
            let err = build(url, &ok).err().expect("refused");
            assert!(matches!(&err, StoreError::Config(text) if text.contains("names the master")), "{url}: {err}");
        }
        assert!(build("rediss://mymaster", &ok).is_ok(), "TLS to the sentinels and the master");
        let err = build("rediss://127.0.0.1:6380", &ok).err().expect("refused");
        assert!(matches!(&err, StoreError::Config(text) if text.contains("names the master")), "{err}");
    }

    #[test]
    fn bad_sentinel_settings_are_config_errors() {
        for bad in
            [options(&[]), options(&["nohost"]), RedisSentinelOptions { master_name: " ".into(), ..options(&["a:1"]) }]
        {
            let err = build("redis://mymaster", &bad).err().expect("refused");
            assert!(matches!(err, StoreError::Config(_)), "{err}");
        }
        // An address written as a URL with a password is named by position, never echoed.
        let err = build("redis://mymaster", &options(&["a:1", "redis://:hunter2@b:26379"])).err().expect("refused");
        assert!(err.to_string().contains("#2") && !err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_hides_the_sentinel_password() {
        let text = format!("{:?}", options(&["a:1"]));
        assert!(!text.contains("sentinel-secret"), "{text}");
        assert!(text.contains("mymaster"), "{text}");
    }
}
