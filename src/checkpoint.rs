//! Signed checkpoints of the receipt chains. Whoever can write to the database can rewrite a
//! tenant's newest receipts and recompute every hash and the head; `receipts verify` alone
//! cannot tell. A checkpoint is the chain head (sequence and hash) of one tenant signed with
//! the gate's Ed25519 key, as a C2SP signed note (<https://c2sp.org/signed-note>) whose body is
//! a C2SP checkpoint (<https://c2sp.org/tlog-checkpoint>):
//!
//! ```text
//! substrate-gate/2b1f…-tenant-uuid      origin: the key's name and the tenant
//! 1042                                  the chain's length (its head's sequence)
//! q83v…=                                the head's hash, base64 of its 32 bytes
//!
//! — substrate-gate Az3k…=               key name, base64 of key id and signature
//! ```
//!
//! Kept anywhere the database's writer cannot reach (a log, another system, an auditor's
//! files), a checkpoint makes a rewrite visible: `receipts verify --checkpoint FILE` fails
//! unless the chain still holds the checkpoint's hash at its sequence and verifies from the
//! genesis through it to the head. The key is read from its own file; its public half, as a
//! C2SP verifier key (`name+keyid+base64`), is all a verifier needs.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Ed25519's signature type in C2SP signed notes.
const ED25519_TYPE: u8 = 0x01;

/// A checkpoint's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub tenant: Uuid,
    /// The head's sequence: how many receipts the chain had.
    pub seq: i64,
    /// The head's hash (hex, as receipts store it).
    pub hash: String,
}

/// The public half of a checkpoint key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verifier {
    pub name: String,
    key_id: [u8; 4],
    public: [u8; 32],
}

/// The gate's checkpoint signing key.
pub struct Signer {
    pair: Ed25519KeyPair,
    verifier: Verifier,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("verifier", &self.verifier.encode())
            .finish()
    }
}

fn key_id(name: &str, public: &[u8; 32]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ED25519_TYPE]);
    h.update(public);
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// A key name as signed notes allow it: non-empty, no white space, no `+`.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c == '+')
}

impl Signer {
    /// The key from a 32-byte Ed25519 seed, named `name`.
    pub fn from_seed(name: &str, seed: &[u8; 32]) -> Result<Signer, String> {
        if !valid_name(name) {
            return Err(format!(
                "checkpoint key name {name:?} must be non-empty without spaces or '+'"
            ));
        }
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)
            .map_err(|_| "not an Ed25519 seed".to_string())?;
        let public: [u8; 32] = pair
            .public_key()
            .as_ref()
            .try_into()
            .map_err(|_| "Ed25519 public key is not 32 bytes".to_string())?;
        Ok(Signer {
            verifier: Verifier {
                name: name.to_string(),
                key_id: key_id(name, &public),
                public,
            },
            pair,
        })
    }

    /// The key from a file holding its 32-byte seed in base64 (e.g. `head -c 32 /dev/urandom |
    /// base64`).
    pub fn from_key_file(name: &str, path: &std::path::Path) -> Result<Signer, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let seed: [u8; 32] = B64
            .decode(text.trim())
            .map_err(|_| format!("{} does not hold base64", path.display()))?
            .try_into()
            .map_err(|b: Vec<u8>| {
                format!(
                    "{} holds {} bytes; the seed is 32 bytes",
                    path.display(),
                    b.len()
                )
            })?;
        Signer::from_seed(name, &seed)
    }

    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// The signed note of `c`.
    pub fn sign(&self, c: &Checkpoint) -> String {
        let body = body_of(&self.verifier.name, c);
        let sig = self.pair.sign(body.as_bytes());
        let mut blob = self.verifier.key_id.to_vec();
        blob.extend_from_slice(sig.as_ref());
        format!(
            "{body}\n\u{2014} {} {}\n",
            self.verifier.name,
            B64.encode(blob)
        )
    }
}

/// The checkpoint body (the signed text): origin, size, hash, each on its line.
fn body_of(name: &str, c: &Checkpoint) -> String {
    let raw = hex::decode(&c.hash).unwrap_or_default();
    format!("{name}/{}\n{}\n{}\n", c.tenant, c.seq, B64.encode(raw))
}

impl Verifier {
    /// The C2SP verifier key: `name+keyid(hex)+base64(type || public key)`.
    pub fn encode(&self) -> String {
        let mut k = vec![ED25519_TYPE];
        k.extend_from_slice(&self.public);
        format!(
            "{}+{}+{}",
            self.name,
            hex::encode(self.key_id),
            B64.encode(k)
        )
    }

    pub fn parse(vkey: &str) -> Result<Verifier, String> {
        let mut parts = vkey.trim().splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("a verifier key is name+keyid+key".into());
        };
        let key = B64
            .decode(key)
            .map_err(|_| "the verifier key is not base64")?;
        let public: [u8; 32] = match key.split_first() {
            Some((&ED25519_TYPE, rest)) => rest
                .try_into()
                .map_err(|_| "an Ed25519 verifier key has 32 bytes")?,
            _ => return Err("only Ed25519 verifier keys are supported".into()),
        };
        if !valid_name(name) {
            return Err("bad key name in the verifier key".into());
        }
        let v = Verifier {
            name: name.to_string(),
            key_id: key_id(name, &public),
            public,
        };
        if hex::encode(v.key_id) != id {
            return Err("the verifier key's id does not match its name and key".into());
        }
        Ok(v)
    }

    /// The checkpoint a note carries, if this key signed it and its body is a checkpoint of
    /// this key's name.
    pub fn open(&self, note: &str) -> Result<Checkpoint, String> {
        let (body, sigs) = note
            .split_once("\n\n")
            .ok_or("not a signed note (no blank line before the signatures)")?;
        let body = format!("{body}\n");
        let mut signed = false;
        for line in sigs.lines() {
            let Some(rest) = line.strip_prefix("\u{2014} ") else {
                return Err(format!("not a signature line: {line:?}"));
            };
            let Some((name, b64)) = rest.split_once(' ') else {
                return Err(format!("not a signature line: {line:?}"));
            };
            let Ok(blob) = B64.decode(b64) else {
                return Err("a signature is not base64".into());
            };
            if name != self.name || blob.len() != 4 + 64 || blob[..4] != self.key_id {
                continue;
            }
            UnparsedPublicKey::new(&ED25519, &self.public)
                .verify(body.as_bytes(), &blob[4..])
                .map_err(|_| "the checkpoint's signature does not verify with this key")?;
            signed = true;
        }
        if !signed {
            return Err(format!("the checkpoint is not signed by {}", self.name));
        }
        let mut lines = body.lines();
        let origin = lines.next().unwrap_or_default();
        let tenant = origin
            .strip_prefix(&format!("{}/", self.name))
            .and_then(|t| Uuid::parse_str(t).ok())
            .ok_or_else(|| format!("origin {origin:?} is not {}/TENANT", self.name))?;
        let seq: i64 = lines
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|s: &i64| *s >= 0)
            .ok_or("the checkpoint's size is not a number")?;
        let raw = lines
            .next()
            .and_then(|h| B64.decode(h).ok())
            .filter(|h| h.len() == 32)
            .ok_or("the checkpoint's hash is not 32 bytes of base64")?;
        Ok(Checkpoint {
            tenant,
            seq,
            hash: hex::encode(raw),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            tenant: Uuid::from_u128(7),
            seq: 42,
            hash: "ab".repeat(32),
        }
    }

    #[test]
    fn a_signed_checkpoint_opens_with_its_verifier_key_only() {
        let s = Signer::from_seed("gate.example", &[5; 32]).unwrap();
        let note = s.sign(&checkpoint());
        assert!(note.starts_with(&format!("gate.example/{}\n42\n", Uuid::from_u128(7))));
        assert!(note.contains("\n\n\u{2014} gate.example "));
        let v = Verifier::parse(&s.verifier().encode()).unwrap();
        assert_eq!(v, *s.verifier());
        assert_eq!(v.open(&note).unwrap(), checkpoint());
        // Another key, an edited body, a missing signature.
        let other = Signer::from_seed("gate.example", &[6; 32]).unwrap();
        assert!(other.verifier().open(&note).is_err());
        let edited = note.replacen("\n42\n", "\n43\n", 1);
        assert!(v.open(&edited).is_err());
        let (body, _) = note.split_once("\n\n").unwrap();
        assert!(v.open(&format!("{body}\n\n")).is_err());
    }

    #[test]
    fn the_key_id_follows_the_signed_note_rule() {
        // key id = first four bytes of SHA-256(name || "\n" || 0x01 || public key)
        let s = Signer::from_seed("n", &[1; 32]).unwrap();
        let vkey = s.verifier().encode();
        let parts: Vec<&str> = vkey.split('+').collect();
        let key = B64.decode(parts[2]).unwrap();
        let mut h = Sha256::new();
        h.update(b"n\n");
        h.update(&key);
        assert_eq!(parts[1], hex::encode(&h.finalize()[..4]));
        assert!(Verifier::parse("n+00000000+AQ==").is_err());
        assert!(Verifier::parse(&vkey.replace("+", "-")).is_err());
        assert!(Signer::from_seed("has space", &[1; 32]).is_err());
    }
}
