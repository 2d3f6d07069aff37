//! End-to-end tests live in tests/; see tests/README.md.
