//! Request extractors: who is calling (Bearer key → tenant, tenant header,
//! rate limit) and what they sent (JSON content type, size cap, nesting
//! depth, exact fields). Authentication runs before the body is read.

use super::error::{from_serde, ApiError};
use crate::state::{AppState, Principal};
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use uuid::Uuid;

/// The authenticated caller.
pub struct Auth(pub Principal);

impl FromRequestParts<Arc<AppState>> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        // One credential per request: with two, a proxy in front and this service could each
        // act on a different one.
        if parts.headers.get_all(header::AUTHORIZATION).iter().count() > 1 {
            return Err(ApiError::unauthenticated(
                "more than one Authorization header",
            ));
        }
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthenticated("missing Authorization: Bearer <API key>"))?;
        let value = value
            .to_str()
            .map_err(|_| ApiError::unauthenticated("Authorization header is not valid text"))?;
        let key = bearer_token(value)
            .ok_or_else(|| ApiError::unauthenticated("Authorization must use the Bearer scheme"))?;
        let rt = state.runtime();
        let (principal, limiter) = rt
            .authenticate(key)
            .ok_or_else(|| ApiError::unauthenticated("unknown API key"))?;
        // Every x-tenant-id must name the key's tenant (not only the first of several).
        for h in parts.headers.get_all("x-tenant-id") {
            let t = h
                .to_str()
                .ok()
                .and_then(|s| Uuid::parse_str(s.trim()).ok())
                .ok_or_else(|| ApiError::field("x-tenant-id", "not a UUID"))?;
            if t != principal.tenant {
                return Err(ApiError::tenant_mismatch("x-tenant-id"));
            }
        }
        if let Some(l) = limiter {
            if let Err(not_until) = l.check() {
                let wait = not_until.wait_time_from(governor::clock::Clock::now(
                    &governor::clock::DefaultClock::default(),
                ));
                return Err(ApiError::rate_limited(wait.as_secs_f64().ceil() as u64));
            }
        }
        tracing::Span::current().record("tenant", principal.tenant.to_string());
        Ok(Auth(principal))
    }
}

/// The credential of an `Authorization: Bearer <key>` value. The scheme is matched without
/// regard to case (RFC 9110, 11.1): `Bearer`, `bearer` and `BEARER` are one scheme.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, key) = value.split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

impl Auth {
    /// A body's optional `tenantId` must name the key's tenant.
    pub fn check_body_tenant(&self, tenant: Option<Uuid>) -> Result<(), ApiError> {
        match tenant {
            Some(t) if t != self.0.tenant => Err(ApiError::tenant_mismatch("tenantId")),
            _ => Ok(()),
        }
    }
}

/// A JSON body deserialized into exactly the fields of `T`.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let limits = state.runtime().config.limits.clone();
        let bytes = read_json_body(req, limits.api_body_bytes, limits.body_timeout_ms).await?;
        parse_json(&bytes, limits.json_max_depth).map(ApiJson)
    }
}

/// Checks the content type and reads the body under the size cap and time bound.
pub async fn read_json_body(
    req: Request,
    limit: usize,
    timeout_ms: u64,
) -> Result<bytes::Bytes, ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if !(mime == "application/json"
        || (mime.starts_with("application/") && mime.ends_with("+json")))
    {
        return Err(ApiError::unsupported_media_type());
    }
    // Bodies are read as sent: a coded body (gzip, br, ...) would be read as its compressed
    // bytes, or a plain body labelled as coded read as if it were not (RFC 9110 §15.5.16: 415).
    if let Some(coding) = req
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
    {
        return Err(ApiError::new(
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Encoding `{coding}` is not accepted; send the body uncoded"),
        ));
    }
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(ApiError::too_large(limit));
        }
    }
    let body: Body = req.into_body();
    match tokio::time::timeout(
        std::time::Duration::from_millis(timeout_ms),
        axum::body::to_bytes(body, limit),
    )
    .await
    {
        Err(_) => Err(ApiError::new(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "the request body was not received in time",
        )),
        Ok(Err(e)) => {
            let too_big = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if too_big {
                Err(ApiError::too_large(limit))
            } else {
                Err(ApiError::invalid_json(format!(
                    "could not read the request body: {e}"
                )))
            }
        }
        Ok(Ok(b)) => Ok(b),
    }
}

/// Parses JSON into `T` with the field path of any error; refuses nesting
/// deeper than `max_depth` before parsing (no stack games with the parser).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8], max_depth: usize) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::invalid_json(
            "request body is empty; a JSON object is required",
        ));
    }
    if std::str::from_utf8(bytes).is_err() {
        return Err(ApiError::invalid_json("request body is not valid UTF-8"));
    }
    if json_depth(bytes) > max_depth {
        return Err(ApiError::invalid_json(format!(
            "JSON nesting is deeper than {max_depth} levels"
        )));
    }
    // Syntax on its own first: only a body that is not JSON at all is `invalid_json`. (Typed
    // parsing reports some type errors with a syntax code: an array or a null where an
    // enumeration value goes is "expected value".)
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or_default();
        return Err(ApiError::invalid_json(format!(
            "request body is not valid JSON: {msg}"
        )));
    }
    // A NUL character (`\u0000`) is valid JSON, but PostgreSQL stores no NUL in text: refused
    // on both backends alike, naming the field, rather than failing at the database as if
    // storage were down.
    if has_nul_escape(bytes) {
        let at = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| nul_path(&v, String::new()));
        if let Some(path) = at {
            return Err(ApiError::field(
                path,
                "must not contain the NUL character (U+0000)",
            ));
        }
    }
    // Request bodies are objects: serde would also read a struct from an array of its field
    // values in declaration order, which the documented schema does not allow.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::field("body", "must be a JSON object"));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let v = serde_path_to_error::deserialize(de).map_err(|e| {
        // serde_json reports a value an enum cannot start with (e.g. null for
        // a required enum field) as a syntax error; when the body is valid
        // JSON it is a wrong value, and the field must be named.
        let inner = e.inner();
        let path = e.path().to_string();
        if (inner.is_syntax() || inner.is_eof())
            && !(path == "." || path.is_empty())
            && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
        {
            // Other syntax-class errors at a field say what is wrong: "number out of range",
            // "lone leading surrogate in hex escape".
            let msg = inner.to_string();
            let msg = msg.split(" at line ").next().unwrap_or_default();
            if msg.starts_with("expected") {
                return ApiError::field(path, "invalid value: expected one of the allowed values");
            }
            return ApiError::field(path, format!("invalid value: {msg}"));
        }
        from_serde(e)
    })?;
    Ok(v)
}

/// Whether a JSON text escapes a NUL character (`\u0000`) in a string (raw control characters
/// are not JSON, so an escape is the only way one gets in).
fn has_nul_escape(bytes: &[u8]) -> bool {
    let (mut in_str, mut esc) = (false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if !in_str {
            in_str = b == b'"';
        } else if esc {
            esc = false;
            if b == b'u' && bytes.get(i + 1..i + 5) == Some(b"0000".as_slice()) {
                return true;
            }
        } else if b == b'\\' {
            esc = true;
        } else if b == b'"' {
            in_str = false;
        }
    }
    false
}

/// Free-form members of request bodies (`metadata`, an action's `parameters`): kept as JSON
/// text, where a NUL is an escape like any other, so it may be in them.
const FREE_FORM: &[&str] = &["metadata", "parameters"];

/// The path (as field errors name it: `a.b[0]`) of the first string or member name holding a NUL,
/// outside the free-form members.
fn nul_path(v: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    let join = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match v {
        Value::String(s) if s.contains('\0') => {
            Some(if at.is_empty() { "body".into() } else { at })
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, x)| nul_path(x, format!("{at}[{i}]"))),
        Value::Object(m) => m.iter().find_map(|(k, x)| {
            if k.contains('\0') {
                Some(join(&k.replace('\0', "\\u0000")))
            } else if FREE_FORM.contains(&k.as_str()) {
                // Stored as JSON text, escaped: any string may be inside.
                None
            } else {
                nul_path(x, join(k))
            }
        }),
        _ => None,
    }
}

/// Maximum nesting of arrays/objects, ignoring brackets inside strings.
pub fn json_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max, mut in_str, mut esc) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Like [`ApiJson`], but an empty body (no content, with or without a content type) means
/// `T::default()`: for routes whose request fields are all optional.
pub struct ApiJsonOrEmpty<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<Arc<AppState>> for ApiJsonOrEmpty<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let no_type = req.headers().get(header::CONTENT_TYPE).is_none();
        let declared_empty = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            == Some("0");
        // No body at all is the empty request, whatever content type a client library sets.
        if declared_empty {
            return Ok(ApiJsonOrEmpty(T::default()));
        }
        if no_type && req.headers().get(header::TRANSFER_ENCODING).is_none() {
            let limits = state.runtime().config.limits.clone();
            let body = axum::body::to_bytes(req.into_body(), limits.api_body_bytes)
                .await
                .map_err(|_| ApiError::too_large(limits.api_body_bytes))?;
            if body.is_empty() {
                return Ok(ApiJsonOrEmpty(T::default()));
            }
            return Err(ApiError::unsupported_media_type());
        }
        ApiJson::<T>::from_request(req, state)
            .await
            .map(|ApiJson(t)| ApiJsonOrEmpty(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_matched_without_regard_to_case() {
        for v in ["Bearer k1", "bearer k1", "BEARER k1", "bEaReR  k1 "] {
            assert_eq!(bearer_token(v), Some("k1"), "{v:?}");
        }
        for v in ["Basic k1", "Bearer", "Bearer ", "Bearerk1", "Token k1", ""] {
            assert_eq!(bearer_token(v), None, "{v:?}");
        }
    }

    #[test]
    fn a_nul_in_any_string_is_refused_naming_its_field() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            a: String,
            b: Vec<serde_json::Value>,
        }
        let field = |body: &str| match parse_json::<T>(body.as_bytes(), 64) {
            Err(e) => e.errors.first().map(|f| f.field.clone()),
            Ok(t) => panic!("accepted {t:?}"),
        };
        assert_eq!(field(r#"{"a":"x\u0000y","b":[]}"#).as_deref(), Some("a"));
        assert_eq!(
            field(r#"{"a":"x","b":[1,{"k":"\u0000"}]}"#).as_deref(),
            Some("b[1].k")
        );
        // Inside a free-form member (kept as JSON text) a NUL is an escape like any other.
        assert!(parse_json::<T>(br#"{"a":"x","b":[{"metadata":{"k":"\u0000"}}]}"#, 64).is_ok());
        // An escaped backslash followed by `u0000` is the text `\u0000`, not a NUL.
        assert!(parse_json::<T>(br#"{"a":"x\\u0000","b":[]}"#, 64).is_ok());
        assert!(has_nul_escape(br#"{"\u0000":1}"#));
        assert!(has_nul_escape(br#"{"a":"\u00001"}"#));
        assert!(!has_nul_escape(br#"{"a":"\u0001"}"#));
    }

    #[test]
    fn depth_ignores_brackets_in_strings() {
        assert_eq!(json_depth(br#"{"a": "[[[[{{{{"}"#), 1);
        assert_eq!(json_depth(br#"[[[{"a": [1]}]]]"#), 5);
        assert_eq!(json_depth(br#"{"a": "\"[["}"#), 1);
    }
}
