//! The daemon's config file (daemon/src/config/): TOML parsed with unknown keys refused,
//! then validated. Written by an operator, but read by a privileged daemon, and its errors
//! must name the field rather than crash or mislead.
//!
//! Invariants: every error names where the text came from; an accepted config serialises
//! back to TOML that parses and validates to the same config. The serialiser is toml 1's (the
//! oracle only): toml 0.8's panics on a string with 256 quotes in a row (docs/fuzzing.md).

use notebookosd::config::Config;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let Ok(text) = std::str::from_utf8(data) else { return };
        match Config::parse(text, "<fuzz>") {
            Ok(config) => {
                let again = toml::to_string(&config).expect("an accepted config serialises");
                let back = match Config::parse(&again, "<round trip>") {
                    Ok(b) => b,
                    Err(e) => panic!("accepted config does not re-parse: {e}\n{again}"),
                };
                assert_eq!(back, config, "round trip changed the config:\n{again}");
                let _ = config.cluster.seed_list();
            }
            Err(e) => assert!(e.to_string().starts_with("config <fuzz>: field `"), "{e}"),
        }
    });
}
