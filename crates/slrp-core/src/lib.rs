//! slrp core.
