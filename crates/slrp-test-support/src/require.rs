//! What a test needs from the machine, checked in one place.
//!
//! Locally a test whose need is missing prints a notice and returns early (`false`), so
//! `cargo nextest run` works as any user. Under `CI=true` (or `CI=1`) the same check
//! panics instead: CI runs as root on a machine prepared by `.ci/run`, so a missing need
//! there is a broken environment, and a skipped test would hide it.
//!
//! ```no_run
//! # fn t() {
//! if !slrp_test_support::require_root("loop_device_lifecycle") {
//!     return;
//! }
//! # }
//! ```

use std::path::Path;

/// Linux capability numbers the tests ask for (`include/uapi/linux/capability.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// `CAP_SYS_RESOURCE` (24): online ext4 resize needs it.
    SysResource,
    /// `CAP_SYS_ADMIN` (21): mounts and loop devices need it.
    SysAdmin,
}

impl Cap {
    fn bit(self) -> u32 {
        match self {
            Self::SysResource => 24,
            Self::SysAdmin => 21,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::SysResource => "CAP_SYS_RESOURCE",
            Self::SysAdmin => "CAP_SYS_ADMIN",
        }
    }
}

/// Directories searched for system tools, beside `PATH` (tests may run with a `PATH`
/// that lacks the `sbin` directories where `mkfs.*` live).
const SYSTEM_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Whether this run forbids skipping: the `CI` variable is `true` or `1`.
#[must_use]
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The one decision point: `true` if `available`; otherwise a notice and `false`
/// locally, a panic under CI.
///
/// # Panics
/// Under CI, when the need is not available.
#[must_use]
pub fn require(test: &str, need: &str, available: bool) -> bool {
    if available {
        return true;
    }
    assert!(
        !in_ci(),
        "{test} needs {need}, which this machine lacks; under CI=true that is a failure, not a skip"
    );
    eprintln!("SKIPPED {test}: needs {need} (set CI=true to make this a failure)");
    false
}

/// The name of the running test: libtest (and nextest, through it) runs each test on a
/// thread named after it, and `#[tokio::test]` keeps the body on that thread.
#[must_use]
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned()
}

/// The effective uid is 0.
#[must_use]
pub fn is_root() -> bool {
    status_field("Uid:")
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .is_some_and(|euid| euid == "0")
}

/// The effective capability set holds `cap`.
#[must_use]
pub fn has_cap(cap: Cap) -> bool {
    status_field("CapEff:")
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << cap.bit()) != 0)
}

/// Where `tool` is installed: on `PATH` or in the system directories.
#[must_use]
pub fn find_tool(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SYSTEM_DIRS.iter().map(std::path::PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Requires root (mounts, loop devices, tmpfs).
#[must_use]
pub fn require_root(test: &str) -> bool {
    require(test, "root (mounts and loop devices)", is_root())
}

/// Requires `tool` to be installed (e.g. `mkfs.xfs`).
#[must_use]
pub fn require_tool(test: &str, tool: &str) -> bool {
    require(
        test,
        &format!("{tool} installed"),
        find_tool(tool).is_some(),
    )
}

/// Requires a capability in the effective set.
#[must_use]
pub fn require_cap(test: &str, cap: Cap) -> bool {
    require(test, cap.name(), has_cap(cap))
}

/// Requires a path to exist (e.g. a prepared virtualenv); `what` says what it is.
#[must_use]
pub fn require_path(test: &str, what: &str, path: &Path) -> bool {
    require(
        test,
        &format!("{what} at {}", path.display()),
        path.exists(),
    )
}

fn status_field(prefix: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_available_need_passes_everywhere() {
        assert!(require("t", "nothing", true));
    }

    #[test]
    fn a_missing_need_skips_locally_and_fails_under_ci() {
        // The decision depends only on `CI`, read at call time; nextest runs each test in
        // its own process, and this test does not change the variable.
        if in_ci() {
            let r = std::panic::catch_unwind(|| require("t", "a unicorn", false));
            let msg = r.unwrap_err();
            let msg = msg.downcast_ref::<String>().unwrap();
            assert!(msg.contains("t needs a unicorn"), "{msg}");
        } else {
            assert!(!require("t", "a unicorn", false));
        }
    }

    #[test]
    fn machine_facts_are_read() {
        // /proc/self/status always has these lines; the values depend on the machine.
        assert!(status_field("Uid:").is_some());
        assert!(status_field("CapEff:").is_some());
        assert!(find_tool("sh").is_some());
        assert!(find_tool("no-such-tool-slrp").is_none());
        if is_root() {
            assert!(
                has_cap(Cap::SysAdmin),
                "root without CAP_SYS_ADMIN cannot mount"
            );
        }
    }
}
