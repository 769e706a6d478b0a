//! Context projection (placeholder).
