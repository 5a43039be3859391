//! See `benches/adapter.rs`.
