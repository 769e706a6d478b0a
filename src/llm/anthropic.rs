//! Anthropic Messages API client (being written).
