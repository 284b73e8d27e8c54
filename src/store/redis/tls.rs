//! TLS (`rediss://`) for [`RedisStore`](super::RedisStore): builds the `redis` crate client from
//! the URL and [`RedisTlsOptions`], reading and checking the PEM files up front.
//!
//! The same files serve a Redis Cluster (`cluster_certificates`): the crate's cluster client
//! uses them for every node it connects to, the seeds and the nodes CLUSTER SLOTS names.
//!
//! Owns: the choice of trust roots (a CA file given → only its certificates; none → the
//! platform's roots, loaded by the `redis` crate through `rustls-native-certs`, which honours
//! `SSL_CERT_FILE` / `SSL_CERT_DIR`), the optional client certificate for mutual TLS, and the
//! rustls crypto provider (`ring`, installed as the process default if none is installed yet).
//! Never: turns certificate or host name verification off (`rediss://…/#insecure` is refused:
//! the crate's `tls-rustls-insecure` feature is not compiled in), connects over plain TCP when TLS
//! files are configured (a `redis://` URL or Cluster seed with TLS files is an error, not a silent
//! downgrade), puts file contents or the URL into an error, or panics on a bad file.
//! Invariant: every error names the file and the problem, is a typed [`StoreError`], and goes
//! through the [`Redactor`].

use std::path::{Path, PathBuf};

use ::redis::{Client, ClientTlsConfig, ConnectionAddr, ConnectionInfo, TlsCertificates};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::errors::Redactor;
use crate::store::StoreError;

/// TLS settings of a `rediss://` connection, or of every node of a `rediss://` Cluster.
/// `Default`: trust the platform's root certificates, present no client certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTlsOptions {
    /// PEM file with the CA certificate(s) to trust for the server's certificate, instead of the
    /// platform's roots (a private CA, or a self-signed server certificate).
    pub ca_file: Option<PathBuf>,
    /// PEM file with the client certificate (end entity first, then intermediates) for mutual
    /// TLS. Needs [`client_key_file`](Self::client_key_file).
    pub client_cert_file: Option<PathBuf>,
    /// PEM file with the client certificate's private key (PKCS#8, PKCS#1 or SEC1). Needs
    /// [`client_cert_file`](Self::client_cert_file).
    pub client_key_file: Option<PathBuf>,
}

impl RedisTlsOptions {
    /// True when any file is set.
    pub fn is_configured(&self) -> bool {
        self.ca_file.is_some() || self.client_cert_file.is_some() || self.client_key_file.is_some()
    }
}

/// The client for `info`: plain for `redis://` and unix sockets, TLS for `rediss://`.
pub(super) fn client(info: ConnectionInfo, tls: &RedisTlsOptions, redactor: &Redactor) -> Result<Client, StoreError> {
    let insecure = match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => *insecure,
        _ if tls.is_configured() => {
            return Err(StoreError::Config(
                "TLS files are configured but the Redis URL is not rediss:// (refusing to connect without TLS)".into(),
            ));
        }
        _ => return Client::open(info).map_err(|e| client_error(redactor, &e)),
    };
    if insecure {
        return Err(insecure_refused());
    }
    install_crypto_provider();
    let certificates = TlsCertificates { client_tls: client_identity(tls)?, root_cert: ca_certificates(tls)? };
    Client::build_with_tls(info, certificates).map_err(|e| client_error(redactor, &e))
}

/// The certificates a Redis Cluster client presents and trusts, `None` for a plain-TCP Cluster.
///
/// The `redis` crate applies one TLS setting to every node it connects to (seeds and the nodes
/// CLUSTER SLOTS names), so the seeds must agree: mixed schemes are refused here with a message
/// naming the seeds, rather than the crate's bare `InvalidClientConfig`. As on one server, TLS
/// files with plain `redis://` seeds are refused instead of silently unused, and `#insecure`
/// cannot turn verification off.
pub(super) fn cluster_certificates(
    seeds: &[ConnectionInfo],
    tls: &RedisTlsOptions,
) -> Result<Option<TlsCertificates>, StoreError> {
    let tls_seeds: Vec<bool> = seeds.iter().map(|info| matches!(info.addr(), ConnectionAddr::TcpTls { .. })).collect();
    if tls_seeds.iter().any(|&t| t) && tls_seeds.iter().any(|&t| !t) {
        let numbers = |want: bool| {
            let listed: Vec<String> =
                tls_seeds.iter().enumerate().filter(|(_, &t)| t == want).map(|(i, _)| format!("#{}", i + 1)).collect();
            listed.join(", ")
        };
        return Err(StoreError::Config(format!(
            "the Redis Cluster seed nodes mix TLS and plain TCP (rediss:// seeds {}; redis:// seeds {}): every seed \
             must use the same scheme",
            numbers(true),
            numbers(false)
        )));
    }
    if !tls_seeds.first().copied().unwrap_or(false) {
        if tls.is_configured() {
            return Err(StoreError::Config(
                "TLS files are configured but the Redis Cluster seed nodes are not rediss:// (refusing to connect \
                 without TLS)"
                    .into(),
            ));
        }
        return Ok(None);
    }
    if seeds.iter().any(|info| matches!(info.addr(), ConnectionAddr::TcpTls { insecure: true, .. })) {
        return Err(insecure_refused());
    }
    install_crypto_provider();
    Ok(Some(TlsCertificates { client_tls: client_identity(tls)?, root_cert: ca_certificates(tls)? }))
}

/// The certificates a Sentinel-mode store presents and trusts, `None` for plain TCP. With
/// `rediss://<master name>` every connection is TLS — to the sentinels and to the master they name
/// — with the same files: a deployment that serves TLS on its data nodes serves it on its
/// sentinels too (`tls-port`, `tls-replication yes`). As on one server, TLS files with a
/// `redis://` URL are refused rather than silently unused, and `#insecure` is refused.
pub(super) fn sentinel_certificates(
    info: &ConnectionInfo,
    tls: &RedisTlsOptions,
) -> Result<Option<TlsCertificates>, StoreError> {
    match info.addr() {
        ConnectionAddr::TcpTls { insecure: true, .. } => Err(insecure_refused()),
        ConnectionAddr::TcpTls { .. } => {
            install_crypto_provider();
            Ok(Some(TlsCertificates { client_tls: client_identity(tls)?, root_cert: ca_certificates(tls)? }))
        }
        _ if tls.is_configured() => Err(StoreError::Config(
            "TLS files are configured but the Redis URL is not rediss:// (refusing to connect without TLS)".into(),
        )),
        _ => Ok(None),
    }
}

fn insecure_refused() -> StoreError {
    StoreError::Unsupported {
        command: "rediss://#insecure".into(),
        detail: "certificate verification cannot be turned off in this build; trust a private CA with the TLS CA file \
                 option instead"
            .into(),
    }
}

/// Makes `ring` the process's rustls provider unless one is installed already (rustls cannot pick
/// one by itself when a dependency also compiles in another).
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one in between, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn client_error(redactor: &Redactor, err: &::redis::RedisError) -> StoreError {
    // The category only: the crate's texts may echo the URL.
    StoreError::Config(redactor.clean(format!("cannot create Redis client: {:?}", err.kind())))
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| StoreError::Config(format!("cannot read the TLS {what} {}: {e}", path.display())))
}

fn invalid(what: &str, path: &Path, problem: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("invalid TLS {what} {}: {problem}", path.display()))
}

/// A PEM error without echoing file contents (some variants carry a line of the file, which may
/// be part of a private key). Shared with the listener's TLS set-up (`crate::http::tls`).
pub(crate) fn pem_problem(err: &pem::Error) -> &'static str {
    match err {
        pem::Error::NoItemsFound => "no PEM block of the expected type",
        pem::Error::MissingSectionEnd { .. } => "a PEM block has no END line",
        pem::Error::IllegalSectionStart { .. } => "malformed PEM BEGIN line",
        pem::Error::Base64Decode(_) => "a PEM block is not valid base64",
        _ => "not valid PEM",
    }
}

/// Every certificate of the PEM text `bytes` read from `path`; at least one.
fn certificates(what: &str, path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, path, pem_problem(&e)))?;
    if certs.is_empty() {
        return Err(invalid(what, path, "no CERTIFICATE block found"));
    }
    Ok(certs)
}

/// The CA file's bytes, checked to hold only certificates usable as trust anchors.
fn ca_certificates(tls: &RedisTlsOptions) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(path) = &tls.ca_file else { return Ok(None) };
    let what = "CA file";
    let bytes = read(what, path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(what, path, &bytes)? {
        roots.add(cert).map_err(|e| invalid(what, path, e))?;
    }
    Ok(Some(bytes))
}

/// The client certificate and key, checked to parse and to belong together.
fn client_identity(tls: &RedisTlsOptions) -> Result<Option<ClientTlsConfig>, StoreError> {
    let (cert_path, key_path) = match (&tls.client_cert_file, &tls.client_key_file) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        _ => {
            return Err(StoreError::Config(
                "TLS client certificate and client key must be given together (mutual TLS)".into(),
            ))
        }
    };
    let cert_bytes = read("client certificate file", cert_path)?;
    let chain = certificates("client certificate file", cert_path, &cert_bytes)?;
    let key_bytes = read("client key file", key_path)?;
    let key =
        PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| invalid("client key file", key_path, pem_problem(&e)))?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        invalid("client key file", key_path, format!("{e} (with the certificate {})", cert_path.display()))
    })?;
    Ok(Some(ClientTlsConfig { client_cert: cert_bytes, client_key: key_bytes }))
}
