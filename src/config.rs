//! Config.
