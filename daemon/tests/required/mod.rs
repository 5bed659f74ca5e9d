//! Tests that need a tool or a privilege the machine may lack: elsewhere they skip with
//! a printed reason; under `NBOS_REQUIRE_PRIVILEGED=1` (CI, whose dependency step
//! installs every such tool and runs as root) they fail instead, so a missing package
//! can never turn a test into a silent pass.

/// Whether CI asked for every privileged or tool-dependent test to run.
pub fn required() -> bool {
    std::env::var("NBOS_REQUIRE_PRIVILEGED").as_deref() == Ok("1")
}

/// Call where a test cannot run (`why`): panics under `NBOS_REQUIRE_PRIVILEGED=1`,
/// else prints the reason. The caller returns right after.
pub fn cannot_run(test: &str, why: &str) {
    assert!(!required(), "{test}: NBOS_REQUIRE_PRIVILEGED=1 but it cannot run: {why}");
    eprintln!("skipped {test}: {why}");
}
