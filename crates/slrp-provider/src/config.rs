//! See the crate docs; filled in by issue #10's work.
