//! Standard Webhooks signing: `webhook-signature: v1,<base64 HMAC-SHA256 of
//! "{id}.{timestamp}.{body}">`, one `v1,` entry per secret that currently
//! signs (the new one and, during a rotation's grace period, the old one),
//! separated by spaces. Secrets are never logged: [`Secret`] redacts itself.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// Prefix of generated secrets (and of caller secrets meant as base64 keys).
pub const SECRET_PREFIX: &str = "whsec_";
/// Random bytes in a generated secret.
pub const GENERATED_SECRET_BYTES: usize = 32;

/// A subscription secret as stored and returned to its owner. `Debug` and
/// `Display` print `whsec_***`, so a secret that ends up in a log line or an
/// error message says nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// `whsec_` + base64 of 32 random bytes from the OS.
    pub fn generate() -> Self {
        let mut bytes = [0u8; GENERATED_SECRET_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        Secret(format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes)))
    }
    /// The secret text, for storage and for its owner's API answers only.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The HMAC key: for `whsec_` secrets the base64-decoded part after the
    /// prefix (as Standard Webhooks libraries read it); for any other secret
    /// its UTF-8 bytes.
    pub fn key(&self) -> Result<Vec<u8>, SecretError> {
        key_bytes(&self.0)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(whsec_***)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("whsec_***")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("must not be empty")]
    Empty,
    #[error("a secret starting with whsec_ must continue with standard base64 (the key bytes)")]
    NotBase64,
}

/// See [`Secret::key`].
pub fn key_bytes(secret: &str) -> Result<Vec<u8>, SecretError> {
    match secret.strip_prefix(SECRET_PREFIX) {
        Some(rest) => {
            let key = STANDARD.decode(rest).map_err(|_| SecretError::NotBase64)?;
            if key.is_empty() {
                return Err(SecretError::Empty);
            }
            Ok(key)
        }
        None if secret.is_empty() => Err(SecretError::Empty),
        None => Ok(secret.as_bytes().to_vec()),
    }
}

/// Base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}").
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    STANDARD.encode(mac.finalize().into_bytes())
}

/// The `webhook-signature` header value: `v1,<sig>` per key, space-separated,
/// in the order given (current secret first).
pub fn signature_header(keys: &[Vec<u8>], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|k| format!("v1,{}", sign(k, id, timestamp, body)))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference test suite.
    #[test]
    fn standard_webhooks_reference_vector() {
        let key = key_bytes("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = sign(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn generated_secrets_are_whsec_base64_of_32_bytes() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_ne!(a, b);
        assert!(a.expose().starts_with("whsec_"));
        assert_eq!(a.key().unwrap().len(), 32);
    }

    #[test]
    fn plain_secrets_are_their_utf8_bytes() {
        assert_eq!(
            key_bytes("a-shared-secret-1").unwrap(),
            b"a-shared-secret-1"
        );
        assert_eq!(key_bytes(""), Err(SecretError::Empty));
        assert_eq!(key_bytes("whsec_"), Err(SecretError::Empty));
        assert_eq!(key_bytes("whsec_not base64!"), Err(SecretError::NotBase64));
    }

    #[test]
    fn several_secrets_sign_side_by_side() {
        let h = signature_header(&[b"new".to_vec(), b"old".to_vec()], "id", 1, b"{}");
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], format!("v1,{}", sign(b"new", "id", 1, b"{}")));
        assert_eq!(parts[1], format!("v1,{}", sign(b"old", "id", 1, b"{}")));
    }

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("whsec_c2VjcmV0LXZhbHVlLXRoYXQtbXVzdC1ub3QtbGVhaw==");
        assert!(!format!("{s:?} {s}").contains("c2Vj"));
    }
}
