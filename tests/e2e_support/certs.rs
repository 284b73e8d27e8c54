//! Certificates made at test time (rcgen, ring): a private CA and the server and client
//! certificates it signs, written as PEM files, for the coordinator listener's TLS tests. Nothing
//! is checked in, so no certificate can expire under the tests.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority whose certificate and issued files live in one directory.
pub struct TestCa {
    dir: PathBuf,
    name: String,
    cert: Certificate,
    key: KeyPair,
}

/// The PEM files of an issued certificate.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    /// A new CA named `name`; its certificate is written to `<dir>/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("rsc test CA {name}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("self-sign the CA");
        std::fs::create_dir_all(dir).expect("create the certificate directory");
        let ca = Self { dir: dir.to_path_buf(), name: name.into(), cert, key };
        std::fs::write(ca.ca_file(), ca.cert.pem()).expect("write the CA certificate");
        ca
    }

    /// The PEM file of the CA's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A server certificate for `127.0.0.1` and `localhost`.
    pub fn server(&self, name: &str) -> Issued {
        self.issue(name, vec!["127.0.0.1".into(), "localhost".into()], ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate (for mutual TLS).
    pub fn client(&self, name: &str) -> Issued {
        self.issue(name, vec![format!("{name}.clients.rsc.test")], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, name: &str, names: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Issued {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("sign the leaf");
        let issued = Issued {
            cert_file: self.dir.join(format!("{}-{name}.pem", self.name)),
            key_file: self.dir.join(format!("{}-{name}.key", self.name)),
        };
        std::fs::write(&issued.cert_file, cert.pem()).expect("write the certificate");
        std::fs::write(&issued.key_file, key.serialize_pem()).expect("write the key");
        issued
    }
}
