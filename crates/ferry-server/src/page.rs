//! `GET /`: the status and chat page, three files in `assets/` (HTML, CSS, JavaScript) built
//! into the binary with `include_str!` (no build step, nothing fetched from elsewhere). The
//! page polls `GET /v1/ferry/status` ([`super::status`]) and chats through
//! `POST /v1/chat/completions` with `stream: true`. With [`ServerOptions::web_ui`] off every
//! page path is 404, as any unknown path; like the API, the page is behind the API key when
//! one is set (the router's [`super::auth`] guard runs first).
//!
//! [`ServerOptions::web_ui`]: super::ServerOptions::web_ui

use axum::extract::State;
use axum::http::{header, Method, Uri};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// The page's HTML (`GET /`).
pub const INDEX_HTML: &str = include_str!("../assets/index.html");
/// Its style sheet (`GET /page/style.css`).
pub const STYLE_CSS: &str = include_str!("../assets/style.css");
/// Its script (`GET /page/app.js`).
pub const APP_JS: &str = include_str!("../assets/app.js");

/// The paths the page is served under, with their content and type.
pub const FILES: [(&str, &str, &str); 3] = [
    ("/", INDEX_HTML, "text/html; charset=utf-8"),
    ("/page/style.css", STYLE_CSS, "text/css; charset=utf-8"),
    ("/page/app.js", APP_JS, "text/javascript; charset=utf-8"),
];

/// The handler for every path in [`FILES`].
pub async fn serve(State(state): State<AppState>, method: Method, uri: Uri) -> Response {
    let path = uri.path();
    match FILES.iter().find(|(p, _, _)| *p == path) {
        Some((_, body, content_type)) if state.options.web_ui => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        _ => ApiError::route_not_found(method.as_str(), path).into_response(),
    }
}
