//! Store credentials at rest. A held write keeps the request headers its release will send,
//! and a journaled write keeps the credentials a start-up read-back presents again; both are
//! the store's credentials. With `storage.credentials_key_file` set, they are sealed with
//! ChaCha20-Poly1305 (ring) under that key before they reach the database, bound to the row
//! they belong to (a sealed value copied into another row does not open), and opened only
//! when the gate sends them. The key is read from its own file (a Kubernetes Secret), never
//! stored beside the data. Without a key they are kept as sent, and the gate says so at start.
//!
//! A sealed value is `sealed:v1:` and the base64 of a random 96-bit nonce followed by the
//! ciphertext and its tag. A value without the prefix was written without a key and is read
//! as it is.

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

const PREFIX: &str = "sealed:v1:";

/// The request headers that carry a store's credentials (lowercase): these are what is sealed.
pub const CREDENTIAL_HEADERS: &[&str] =
    &["authorization", "x-api-key", "api-key", "x-chroma-token"];

/// Whether a header (any case) carries credentials.
pub fn is_credential(name: &str) -> bool {
    CREDENTIAL_HEADERS
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
}

/// Why a stored value could not be opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("stored credentials are sealed and no storage.credentials_key_file is set")]
    NoKey,
    #[error("stored credentials do not open with this key (another key, another row, or edited)")]
    Open,
}

/// Seals and opens the credentials kept in the database.
pub struct Sealer {
    key: Option<LessSafeKey>,
    rng: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("sealing", &self.key.is_some())
            .finish()
    }
}

impl Sealer {
    /// A sealer that keeps values as they are.
    pub fn plain() -> Sealer {
        Sealer {
            key: None,
            rng: SystemRandom::new(),
        }
    }

    /// A sealer with a 32-byte key.
    pub fn with_key(key: &[u8; 32]) -> Sealer {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, key)
            .unwrap_or_else(|_| unreachable!("a 32-byte ChaCha20-Poly1305 key"));
        Sealer {
            key: Some(LessSafeKey::new(unbound)),
            rng: SystemRandom::new(),
        }
    }

    /// The sealer a key file gives: the file holds the key as 32 bytes in standard base64
    /// (white space around it ignored), e.g. `head -c 32 /dev/urandom | base64`.
    pub fn from_key_file(path: &std::path::Path) -> Result<Sealer, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| format!("{} does not hold base64", path.display()))?;
        let key: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
            format!(
                "{} holds {} bytes; the key is 32 bytes",
                path.display(),
                b.len()
            )
        })?;
        Ok(Sealer::with_key(&key))
    }

    /// Whether values are sealed.
    pub fn seals(&self) -> bool {
        self.key.is_some()
    }

    /// `plain` sealed for the row `row` (as it is without a key).
    pub fn seal(&self, plain: &str, row: &str) -> String {
        let Some(key) = &self.key else {
            return plain.to_string();
        };
        let mut nonce = [0u8; NONCE_LEN];
        // The system's random source; it does not fail on Linux once the process runs.
        if self.rng.fill(&mut nonce).is_err() {
            unreachable!("the system random source failed");
        }
        let mut out = plain.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(row.as_bytes()),
            &mut out,
        )
        .unwrap_or_else(|_| unreachable!("sealing a value under 4 GiB"));
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&out);
        format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(sealed)
        )
    }

    /// `headers` with each credential's value sealed for the row `row` (and its header name);
    /// other headers stay readable for review.
    pub fn seal_credentials(
        &self,
        headers: &[(String, String)],
        row: &str,
    ) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(n, v)| {
                if is_credential(n) {
                    (
                        n.clone(),
                        self.seal(v, &format!("{row}/{}", n.to_ascii_lowercase())),
                    )
                } else {
                    (n.clone(), v.clone())
                }
            })
            .collect()
    }

    /// `headers` as [`Sealer::seal_credentials`] kept them, with every value open.
    pub fn open_credentials(
        &self,
        headers: Vec<(String, String)>,
        row: &str,
    ) -> Result<Vec<(String, String)>, SealError> {
        headers
            .into_iter()
            .map(|(n, v)| {
                let open = if is_credential(&n) {
                    self.open(&v, &format!("{row}/{}", n.to_ascii_lowercase()))?
                } else {
                    v
                };
                Ok((n, open))
            })
            .collect()
    }

    /// The plain value of `stored` for the row `row`.
    pub fn open(&self, stored: &str, row: &str) -> Result<String, SealError> {
        let Some(b64) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_string());
        };
        let key = self.key.as_ref().ok_or(SealError::NoKey)?;
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| SealError::Open)?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Open);
        }
        let mut body = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| SealError::Open)?;
        let plain = key
            .open_in_place(nonce, Aad::from(row.as_bytes()), &mut body)
            .map_err(|_| SealError::Open)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SealError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_for_its_row_only() {
        let s = Sealer::with_key(&[7; 32]);
        let sealed = s.seal(r#"[["authorization","Bearer sk-1"]]"#, "row-1");
        assert!(sealed.starts_with(PREFIX));
        assert!(!sealed.contains("sk-1"));
        assert_ne!(
            sealed,
            s.seal(r#"[["authorization","Bearer sk-1"]]"#, "row-1")
        );
        assert_eq!(
            s.open(&sealed, "row-1").unwrap(),
            r#"[["authorization","Bearer sk-1"]]"#
        );
        assert_eq!(s.open(&sealed, "row-2"), Err(SealError::Open));
        assert_eq!(
            Sealer::with_key(&[8; 32]).open(&sealed, "row-1"),
            Err(SealError::Open)
        );
        assert_eq!(
            Sealer::plain().open(&sealed, "row-1"),
            Err(SealError::NoKey)
        );
        let mut edited = sealed.clone();
        edited.pop();
        edited.push('A');
        assert!(s.open(&edited, "row-1").is_err());
        assert_eq!(s.open("sealed:v1:AAAA", "row-1"), Err(SealError::Open));
    }

    #[test]
    fn only_credential_headers_are_sealed() {
        let s = Sealer::with_key(&[9; 32]);
        let h = vec![
            ("Authorization".to_string(), "Bearer sk-2".to_string()),
            ("content-type".to_string(), "application/json".to_string()),
            ("x-chroma-token".to_string(), "tok".to_string()),
        ];
        let sealed = s.seal_credentials(&h, "q1");
        assert_eq!(sealed[1], h[1]);
        assert!(sealed[0].1.starts_with(PREFIX) && sealed[2].1.starts_with(PREFIX));
        assert_eq!(s.open_credentials(sealed.clone(), "q1").unwrap(), h);
        assert!(s.open_credentials(sealed, "q2").is_err());
        assert_eq!(Sealer::plain().seal_credentials(&h, "q1"), h);
    }

    #[test]
    fn without_a_key_values_are_kept_and_read_as_they_are() {
        let p = Sealer::plain();
        assert_eq!(p.seal("x", "r"), "x");
        assert_eq!(p.open("x", "r").unwrap(), "x");
        assert_eq!(Sealer::with_key(&[1; 32]).open("[]", "r").unwrap(), "[]");
    }

    #[test]
    fn key_files_must_hold_32_bytes_of_base64() {
        let dir = std::env::temp_dir().join(format!("seal-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(
            &good,
            format!(
                "{}\n",
                base64::engine::general_purpose::STANDARD.encode([3u8; 32])
            ),
        )
        .unwrap();
        assert!(Sealer::from_key_file(&good).unwrap().seals());
        let short = dir.join("short");
        std::fs::write(
            &short,
            base64::engine::general_purpose::STANDARD.encode([3u8; 16]),
        )
        .unwrap();
        assert!(Sealer::from_key_file(&short)
            .unwrap_err()
            .contains("16 bytes"));
        let junk = dir.join("junk");
        std::fs::write(&junk, "not base64 !").unwrap();
        assert!(Sealer::from_key_file(&junk).is_err());
        assert!(Sealer::from_key_file(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
