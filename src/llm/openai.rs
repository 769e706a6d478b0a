//! OpenAI-compatible Chat Completions client (being written).
