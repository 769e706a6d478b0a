//! The built-in web page and its sign-in, from outside through HTTP (what a browser does with
//! them is `tests/browser`, in headless Chromium):
//!
//! - `assets`: `GET /` and every file it loads, with their types, policy, ETag and gzip.
//! - `signin`: `POST/GET/DELETE /v1/auth/cookie`, the cookie accepted like the bearer header
//!   (SSE included), the Secure flag, and the origin check on cookie requests that change state.

mod assets;
mod signin;
