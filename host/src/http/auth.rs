//! Who may talk to the API.
//!
//! Three checks run before any handler:
//!
//! 1. **Token.** With a token (by default the data dir's token file,
//!    `cli/token.rs`; only `--no-token` serves without one), every route
//!    but `GET /api/health` needs `Authorization: Bearer TOKEN`, or
//!    `?token=TOKEN` in the query, for what cannot set headers (a
//!    browser's `EventSource`, a URL pasted from the log); the query
//!    parameter is taken out before the handler sees the query. The
//!    comparison takes the same time wherever the first wrong byte is, so
//!    the token cannot be guessed byte by byte from response times.
//! 2. **Origin.** A browser names the page that sent a request in `Origin`.
//!    A request from a page of another origin is refused: otherwise any web
//!    site open in the user's browser could drive the local host (and its
//!    shell tool). Same-origin requests and non-browser clients (no
//!    `Origin`) pass.
//! 3. **Host.** Without a token, the `Host` header must name a loopback
//!    address or `localhost`. This stops DNS rebinding, where a hostile
//!    name is re-pointed at 127.0.0.1 so that the browser thinks the host is
//!    the attacker's own origin.

use axum::{
    extract::{Request, State},
    http::{header, HeaderMap, HeaderValue},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::{error::ApiError, AppState};
use crate::util::constant_time_eq;

/// The route that answers without a token, so a supervisor can probe.
const OPEN_ROUTE: &str = "/api/health";

/// Middleware: refuses requests that fail any of the checks above.
pub(crate) async fn guard(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let query_token = take_query_token(&mut request);
    if let Err(error) = check(
        &state,
        request.uri().path(),
        request.headers(),
        query_token.as_deref(),
    ) {
        let unauthorized = error.code == "unauthorized";
        let mut response = error.into_response();
        if unauthorized {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        return response;
    }
    next.run(request).await
}

/// Takes `token=...` out of the request's query and returns its value.
fn take_query_token(request: &mut Request) -> Option<String> {
    let query = request.uri().query()?;
    let mut token = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("token=") {
            Some(value) => {
                token = Some(value.to_string());
                false
            }
            None => true,
        })
        .collect();
    token.as_ref()?;
    let path = request.uri().path();
    let path_and_query = if rest.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", rest.join("&"))
    };
    let mut parts = request.uri().clone().into_parts();
    parts.path_and_query = path_and_query.parse().ok();
    if let Ok(uri) = axum::http::Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
    token
}

fn check(
    state: &AppState,
    path: &str,
    headers: &HeaderMap,
    query_token: Option<&str>,
) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let authority = origin.split_once("://").map(|(_, rest)| rest);
        if authority.is_none() || authority != host {
            return Err(ApiError::forbidden(format!(
                "cross-origin request from {origin:?} refused"
            )));
        }
    }
    match &state.token {
        None => {
            if let Some(host) = host {
                if !is_loopback_host(host) {
                    return Err(ApiError::forbidden(format!(
                        "Host {host:?} is not a loopback name; set a token to serve other names"
                    )));
                }
            }
            Ok(())
        }
        Some(_) if path == OPEN_ROUTE => Ok(()),
        Some(token) => {
            let presented = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    v.strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "))
                })
                .map(str::trim)
                .or(query_token);
            match presented {
                None => Err(ApiError::unauthorized(
                    "this host needs Authorization: Bearer TOKEN; its token is in the file `token` \
                     of its data dir, which the offstage commands read (or set OFFSTAGE_TOKEN)",
                )),
                Some(presented) if constant_time_eq(presented.as_bytes(), token.as_bytes()) => {
                    Ok(())
                }
                Some(_) => Err(ApiError::unauthorized("wrong token")),
            }
        }
    }
}

/// Whether a `Host` header value (name or address, optional port) is a
/// loopback name.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [::1]:4545
        rest.split(']').next().unwrap_or("")
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_tokens() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn loopback_hosts() {
        for host in [
            "127.0.0.1:4545",
            "localhost",
            "LOCALHOST:80",
            "[::1]:4545",
            "127.1.2.3",
            "app.localhost:1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "example.com",
            "10.0.0.1:4545",
            "evil.com:4545",
            "[::2]:1",
            "localhost.evil.com",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
