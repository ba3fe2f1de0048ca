//! The web page at `/`: static HTML, CSS and JS embedded in the binary (no
//! build step). It streams with `fetch` + a small SSE reader so the API
//! key travels in the `Authorization` header, never in a URL.

use axum::Router;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;

use crate::state::AppState;

const INDEX: &str = include_str!("../static/index.html");
const APP_JS: &str = include_str!("../static/app.js");
const APP_CSS: &str = include_str!("../static/app.css");

/// The page runs only its own script and talks only to this origin; files
/// are shown as text, never rendered.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(|| async {
                (
                    [
                        (header::CONTENT_SECURITY_POLICY, CSP),
                        (header::CACHE_CONTROL, "no-cache"),
                    ],
                    index(),
                )
                    .into_response()
            }),
        )
        .route(
            "/assets/app.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    APP_JS,
                )
                    .into_response()
            }),
        )
        .route(
            "/assets/app.css",
            get(|| async {
                ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
            }),
        )
}

pub(crate) fn index() -> Html<&'static str> {
    Html(INDEX)
}
