//! Optional bearer-token authentication: `Authorization: Bearer <key>` must carry one of the
//! configured keys. Keys are compared as SHA-256 digests in constant time, every key each
//! time, so neither a key's length nor how much of it matched shows in the answer's timing.

use std::path::Path;

use axum::http::{header, HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::error::{DispatchError, Result};

/// The accepted keys; empty means no authentication.
#[derive(Clone, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// Keys from a file (one per line; blank lines and `#` comments skipped) and from a
    /// comma-separated list (an environment variable), together.
    pub fn load(file: Option<&Path>, list: Option<&str>) -> Result<Self> {
        let mut keys: Vec<String> = Vec::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                DispatchError::Config(format!(
                    "cannot read the API keys file {}: {e}",
                    path.display()
                ))
            })?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
            if keys.is_empty() {
                return Err(DispatchError::Config(format!(
                    "the API keys file {} holds no key: add one per line, or leave the \
                     setting unset to serve without authentication",
                    path.display()
                )));
            }
        }
        if let Some(list) = list {
            keys.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned),
            );
        }
        if let Some(bad) = keys.iter().find(|k| k.chars().any(char::is_whitespace)) {
            return Err(DispatchError::Config(format!(
                "an API key contains whitespace ({} characters long): a bearer token cannot",
                bad.len()
            )));
        }
        Ok(Self {
            digests: keys.iter().map(|k| digest(k)).collect(),
        })
    }

    pub fn is_enabled(&self) -> bool {
        !self.digests.is_empty()
    }

    /// `Ok` when authentication is off or the request carries a configured key.
    pub fn check(&self, headers: &HeaderMap) -> std::result::Result<(), ApiError> {
        if !self.is_enabled() {
            return Ok(());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(presented) = presented else {
            return Err(unauthorized(
                "missing_api_key",
                "no API key: send `Authorization: Bearer <key>` with a configured key",
            ));
        };
        let wanted = digest(presented);
        let matched = self
            .digests
            .iter()
            .fold(subtle::Choice::from(0), |any, d| any | d.ct_eq(&wanted));
        if bool::from(matched) {
            Ok(())
        } else {
            Err(unauthorized(
                "invalid_api_key",
                "the API key is not one of the configured keys",
            ))
        }
    }
}

fn unauthorized(code: &'static str, message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {key}").parse().expect("header value"),
        );
        h
    }

    #[test]
    fn keys_from_file_and_list_are_all_accepted_and_nothing_else() {
        let dir = tempfile::tempdir().expect("test setup");
        let file = dir.path().join("keys");
        std::fs::write(&file, "# team A\nsk-one\n\n  sk-two  \n").expect("test setup");
        let keys = ApiKeys::load(Some(&file), Some("sk-three, ")).expect("test setup");
        for k in ["sk-one", "sk-two", "sk-three"] {
            assert!(keys.check(&bearer(k)).is_ok(), "{k}");
        }
        for k in ["sk-on", "sk-one2", "", "SK-ONE"] {
            let e = keys.check(&bearer(k)).expect_err("refused");
            assert_eq!(
                (e.status, e.code),
                (StatusCode::UNAUTHORIZED, "invalid_api_key")
            );
        }
        let e = keys.check(&HeaderMap::new()).expect_err("refused");
        assert_eq!(e.code, "missing_api_key");
    }

    #[test]
    fn no_keys_means_no_authentication_but_an_empty_file_is_an_error() {
        assert!(ApiKeys::load(None, None)
            .expect("test setup")
            .check(&HeaderMap::new())
            .is_ok());
        let dir = tempfile::tempdir().expect("test setup");
        let file = dir.path().join("keys");
        std::fs::write(&file, "# nothing yet\n").expect("test setup");
        let e = ApiKeys::load(Some(&file), None)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("holds no key"), "{e}");
    }
}
