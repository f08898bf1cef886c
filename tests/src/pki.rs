//! Test certificates: a CA that signs client certificates for the kubelet API (the node's
//! `clientCAFile`), and identities (a certificate and its key) issued by it.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// A certificate authority for tests.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, KeyPair>,
    cert_pem: String,
}

/// A client certificate and its private key, in PEM.
#[derive(Clone, Debug)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-sign the CA");
        TestCa {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A client certificate for `user` in `groups` (CN and O, as Kubernetes reads them).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Identity {
        let key = KeyPair::generate().expect("client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn issue_server(&self, names: &[&str]) -> Identity {
        let key = KeyPair::generate().expect("server key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "test-apiserver");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Signs a PEM certificate request as a Kubernetes signer does: its subject and names
    /// as asked, valid from now for `lifetime`, for server or client auth.
    pub fn sign_request(
        &self,
        request_pem: &str,
        lifetime: std::time::Duration,
        server: bool,
    ) -> Result<String, String> {
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(request_pem)
            .map_err(|e| format!("the certificate request: {e}"))?;
        let now = time::OffsetDateTime::now_utc();
        // A second of slack for clocks read a moment apart.
        csr.params.not_before = now - time::Duration::seconds(1);
        csr.params.not_after = now + time::Duration::seconds(lifetime.as_secs() as i64);
        csr.params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial()));
        csr.params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        csr.params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        csr.signed_by(&self.issuer)
            .map(|c| c.pem())
            .map_err(|e| format!("signing: {e}"))
    }
}

/// A random positive 16-byte serial.
fn serial() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("random serial");
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    bytes
}
