//! Errors of the Jupyter API, in the shape Jupyter servers use: `{"message", "reason"}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An HTTP error with a message for the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// Status code.
    pub status: StatusCode,
    /// What went wrong, for people.
    pub message: String,
}

impl ApiError {
    /// 404 with a message.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self { status: StatusCode::NOT_FOUND, message: message.into() }
    }

    /// 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    /// 500 with a message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into() }
    }

    /// 404 for an unknown kernel id.
    pub fn no_kernel(id: &str) -> Self {
        Self::not_found(format!("Kernel does not exist: {}", id.chars().take(64).collect::<String>()))
    }

    /// `Ok` for a kernel id (a canonical UUID); otherwise the same 404 as an unknown kernel,
    /// so a path such as `..` is answered before any lookup, log or file system use.
    pub fn check_kernel_id(id: &str) -> Result<(), Self> {
        if crate::kernel::is_kernel_id(id) {
            Ok(())
        } else {
            Err(Self::no_kernel(id))
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let reason = self.status.canonical_reason().unwrap_or("Error");
        (self.status, Json(serde_json::json!({ "message": self.message, "reason": reason }))).into_response()
    }
}
