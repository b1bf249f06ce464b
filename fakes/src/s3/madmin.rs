//! madmin's encrypted admin bodies (what minio-py's MinioAdmin and `mc admin`
//! send and expect on `/minio/admin`): salt(32) ‖ AEAD id(1) ‖ nonce(8) ‖ sio
//! DARE-v2 packages, keyed by Argon2id (or PBKDF2 in FIPS mode) of the secret.

use aes_gcm::aead::{Aead as _, KeyInit, Payload};
use aes_gcm::Aes256Gcm;
use chacha20poly1305::ChaCha20Poly1305;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Why an encrypted body could not be opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MadminError {
    /// Shorter than the 41-byte header.
    #[error("unexpected header: the body is shorter than salt, AEAD id and nonce")]
    UnexpectedHeader,
    /// The AEAD id byte names no known scheme.
    #[error("madmin: invalid encryption algorithm ID {0:#04x}")]
    UnknownAlgorithm(u8),
    /// A package failed authentication: wrong secret, tampering or truncation.
    #[error(
        "sio: data is not authentic (wrong secret key, or the body was tampered with or truncated)"
    )]
    NotAuthentic,
    /// Key derivation failed (cannot happen with the fixed parameters).
    #[error("key derivation failed: {0}")]
    Kdf(String),
}

const SALT_LEN: usize = 32;
const NONCE_LEN: usize = 8;
const HEADER_LEN: usize = SALT_LEN + 1 + NONCE_LEN;
const TAG_LEN: usize = 16;
/// sio's package payload size.
const BUF_SIZE: usize = 16 * 1024;

/// The AEAD id byte: key derivation and cipher.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// 0x00: Argon2id key, AES-256-GCM.
    Argon2idAesGcm = 0,
    /// 0x01: Argon2id key, ChaCha20-Poly1305.
    Argon2idChaCha20Poly1305 = 1,
    /// 0x02: PBKDF2-SHA256 key (8192 rounds), AES-256-GCM (madmin in FIPS mode).
    Pbkdf2AesGcm = 2,
}

fn derive_key(aead: Scheme, secret: &[u8], salt: &[u8]) -> Result<[u8; 32], MadminError> {
    let mut key = [0u8; 32];
    match aead {
        Scheme::Argon2idAesGcm | Scheme::Argon2idChaCha20Poly1305 => {
            // madmin: time 1, memory 64 MiB, 4 lanes, 32-byte key, Argon2 v1.3.
            let params = argon2::Params::new(64 * 1024, 1, 4, Some(32))
                .map_err(|e| MadminError::Kdf(e.to_string()))?;
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
                .hash_password_into(secret, salt, &mut key)
                .map_err(|e| MadminError::Kdf(e.to_string()))?;
        }
        Scheme::Pbkdf2AesGcm => {
            // One PBKDF2 block is exactly the 32-byte key.
            let prf = |data: &[u8]| -> Result<[u8; 32], MadminError> {
                let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret)
                    .map_err(|e| MadminError::Kdf(e.to_string()))?;
                m.update(data);
                Ok(m.finalize().into_bytes().into())
            };
            let mut first = salt.to_vec();
            first.extend_from_slice(&1u32.to_be_bytes());
            let mut u = prf(&first)?;
            key = u;
            for _ in 1..8192 {
                u = prf(&u)?;
                key.iter_mut().zip(u.iter()).for_each(|(k, x)| *k ^= x);
            }
        }
    }
    Ok(key)
}

enum Cipher {
    Gcm(Box<Aes256Gcm>),
    ChaCha(Box<ChaCha20Poly1305>),
}

impl Cipher {
    fn new(aead: Scheme, key: &[u8; 32]) -> Self {
        match aead {
            Scheme::Argon2idChaCha20Poly1305 => {
                Cipher::ChaCha(Box::new(ChaCha20Poly1305::new(key.into())))
            }
            _ => Cipher::Gcm(Box::new(Aes256Gcm::new(key.into()))),
        }
    }
    fn seal(&self, nonce: &[u8; 12], aad: &[u8], msg: &[u8]) -> Result<Vec<u8>, MadminError> {
        let p = Payload { msg, aad };
        match self {
            Cipher::Gcm(c) => c.encrypt(nonce.into(), p),
            Cipher::ChaCha(c) => c.encrypt(nonce.into(), p),
        }
        .map_err(|_| MadminError::NotAuthentic)
    }
    fn open(&self, nonce: &[u8; 12], aad: &[u8], ct: &[u8]) -> Result<Vec<u8>, MadminError> {
        let p = Payload { msg: ct, aad };
        match self {
            Cipher::Gcm(c) => c.decrypt(nonce.into(), p),
            Cipher::ChaCha(c) => c.decrypt(nonce.into(), p),
        }
        .map_err(|_| MadminError::NotAuthentic)
    }
}

fn package_nonce(nonce: &[u8; NONCE_LEN], seq: u32) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..NONCE_LEN].copy_from_slice(nonce);
    n[NONCE_LEN..].copy_from_slice(&seq.to_le_bytes());
    n
}

/// sio binds every package to the stream: the associated data is a flag byte
/// (0x80 on the final package) followed by the tag of an empty seal under
/// sequence number 0.
fn stream_aad(cipher: &Cipher, nonce: &[u8; NONCE_LEN]) -> Result<Vec<u8>, MadminError> {
    let tag = cipher.seal(&package_nonce(nonce, 0), &[], &[])?;
    let mut aad = Vec::with_capacity(1 + TAG_LEN);
    aad.push(0x00);
    aad.extend_from_slice(&tag);
    Ok(aad)
}

/// Encrypt with explicit salt and nonce (deterministic; used by tests).
pub fn encrypt_with(
    secret: &str,
    plaintext: &[u8],
    aead: Scheme,
    salt: [u8; SALT_LEN],
    nonce: [u8; NONCE_LEN],
) -> Result<Vec<u8>, MadminError> {
    let key = derive_key(aead, secret.as_bytes(), &salt)?;
    encrypt_with_key(&key, plaintext, aead, salt, nonce)
}

/// [`encrypt_with`] under an already-derived key (fuzzing and tests: the
/// framing without the ~100 ms Argon2id). The salt is written but not used.
pub fn encrypt_with_key(
    key: &[u8; 32],
    plaintext: &[u8],
    aead: Scheme,
    salt: [u8; SALT_LEN],
    nonce: [u8; NONCE_LEN],
) -> Result<Vec<u8>, MadminError> {
    let cipher = Cipher::new(aead, key);
    let mut aad = stream_aad(&cipher, &nonce)?;
    let mut out = Vec::with_capacity(
        HEADER_LEN + plaintext.len() + TAG_LEN * (plaintext.len() / BUF_SIZE + 1),
    );
    out.extend_from_slice(&salt);
    out.push(aead as u8);
    out.extend_from_slice(&nonce);
    // Like sio's writer, an empty plaintext still gets one (final, empty) package.
    let chunks: Vec<&[u8]> = if plaintext.is_empty() {
        vec![&[][..]]
    } else {
        plaintext.chunks(BUF_SIZE).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.iter().enumerate() {
        if i == last {
            aad[0] = 0x80;
        }
        out.extend(cipher.seal(&package_nonce(&nonce, i as u32 + 1), &aad, chunk)?);
    }
    Ok(out)
}

/// Encrypt as madmin does on a server with AES hardware: Argon2id + AES-256-GCM,
/// random salt and nonce.
pub fn encrypt(secret: &str, plaintext: &[u8]) -> Result<Vec<u8>, MadminError> {
    use rand::RngCore;
    let mut salt = [0u8; SALT_LEN];
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut salt);
    rand::rng().fill_bytes(&mut nonce);
    encrypt_with(secret, plaintext, Scheme::Argon2idAesGcm, salt, nonce)
}

/// How many key derivations may run at once. Argon2id here takes 64 MiB
/// each: unbounded, 48 concurrent encrypted admin calls took 2.5 GB; bounded,
/// the rest wait their turn (a real server also serialises on its CPUs).
pub const KDF_CONCURRENCY: usize = 2;

static KDF_SLOTS: std::sync::LazyLock<tokio::sync::Semaphore> =
    std::sync::LazyLock::new(|| tokio::sync::Semaphore::new(KDF_CONCURRENCY));

/// Run `f` (which derives a key) on the blocking pool once a KDF slot is free.
async fn with_kdf_slot<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MadminError> + Send + 'static,
) -> Result<T, MadminError> {
    let _permit = KDF_SLOTS
        .acquire()
        .await
        .map_err(|e| MadminError::Kdf(e.to_string()))?;
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| MadminError::Kdf(e.to_string()))?
}

/// [`decrypt`] off the async workers, at most [`KDF_CONCURRENCY`] at a time.
pub async fn decrypt_bounded(secret: String, data: bytes::Bytes) -> Result<Vec<u8>, MadminError> {
    with_kdf_slot(move || decrypt(&secret, &data)).await
}

/// [`encrypt`] off the async workers, at most [`KDF_CONCURRENCY`] at a time.
pub async fn encrypt_bounded(secret: String, plain: Vec<u8>) -> Result<Vec<u8>, MadminError> {
    with_kdf_slot(move || encrypt(&secret, &plain)).await
}

fn scheme_of(data: &[u8]) -> Result<Scheme, MadminError> {
    if data.len() < HEADER_LEN {
        return Err(MadminError::UnexpectedHeader);
    }
    match data[SALT_LEN] {
        0 => Ok(Scheme::Argon2idAesGcm),
        1 => Ok(Scheme::Argon2idChaCha20Poly1305),
        2 => Ok(Scheme::Pbkdf2AesGcm),
        other => Err(MadminError::UnknownAlgorithm(other)),
    }
}

/// Decrypt a madmin body of any of the three schemes.
pub fn decrypt(secret: &str, data: &[u8]) -> Result<Vec<u8>, MadminError> {
    let aead = scheme_of(data)?;
    let key = derive_key(aead, secret.as_bytes(), &data[..SALT_LEN])?;
    decrypt_with_key(&key, data)
}

/// [`decrypt`] under an already-derived key (fuzzing and tests); the header
/// is still parsed and its AEAD id still picks the cipher.
pub fn decrypt_with_key(key: &[u8; 32], data: &[u8]) -> Result<Vec<u8>, MadminError> {
    let aead = scheme_of(data)?;
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&data[SALT_LEN + 1..HEADER_LEN]);
    let cipher = Cipher::new(aead, key);
    let mut aad = stream_aad(&cipher, &nonce)?;
    let body = &data[HEADER_LEN..];
    let mut out = Vec::with_capacity(body.len());
    // minio-py's encrypt() sends no package at all for an empty plaintext.
    if body.is_empty() {
        return Ok(out);
    }
    let packages: Vec<&[u8]> = body.chunks(BUF_SIZE + TAG_LEN).collect();
    let last = packages.len() - 1;
    for (i, pkg) in packages.iter().enumerate() {
        if pkg.len() < TAG_LEN {
            return Err(MadminError::NotAuthentic);
        }
        if i == last {
            aad[0] = 0x80;
        }
        let seq = u32::try_from(i + 1).map_err(|_| MadminError::NotAuthentic)?;
        out.extend(cipher.open(&package_nonce(&nonce, seq), &aad, pkg)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_schemes_and_sizes() {
        for aead in [
            Scheme::Argon2idAesGcm,
            Scheme::Argon2idChaCha20Poly1305,
            Scheme::Pbkdf2AesGcm,
        ] {
            for len in [0usize, 1, BUF_SIZE, BUF_SIZE + 1, 2 * BUF_SIZE + 7] {
                let msg: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                let ct = encrypt_with("minioadmin", &msg, aead, [7; 32], [9; 8]).unwrap();
                assert_eq!(
                    decrypt("minioadmin", &ct).unwrap(),
                    msg,
                    "{aead:?} len {len}"
                );
                assert_eq!(decrypt("wrong", &ct), Err(MadminError::NotAuthentic));
            }
        }
    }

    // Produced by minio-py's `minio.crypto.encrypt` (an implementation we did
    // not write) with os.urandom pinned to nonce 09.., salt 07...
    const MINIO_PY_VECTOR: &str = "0707070707070707070707070707070707070707070707070707070707070707000909090909090909c989db4f705e5b4351f144a24f24da10528361995ba90cd4a151461895e420abf1d46e02c93ce0532760c44803a2918d3c07ca016f864b59b159d09e04dd938e";
    const MINIO_PY_PLAIN: &[u8] = br#"{"status":"enabled","secretKey":"wJalrXUtnFEMI"}"#;

    #[test]
    fn known_answer_from_minio_py() {
        let ct = hex::decode(MINIO_PY_VECTOR).unwrap();
        assert_eq!(decrypt("minioadmin", &ct).unwrap(), MINIO_PY_PLAIN);
        let ours = encrypt_with(
            "minioadmin",
            MINIO_PY_PLAIN,
            Scheme::Argon2idAesGcm,
            [7; 32],
            [9; 8],
        )
        .unwrap();
        assert_eq!(hex::encode(ours), MINIO_PY_VECTOR);
    }

    #[test]
    fn tampering_truncation_and_garbage_are_errors() {
        let ct = encrypt_with(
            "s3cret",
            &[1u8; BUF_SIZE + 100],
            Scheme::Argon2idAesGcm,
            [1; 32],
            [2; 8],
        )
        .unwrap();
        let mut flipped = ct.clone();
        let n = flipped.len();
        flipped[n - 1] ^= 1;
        assert_eq!(decrypt("s3cret", &flipped), Err(MadminError::NotAuthentic));
        // Dropping the final package must not pass as a shorter message.
        assert_eq!(
            decrypt("s3cret", &ct[..HEADER_LEN + BUF_SIZE + TAG_LEN]),
            Err(MadminError::NotAuthentic)
        );
        assert_eq!(
            decrypt("s3cret", b"{\"secretKey\":\"x\"}"),
            Err(MadminError::UnexpectedHeader)
        );
        let mut bad_id = ct.clone();
        bad_id[32] = 9;
        assert_eq!(
            decrypt("s3cret", &bad_id),
            Err(MadminError::UnknownAlgorithm(9))
        );
    }
}
