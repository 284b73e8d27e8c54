//! Throwaway TLS material for tests, made with the `openssl` CLI at test time (never committed):
//! a CA, a server certificate for `127.0.0.1` and `localhost` signed by it, and a client
//! certificate signed by it (for `tls-auth-clients yes`). EC P-256 keys, valid for 2 days.
//!
//! Owns only files in the directory it is given; the caller removes that directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files of one generated CA with a server and a client certificate.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Runs `openssl` in `dir` with `args` (space-separated; file names are relative to `dir`) and
/// then `extra` (arguments that may contain spaces).
fn openssl(dir: &Path, args: &str, extra: &[&str]) {
    let output =
        Command::new("openssl").current_dir(dir).args(args.split_whitespace()).args(extra).output().unwrap_or_else(
            |e| panic!("cannot run openssl: {e}. The TLS tests need the openssl CLI (apt-get install openssl)"),
        );
    assert!(
        output.status.success(),
        "openssl {args} {extra:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// EC P-256 keys: fast to generate, supported by redis-server (OpenSSL) and rustls.
const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

/// A self-signed CA `<name>-ca.crt` / `<name>-ca.key` in `dir`; returns (cert, key).
pub fn generate_ca(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).expect("create the TLS directory");
    let (cert, key) = (format!("{name}-ca.crt"), format!("{name}-ca.key"));
    let args = format!(
        "req -x509 {NEW_KEY} -keyout {key} -out {cert} -days 2 -addext basicConstraints=critical,CA:TRUE \
         -addext keyUsage=critical,keyCertSign,cRLSign"
    );
    openssl(dir, &args, &["-subj", &format!("/CN={name} test CA")]);
    (dir.join(cert), dir.join(key))
}

/// A certificate `<name>.crt` / `<name>.key` in `dir` signed by the CA `<ca>-ca.crt` in `dir`, with
/// `extensions` (an OpenSSL extension file body).
fn issue(dir: &Path, name: &str, ca: &str, serial: u32, extensions: &str) -> (PathBuf, PathBuf) {
    let (cert, key) = (format!("{name}.crt"), format!("{name}.key"));
    std::fs::write(dir.join(format!("{name}.ext")), extensions).expect("write the extension file");
    openssl(dir, &format!("req {NEW_KEY} -keyout {key} -out {name}.csr -subj /CN={name}"), &[]);
    let args = format!(
        "x509 -req -in {name}.csr -CA {ca}-ca.crt -CAkey {ca}-ca.key -set_serial {serial} -days 2 \
         -extfile {name}.ext -out {cert}"
    );
    openssl(dir, &args, &[]);
    (dir.join(cert), dir.join(key))
}

/// A CA named `rsc` with a server certificate (SAN IP 127.0.0.1, DNS localhost) and a client
/// certificate, all in `dir`.
pub fn generate(dir: &Path) -> TlsFiles {
    let ca = generate_ca(dir, "rsc");
    let server = issue(
        dir,
        "server",
        "rsc",
        2,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    );
    let client = issue(
        dir,
        "client",
        "rsc",
        3,
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    );
    TlsFiles {
        ca_cert: ca.0,
        ca_key: ca.1,
        server_cert: server.0,
        server_key: server.1,
        client_cert: client.0,
        client_key: client.1,
    }
}
