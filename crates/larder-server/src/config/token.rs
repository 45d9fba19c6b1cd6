//! The bearer token of `--auth-token` (or `LARDER_AUTH_TOKEN`).

use std::path::PathBuf;

/// A secret bearer token; its `Debug` does not print it.
#[derive(Clone)]
pub struct Token(pub Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The token from `--auth-token FILE` (its first line, trimmed), else from the environment
/// variable `LARDER_AUTH_TOKEN` (trimmed); an empty token is an error, not "no auth".
pub(super) fn load_token(file: Option<&PathBuf>, env: Option<String>) -> Result<Option<Token>, String> {
    let (text, from) = match (file, env) {
        (Some(path), _) => (
            std::fs::read_to_string(path)
                .map_err(|e| format!("reading the auth token file {}: {e}", path.display()))?,
            format!("the auth token file {}", path.display()),
        ),
        (None, Some(v)) => (v, "LARDER_AUTH_TOKEN".to_string()),
        (None, None) => return Ok(None),
    };
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(format!("{from} holds no token"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{from}: the token must be printable ASCII without spaces"));
    }
    Ok(Some(Token(token.as_bytes().to_vec())))
}
