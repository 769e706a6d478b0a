//! Session.
