//! HS256 JSON Web Tokens as libprocess makes and checks them (`3rdparty/libprocess/src/jwt.cpp`,
//! `jwt_authenticator.cpp`): base64url without padding, header `{"alg":"HS256","typ":"JWT"}`,
//! the payload exactly the principal's claims (an agent mints `{"cid_prefix": "<prefix>"}`
//! for each local resource provider), an `exp` claim honoured if present.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use ring::hmac;

use crate::config::Secret;

const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

/// Decoding accepts padding or none, as stout's `base64::decode_url_safe`.
const DECODE: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Mints an HS256 JWT whose payload is `claims_json` (not re-encoded, so the caller
/// decides its exact bytes), signed with `secret`: what a Mesos agent started with
/// `--jwt_secret_key` gives a local resource provider (`{"cid_prefix": "…"}`).
#[must_use]
pub fn mint(secret: &Secret, claims_json: &str) -> String {
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(HEADER),
        URL_SAFE_NO_PAD.encode(claims_json)
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.expose().as_bytes());
    let signature = hmac::sign(&key, signing_input.as_bytes());
    format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature.as_ref())
    )
}

/// Why a token is not a valid JWT under the secret; the texts are libprocess's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not `header.payload.signature`.
    #[error("Expected 3 components in token, got {0}")]
    Components(usize),
    /// The header is not base64url JSON of an object.
    #[error("Failed to decode token header: {0}")]
    Header(String),
    /// The header names no usable algorithm (or has a `typ` that is not a string, or a
    /// `crit`).
    #[error("{0}")]
    Algorithm(String),
    /// The payload is not base64url JSON of an object.
    #[error("Failed to decode token payload: {0}")]
    Payload(String),
    /// The `exp` claim is in the past or not a number.
    #[error("{0}")]
    Expired(String),
    /// The signature is not base64url.
    #[error("Failed to base64url-decode token signature: {0}")]
    Signature(String),
    /// The signature does not match the secret.
    #[error("Token signature does not match")]
    Mismatch,
}

fn decode_object(component: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let bytes = DECODE
        .decode(component)
        .map_err(|error| format!("Failed to base64url-decode: {error}"))?;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(object)) => Ok(object),
        Ok(_) => Err("Failed to parse into JSON: not an object".to_owned()),
        Err(error) => Err(format!("Failed to parse into JSON: {error}")),
    }
}

/// Checks `token` against `secret` and returns its claims, strings as they are and other
/// values as JSON text (libprocess's `Principal::claims`).
///
/// # Errors
/// [`JwtError`] naming what is wrong.
pub fn verify(secret: &Secret, token: &str) -> Result<BTreeMap<String, String>, JwtError> {
    let components: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = components.as_slice() else {
        return Err(JwtError::Components(components.len()));
    };
    let header_json = decode_object(header).map_err(JwtError::Header)?;
    if header_json.contains_key("typ") && !header_json["typ"].is_string() {
        return Err(JwtError::Algorithm(
            "Token 'typ' is not a string".to_owned(),
        ));
    }
    let alg = match header_json.get("alg") {
        None => {
            return Err(JwtError::Algorithm(
                "Failed to locate 'alg' in token JSON header".to_owned(),
            ));
        }
        Some(serde_json::Value::String(alg)) => alg.clone(),
        Some(_) => {
            return Err(JwtError::Algorithm(
                "Token 'alg' field is not a string".to_owned(),
            ));
        }
    };
    if !matches!(alg.as_str(), "none" | "HS256" | "RS256") {
        return Err(JwtError::Algorithm(format!(
            "Unsupported token algorithm: {alg}"
        )));
    }
    if header_json.contains_key("crit") {
        return Err(JwtError::Algorithm(
            "Token 'crit' field is unsupported".to_owned(),
        ));
    }
    if alg != "HS256" {
        return Err(JwtError::Algorithm(format!(
            "Token 'alg' value \"{alg}\" does not match, expected \"HS256\""
        )));
    }
    let claims = decode_object(payload).map_err(JwtError::Payload)?;
    if let Some(exp) = claims.get("exp") {
        let exp = exp.as_f64().ok_or_else(|| {
            JwtError::Expired("JSON payload 'exp' field is not a number".to_owned())
        })?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Whole seconds, as libprocess compares them.
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        let (exp, now) = (exp as i64, now as i64);
        if exp < now {
            return Err(JwtError::Expired(format!(
                "Token has expired: exp({exp}) < now({now})"
            )));
        }
    }
    let signature = DECODE
        .decode(signature)
        .map_err(|error| JwtError::Signature(error.to_string()))?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.expose().as_bytes());
    hmac::verify(&key, format!("{header}.{payload}").as_bytes(), &signature)
        .map_err(|_| JwtError::Mismatch)?;
    Ok(claims
        .into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => (key, text),
            other => (key, other.to_string()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_verifies_and_a_changed_one_does_not() {
        let secret = Secret::new("key");
        let token = mint(
            &secret,
            r#"{"cid_prefix":"org-apache-mesos-rp-local-storage-test--","n":1}"#,
        );
        let claims = verify(&secret, &token).expect("valid");
        assert_eq!(
            claims.get("cid_prefix").map(String::as_str),
            Some("org-apache-mesos-rp-local-storage-test--")
        );
        assert_eq!(claims.get("n").map(String::as_str), Some("1"));
        assert_eq!(
            verify(&Secret::new("other"), &token),
            Err(JwtError::Mismatch)
        );
        assert_eq!(verify(&secret, "a.b"), Err(JwtError::Components(2)));
        let unsecured = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode("{}")
        );
        assert_eq!(
            verify(&secret, &unsecured).map_err(|e| e.to_string()),
            Err("Token 'alg' value \"none\" does not match, expected \"HS256\"".to_owned())
        );
        let expired = mint(&secret, r#"{"exp":1}"#);
        assert!(verify(&secret, &expired).is_err_and(|e| {
            e.to_string()
                .starts_with("Token has expired: exp(1) < now(")
        }));
    }

    /// Pins the encoding against a token computed independently with Python's `hmac`,
    /// `hashlib.sha256` and `base64.urlsafe_b64encode` (padding stripped).
    #[test]
    fn the_encoding_matches_an_independent_implementation() {
        let token = mint(&Secret::new("secret"), r#"{"cid_prefix":"p-"}"#);
        assert_eq!(
            token,
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJjaWRfcHJlZml4IjoicC0ifQ.\
             PePbVPBUkPwatCzZkfHy4kFK0NWqZdzBHg1mFOncwtQ"
        );
    }
}
