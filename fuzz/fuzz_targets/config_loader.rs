//! The config file, any text: `Config::from_toml` (parse, then validate) never panics, and an
//! error renders as a message. A config it accepts validates again, and its admission floor
//! and its `Debug` (which hides the database password) are computed without panicking.

#![no_main]

use std::path::Path;

use checkout::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml(Path::new("fuzz.toml"), text) {
        Ok(config) => {
            assert!(
                config.validate().is_ok(),
                "accepted once, refused the second time"
            );
            let _ = config.admission_floor();
            let _ = format!("{config:?}");
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
        }
    }
});
