//! Webhook signing secrets: read from a file or an environment variable
//! (never from the config file or Redis), kept out of every log line, and
//! the Standard Webhooks signature they make.

use std::fmt;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::WebhookOptions;

/// A signing secret. Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret as written: `whsec_<base64>` (the Standard Webhooks form)
    /// is the decoded bytes; any other text is its own bytes. One trailing
    /// newline (a file's) is dropped.
    pub fn parse(text: &str) -> Result<Secret, String> {
        let text = text.strip_suffix('\n').unwrap_or(text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        let bytes = match text.strip_prefix("whsec_") {
            Some(encoded) => STANDARD
                .decode(encoded)
                .map_err(|_| "a whsec_ secret must be base64 after the prefix".to_owned())?,
            None => text.as_bytes().to_vec(),
        };
        match bytes.is_empty() {
            true => Err("is empty".to_owned()),
            false => Ok(Secret(bytes)),
        }
    }

    /// The secret in `file` or in the environment variable `env` (the
    /// config allows one of them), or None with neither. The error names
    /// the field and why, never the secret.
    fn load(
        file: Option<&Path>,
        env: Option<&str>,
        fields: (&'static str, &'static str),
    ) -> Result<Option<Secret>, (&'static str, String)> {
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| (fields.0, format!("{}: cannot be read: {e}", path.display())))?;
            return Secret::parse(&text)
                .map(Some)
                .map_err(|e| (fields.0, format!("{}: {e}", path.display())));
        }
        if let Some(name) = env {
            let text = std::env::var(name)
                .map_err(|_| (fields.1, format!("${name} is not set (or not UTF-8)")))?;
            return Secret::parse(&text)
                .map(Some)
                .map_err(|e| (fields.1, format!("${name}: {e}")));
        }
        Ok(None)
    }
}

/// Signs with the current secret and, during a rotation, the previous one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signer {
    secrets: Vec<Secret>,
}

impl Signer {
    /// A signer of these secrets (at least one).
    pub fn new(secrets: Vec<Secret>) -> Signer {
        Signer { secrets }
    }

    /// The signer of a webhook's options: its secret, then its previous one.
    pub fn of(options: &WebhookOptions) -> Result<Signer, (&'static str, String)> {
        let current = Secret::load(
            options.secret_file.as_deref(),
            options.secret_env.as_deref(),
            ("secret_file", "secret_env"),
        )?
        .ok_or(("secret_file", "no secret is configured".to_owned()))?;
        let previous = Secret::load(
            options.previous_secret_file.as_deref(),
            options.previous_secret_env.as_deref(),
            ("previous_secret_file", "previous_secret_env"),
        )?;
        Ok(Signer::new([current].into_iter().chain(previous).collect()))
    }

    /// The `webhook-signature` value: `v1,<base64 HMAC-SHA256 of
    /// "{id}.{timestamp}.{body}">` for each secret, separated by spaces.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let signatures: Vec<String> = self
            .secrets
            .iter()
            .map(|secret| {
                let mut mac = Hmac::<Sha256>::new_from_slice(&secret.0)
                    .expect("HMAC takes a key of any length");
                mac.update(id.as_bytes());
                mac.update(b".");
                mac.update(timestamp.to_string().as_bytes());
                mac.update(b".");
                mac.update(body);
                format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
            })
            .collect();
        signatures.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks reference vector: secret, id, timestamp and
    /// body from the specification's example give its signature.
    #[test]
    fn signs_the_reference_example() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signer = Signer::new(vec![secret]);
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signer.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    /// Two secrets give two signatures; a secret never shows in Debug.
    #[test]
    fn rotation_and_debug() {
        let a = Secret::parse("first\n").unwrap();
        let b = Secret::parse("second").unwrap();
        let both = Signer::new(vec![a.clone(), b]).sign("id", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], Signer::new(vec![a]).sign("id", 1, b"{}"));
        assert!(!format!("{both:?} {:?}", Secret::parse("hunter2").unwrap()).contains("hunter2"));
        assert!(Secret::parse("whsec_!!").is_err());
        assert!(Secret::parse("\n").is_err());
    }
}
