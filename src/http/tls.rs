//! TLS for the coordinator's own HTTP edge: the listener's rustls [`ServerConfig`] (optionally
//! verifying client certificates: mutual TLS) and [`ClientTls`], what [`super::client`] uses to
//! speak `https://` to it.
//!
//! Owns: reading and checking the PEM files once, up front (a bad file is a typed
//! [`TlsSetupError`] naming the file and the problem, never a panic and never the file's contents),
//! and the crypto provider (`ring`, passed explicitly, so nothing depends on a process default).
//! Never: turns certificate or host name verification off, or falls back to plain TCP when TLS is
//! configured. Both sides offer only HTTP/1.1 over ALPN, the only protocol the edge serves.
//!
//! Not compiled under `--cfg madsim`: the coordinator binary, the only place a listener gets TLS,
//! is not built for the simulation, and the simulation checks the coordination protocol inside one
//! process over simulated TCP, where TLS would protect nothing, would cost every simulated
//! connection a handshake, and would put a second source of randomness (the key exchange) into runs
//! that must replay from one seed. TLS is tested on real sockets instead (`tests/e2e/https.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::store::redis::tls::pem_problem;

/// Why a TLS configuration could not be built from its files.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A file could not be read.
    #[error("cannot read the TLS {what} {}: {source}", path.display())]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    /// A file was read but does not hold what it must (no certificate, a malformed block, a key
    /// that does not match its certificate, a certificate unusable as a trust anchor).
    #[error("invalid TLS {what} {}: {problem}", path.display())]
    Invalid { what: &'static str, path: PathBuf, problem: String },
    /// The name to verify the server's certificate against is not a DNS name or an IP address.
    #[error("invalid TLS server name {0:?}: expected a DNS name or an IP address")]
    ServerName(String),
    /// rustls refused the assembled configuration.
    #[error("cannot build the TLS configuration: {0}")]
    Rustls(String),
}

/// The listener's TLS configuration: `cert_file` (the chain, leaf first) and `key_file` (PKCS#8,
/// PKCS#1 or SEC1) are presented to clients; with `client_ca_file`, every client must present a
/// certificate chaining to one of its CAs or the handshake fails.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca_file: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("certificate file", cert_file)?;
    let key = private_key(key_file)?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Rustls(e.to_string()))?;
    let builder = match client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let roots = Arc::new(trust_anchors("client CA file", ca_file)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| TlsSetupError::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsSetupError::Invalid {
        what: "key file",
        path: key_file.into(),
        problem: format!("{e} (with the certificate {})", cert_file.display()),
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client side of the coordinator's TLS: trust only the CAs of one file, optionally present a
/// client certificate (mutual TLS), and verify the server's certificate against a name.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    /// `None`: each address's IP is the name its certificate must carry (an IP SAN).
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the CA certificates in `ca_file`; presents `identity` (certificate chain file, key
    /// file) when given; verifies the server's certificate against `server_name` (a DNS name or
    /// IP address), or, without one, against the IP address dialled.
    pub fn new(
        ca_file: &Path,
        identity: Option<(&Path, &Path)>,
        server_name: Option<&str>,
    ) -> Result<Self, TlsSetupError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSetupError::Rustls(e.to_string()))?
            .with_root_certificates(trust_anchors("CA file", ca_file)?);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert_file, key_file)) => {
                let chain = certificates("client certificate file", cert_file)?;
                builder.with_client_auth_cert(chain, private_key(key_file)?).map_err(|e| TlsSetupError::Invalid {
                    what: "client key file",
                    path: key_file.into(),
                    problem: format!("{e} (with the certificate {})", cert_file.display()),
                })?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = match server_name {
            None => None,
            Some(name) => {
                Some(ServerName::try_from(name.to_string()).map_err(|_| TlsSetupError::ServerName(name.into()))?)
            }
        };
        Ok(Self { connector: TlsConnector::from(Arc::new(config)), server_name })
    }

    /// Runs the TLS handshake on `stream`, a connection to `addr`. (Under TLS 1.3 a server that
    /// refuses the client's certificate says so only after this returns: the first read fails.)
    pub async fn connect(&self, addr: SocketAddr, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let name = self.server_name.clone().unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        self.connector.connect(name, stream).await
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|source| TlsSetupError::Read { what, path: path.into(), source })
}

fn invalid(what: &'static str, path: &Path, problem: impl std::fmt::Display) -> TlsSetupError {
    TlsSetupError::Invalid { what, path: path.into(), problem: problem.to_string() }
}

/// Every certificate in the PEM file at `path`; at least one.
fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let bytes = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, path, pem_problem(&e)))?;
    if certs.is_empty() {
        return Err(invalid(what, path, "no CERTIFICATE block found"));
    }
    Ok(certs)
}

/// The certificates of a CA file, each checked to be usable as a trust anchor.
fn trust_anchors(what: &'static str, path: &Path) -> Result<RootCertStore, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(what, path)? {
        roots.add(cert).map_err(|e| invalid(what, path, e))?;
    }
    Ok(roots)
}

/// The first private key in the PEM file at `path`.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    let bytes = read("key file", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| invalid("key file", path, pem_problem(&e)))
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
