//! Browser assets compiled into the binary (Swagger UI, GraphiQL and React; licences in
//! `assets/LICENSES.md`), served under `/_meshql/assets/`.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub const PREFIX: &str = "/_meshql/assets";

const FILES: &[(&str, &str, &[u8])] = &[
    (
        "swagger-ui-bundle.js",
        "application/javascript",
        include_bytes!("../assets/swagger-ui-bundle.js"),
    ),
    (
        "swagger-ui.css",
        "text/css",
        include_bytes!("../assets/swagger-ui.css"),
    ),
    (
        "graphiql.min.js",
        "application/javascript",
        include_bytes!("../assets/graphiql.min.js"),
    ),
    (
        "graphiql.min.css",
        "text/css",
        include_bytes!("../assets/graphiql.min.css"),
    ),
    (
        "react.production.min.js",
        "application/javascript",
        include_bytes!("../assets/react.production.min.js"),
    ),
    (
        "react-dom.production.min.js",
        "application/javascript",
        include_bytes!("../assets/react-dom.production.min.js"),
    ),
    (
        "LICENSES.md",
        "text/markdown; charset=utf-8",
        include_bytes!("../assets/LICENSES.md"),
    ),
];

const SWAGGER_PAGE: &str = include_str!("../assets/swagger.html");
const GRAPHIQL_PAGE: &str = include_str!("../assets/graphiql.html");

/// Escapes a value placed inside a single-quoted JavaScript string in HTML.
fn js_html_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '\'' => "\\x27".chars().collect::<Vec<_>>(),
            '\\' => "\\\\".chars().collect(),
            '<' => "\\x3c".chars().collect(),
            '&' => "\\x26".chars().collect(),
            '"' => "\\x22".chars().collect(),
            c => vec![c],
        })
        .collect()
}

pub fn swagger_page(title: &str, spec_url: &str) -> String {
    SWAGGER_PAGE
        .replace("{{TITLE}}", &js_html_escape(title))
        .replace("{{SPEC_URL}}", &js_html_escape(spec_url))
}

/// GraphiQL for `endpoint`, opening with `example` when the browser has no query of its own.
pub fn graphiql_page(title: &str, endpoint: &str, example: Option<&str>) -> String {
    GRAPHIQL_PAGE
        .replace("{{TITLE}}", &js_html_escape(title))
        .replace("{{ENDPOINT}}", &js_html_escape(endpoint))
        .replace(
            "{{EXAMPLE}}",
            &js_html_escape(example.unwrap_or_default())
                .replace('\n', "\\n")
                .replace('\r', ""),
        )
}

pub async fn serve_asset(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => {
            let mut r = Response::new(axum::body::Body::from(*bytes));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=86400"),
            );
            r
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"error": format!("no asset named {name}")})),
        )
            .into_response(),
    }
}
