//! Unit tests of `tls.rs`: every bad file is a typed error naming the file, never its contents.

use std::path::{Path, PathBuf};

use rcgen::{CertificateParams, KeyPair};

use super::*;

/// A self-signed certificate for 127.0.0.1 and its key, written to `dir` as `<name>.pem` / `.key`.
fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params").self_signed(&key).expect("sign");
    let (cert_file, key_file) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_file, cert.pem()).expect("write cert");
    std::fs::write(&key_file, key.serialize_pem()).expect("write key");
    (cert_file, key_file)
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rsc-tls-unit-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create dir");
    dir
}

#[test]
fn a_valid_certificate_and_key_build_both_sides_and_offer_http1_only() {
    let dir = temp_dir("valid");
    let (cert, key) = self_signed(&dir, "server");
    let server = server_config(&cert, &key, Some(&cert)).expect("server config with client verification");
    assert_eq!(server.alpn_protocols, vec![b"http/1.1".to_vec()]);
    ClientTls::new(&cert, Some((&cert, &key)), Some("localhost")).expect("client with identity");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_files_are_typed_errors_naming_the_file_without_its_contents() {
    let dir = temp_dir("bad");
    let (cert, key) = self_signed(&dir, "server");
    let (_, other_key) = self_signed(&dir, "other");
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nsecret-looking-bytes\n").expect("write");
    let missing = dir.join("missing.pem");

    let error = server_config(&missing, &key, None).unwrap_err();
    assert!(
        matches!(&error, TlsSetupError::Read { what: "certificate file", path, .. } if *path == missing),
        "{error}"
    );
    let error = server_config(&garbage, &key, None).unwrap_err();
    assert!(matches!(&error, TlsSetupError::Invalid { what: "certificate file", .. }), "{error}");
    assert!(!error.to_string().contains("secret-looking-bytes"), "{error}");
    let error = server_config(&key, &key, None).unwrap_err();
    assert!(error.to_string().contains("no CERTIFICATE block"), "a key file is not a certificate: {error}");
    let error = server_config(&cert, &other_key, None).unwrap_err();
    assert!(matches!(&error, TlsSetupError::Invalid { what: "key file", .. }), "a key of another certificate: {error}");
    let error = server_config(&cert, &key, Some(&garbage)).unwrap_err();
    assert!(matches!(&error, TlsSetupError::Invalid { what: "client CA file", .. }), "{error}");
    let error = ClientTls::new(&cert, None, Some("not a name!")).unwrap_err();
    assert!(matches!(error, TlsSetupError::ServerName(_)), "{error}");
    let error = ClientTls::new(&cert, Some((&cert, &other_key)), None).unwrap_err();
    assert!(matches!(&error, TlsSetupError::Invalid { what: "client key file", .. }), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}
