//! Errors at the HTTP edge: every one is `application/problem+json` (RFC 9457)
//! with the contract's fields `{type, title, status, detail, code, requestId,
//! errors[]}`. Nothing below this module decides a status code by itself.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

tokio::task_local! {
    /// The request id of the request being served (set by the request-id layer).
    pub static REQUEST_ID: String;
}

pub fn current_request_id() -> String {
    REQUEST_ID.try_with(|r| r.clone()).unwrap_or_default()
}

#[derive(Debug, Clone, Serialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// RFC 9457 problem details, as every error of the service is shaped.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub code: String,
    pub request_id: String,
    pub errors: Vec<FieldError>,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    pub errors: Vec<FieldError>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            detail: detail.into(),
            errors: Vec::new(),
            retry_after: None,
        }
    }
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        let (field, message) = (field.into(), message.into());
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "validation_failed",
            detail: format!("{field}: {message}"),
            errors: vec![FieldError { field, message }],
            retry_after: None,
        }
    }
    pub fn fields(errors: Vec<FieldError>) -> Self {
        let detail = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; ");
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "validation_failed",
            detail,
            errors,
            retry_after: None,
        }
    }
    pub fn invalid_json(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", detail)
    }
    pub fn unauthenticated(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", detail)
    }
    pub fn tenant_mismatch(field: &str) -> Self {
        let mut e = ApiError::new(
            StatusCode::FORBIDDEN,
            "tenant_mismatch",
            format!("{field} names a tenant other than the API key's"),
        );
        e.errors.push(FieldError {
            field: field.into(),
            message: "does not match the API key's tenant".into(),
        });
        e
    }
    pub fn forbidden(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }
    pub fn not_found(what: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }
    pub fn conflict(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, "conflict", detail)
    }
    pub fn too_large(limit: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }
    pub fn unsupported_media_type() -> Self {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "this route takes application/json",
        )
    }
    pub fn rate_limited(retry_after: u64) -> Self {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "the API key's rate limit is exceeded",
        );
        e.retry_after = Some(retry_after.max(1));
        e
    }
    pub fn unavailable(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    pub fn title(&self) -> &'static str {
        self.status.canonical_reason().unwrap_or("Error")
    }

    pub fn problem(&self, request_id: String) -> Problem {
        Problem {
            type_: format!(
                "https://substrate-gate.dev/problems/{}",
                self.code.replace('_', "-")
            ),
            title: self.title().to_string(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code.to_string(),
            request_id,
            errors: self.errors.clone(),
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::Conflict(m) => ApiError::conflict(m),
            // Writes fail closed: storage trouble is a 503, never a 500.
            other => {
                tracing::error!(error = %other, "storage error");
                ApiError::unavailable("storage is unavailable; nothing was changed")
            }
        }
    }
}

pub fn problem_response(status: StatusCode, body: &Problem, retry_after: Option<u64>) -> Response {
    let json = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = (status, json).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(s) = retry_after {
        if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let p = self.problem(current_request_id());
        problem_response(self.status, &p, self.retry_after)
    }
}

/// Turns a serde error (with its path) into a 400 that names the field.
pub fn from_serde(err: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = err.path().to_string();
    let inner = err.into_inner();
    let msg = inner.to_string();
    // Strip serde_json's " at line X column Y" suffix: the field name is what helps.
    let msg = match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::invalid_json(format!("request body is not valid JSON: {msg}"));
    }
    let named = msg.split('`').nth(1).map(str::to_string);
    let field = if msg.starts_with("unknown field") && path != "." && !path.is_empty() {
        // The path ends with the unknown key itself, exactly as sent (the message quotes it in
        // backticks, which a key may contain too).
        path
    } else if msg.starts_with("unknown field")
        || msg.starts_with("missing field")
        || msg.starts_with("duplicate field")
    {
        let name = named.unwrap_or_default();
        // serde_path_to_error already ends the path with an unknown field's name.
        if path == "." || path.is_empty() {
            name
        } else if path == name || path.ends_with(&format!(".{name}")) {
            path
        } else {
            format!("{path}.{name}")
        }
    } else if path == "." || path.is_empty() {
        "body".to_string()
    } else {
        path
    };
    let message = if msg.starts_with("unknown field") {
        match msg.find(", expected") {
            Some(i) => format!("unknown field{}", &msg[i..]),
            None => "unknown field".to_string(),
        }
    } else {
        msg
    };
    ApiError::field(field, message)
}
