//! The test API server's JSON Web Tokens: ES256 (ECDSA P-256, SHA-256) in the compact
//! form `header.payload.signature`, each part base64url without padding, as
//! kube-apiserver signs service-account tokens with an EC key. The header's `kid` is
//! upstream's: base64url of the SHA-256 of the PKIX (DER) public key
//! (pkg/serviceaccount/jwt.go, `keyIDFromPublicKey`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};

/// The DER prefix of a PKIX SubjectPublicKeyInfo for an uncompressed P-256 point:
/// SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING (65 bytes) }.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A signing key, made at random for one test API server.
pub struct Signer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    kid: String,
}

impl Default for Signer {
    fn default() -> Self {
        Self::new()
    }
}

impl Signer {
    pub fn new() -> Signer {
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("generate a P-256 key");
        let key = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("load the key");
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(key.public_key().as_ref());
        let kid = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &spki));
        Signer { key, rng, kid }
    }

    /// The key id tokens carry in their header.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// A signed token carrying `claims`.
    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .expect("ECDSA signing does not fail");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    /// The claims of `token` if this key signed it.
    pub fn verify(&self, token: &str) -> Result<Value, String> {
        let (header, claims, sig) = split(token)?;
        if header["alg"] != "ES256" {
            return Err(format!("unexpected signing algorithm {}", header["alg"]));
        }
        let (input, _) = token.rsplit_once('.').unwrap_or_default();
        signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            self.key.public_key().as_ref(),
        )
        .verify(input.as_bytes(), &sig)
        .map_err(|_| "the token's signature is invalid".to_string())?;
        Ok(claims)
    }
}

/// The header, claims and signature of a compact JWT, unverified.
pub fn split(token: &str) -> Result<(Value, Value, Vec<u8>), String> {
    let parts: Vec<&str> = token.split('.').collect();
    let [header, claims, sig] = parts.as_slice() else {
        return Err("not a compact JWT (header.payload.signature)".to_string());
    };
    let json = |part: &str| -> Result<Value, String> {
        let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    };
    let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|e| e.to_string())?;
    Ok((json(header)?, json(claims)?, sig))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_with_its_key_only() {
        let signer = Signer::new();
        let token = signer.sign(&json!({"sub": "x", "aud": ["a"]}));
        assert_eq!(token.split('.').count(), 3);
        assert!(!token.contains('='), "base64url without padding: {token}");
        assert_eq!(signer.verify(&token).unwrap()["sub"], "x");
        let (header, _, sig) = split(&token).unwrap();
        assert_eq!(header, json!({"alg": "ES256", "kid": signer.kid()}));
        assert_eq!(sig.len(), 64, "ES256 signatures are r || s");
        assert_eq!(signer.kid().len(), 43, "base64url of a SHA-256");

        assert!(Signer::new().verify(&token).is_err(), "another key");
        let (head, _) = token.split_once('.').unwrap();
        let (_, sig) = token.rsplit_once('.').unwrap();
        let forged = format!("{head}.{}.{sig}", URL_SAFE_NO_PAD.encode(r#"{"sub":"y"}"#));
        assert!(signer.verify(&forged).is_err(), "changed claims");
        assert!(signer.verify("a.b").is_err());
    }
}
