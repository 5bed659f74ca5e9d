//! The API's token check (see [`crate::link::token`] for where a request carries it).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::state::AppState;
use crate::link::token::{presented_token, token_matches};

/// Rejects a request without the right token with 401, unless the API is open.
pub async fn require_token(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(expected) = st.token.as_deref() else {
        return next.run(req).await;
    };
    let presented = presented_token(&req);
    let ok = presented.as_deref().is_some_and(|t| token_matches(t, expected));
    if ok {
        next.run(req).await
    } else {
        tracing::warn!(path = %req.uri().path(), token_present = presented.is_some(), "refused request: bad or missing token");
        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "token")], "401: missing or wrong token\n")
            .into_response()
    }
}
