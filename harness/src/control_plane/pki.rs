//! Certificates for the test control plane, generated with rcgen (ECDSA P-256).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Paths of the files that kube-apiserver and the admin kubeconfig use.
pub(crate) struct PkiFiles {
    pub serving_ca: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub client_ca: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_pub: PathBuf,
    pub sa_key: PathBuf,
}

/// The generated PKI; keeps the client CA so that more users can be issued.
pub(crate) struct Pki {
    pub files: PkiFiles,
    client_ca: Issuer<'static, KeyPair>,
}

fn ca(common_name: &str) -> Result<(CertificateParams, KeyPair, String)> {
    let key = KeyPair::generate().context("generating a CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).context("self-signing a CA")?;
    Ok((params, key, cert.pem()))
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

impl Pki {
    /// Generates every certificate and key into `dir`.
    pub(crate) fn generate(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let files = PkiFiles {
            serving_ca: dir.join("serving-ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            client_ca: dir.join("client-ca.crt"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_pub: dir.join("sa.pub"),
            sa_key: dir.join("sa.key"),
        };

        // Serving CA and the apiserver's serving certificate.
        let (serving_params, serving_key, serving_pem) = ca("kube-runtime-lease-harness-serving-ca")?;
        write(&files.serving_ca, &serving_pem)?;
        let serving_issuer = Issuer::new(serving_params, serving_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .subject_alt_names
            .push(SanType::IpAddress("::1".parse().expect("valid IPv6 literal")));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &serving_issuer)?;
        write(&files.serving_cert, &cert.pem())?;
        write(&files.serving_key, &key.serialize_pem())?;

        // Client CA; the admin is in system:masters.
        let (client_params, client_key, client_pem) = ca("kube-runtime-lease-harness-client-ca")?;
        write(&files.client_ca, &client_pem)?;
        let client_ca = Issuer::new(client_params, client_key);
        let (cert, key) = issue_client(&client_ca, "admin", &["system:masters"])?;
        write(&files.admin_cert, &cert)?;
        write(&files.admin_key, &key)?;

        // Service-account token signing key pair.
        let sa = KeyPair::generate()?;
        write(&files.sa_key, &sa.serialize_pem())?;
        write(&files.sa_pub, &sa.public_key_pem())?;

        Ok(Self { files, client_ca })
    }

    /// Issues a client certificate (CN = `user`, O = each group); returns (cert PEM, key PEM).
    pub(crate) fn issue_client(&self, user: &str, groups: &[&str]) -> Result<(String, String)> {
        issue_client(&self.client_ca, user, groups)
    }
}

fn issue_client(issuer: &Issuer<'static, KeyPair>, user: &str, groups: &[&str]) -> Result<(String, String)> {
    // rcgen keeps one value per attribute type; the second group goes in under the
    // same OID (2.5.4.10, organizationName) spelt as a custom type, which Go's
    // x509 parser reads as a second Organization.
    anyhow::ensure!(
        groups.len() <= 2,
        "a test client certificate carries at most 2 groups, got {}: {groups:?}",
        groups.len()
    );
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    if let Some(first) = groups.first() {
        params.distinguished_name.push(DnType::OrganizationName, *first);
    }
    if let Some(second) = groups.get(1) {
        params
            .distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 10]), *second);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params
        .signed_by(&key, issuer)
        .with_context(|| format!("issuing a client certificate for {user}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}
