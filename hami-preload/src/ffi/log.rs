//! Logging to stderr, one line per message: `[hami-preload pid=N] LEVEL: message`.
//!
//! The level comes from `LIBCUDA_LOG_LEVEL` (read on the first message), on HAMi-core's
//! scale (`hami_common::config::parse_log_level`): errors are always shown (`0` and `1`
//! show nothing else), `2` adds warnings (the default), `3` info, `4` debug, `5` and above
//! trace.

use hami_common::config::{LogLevel, DEFAULT_LOG_LEVEL, ENV_LOG_LEVEL};
use hami_common::env::{getenv, read_log_level};
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// Severity of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Always shown.
    Error = LogLevel::Error as u8,
    /// Shown from `LIBCUDA_LOG_LEVEL=2` (the default).
    Warn = LogLevel::Warn as u8,
    /// Shown from level 3.
    Info = LogLevel::Info as u8,
    /// Shown from level 4.
    Debug = LogLevel::Debug as u8,
    /// Shown from level 5.
    Trace = LogLevel::Trace as u8,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        }
    }
}

/// Default level when `LIBCUDA_LOG_LEVEL` is unset or invalid: `2`, warnings (what
/// `DEFAULT_LOG_LEVEL` shows).
pub const DEFAULT_LEVEL: u8 = DEFAULT_LOG_LEVEL as u8;
const UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

/// Parses a `LIBCUDA_LOG_LEVEL` value into the most verbose [`Level`] shown (as a `u8`):
/// `None` (unset) or garbage gives [`DEFAULT_LEVEL`].
pub fn parse_level(value: Option<&str>) -> u8 {
    check_level(value).unwrap_or(DEFAULT_LEVEL)
}

/// Like [`parse_level`], but a value that is set and is not a non-negative integer is an
/// error (the caller then uses [`DEFAULT_LEVEL`] and says so).
pub fn check_level(value: Option<&str>) -> Result<u8, String> {
    let Some(v) = value else {
        return Ok(DEFAULT_LEVEL);
    };
    match read_log_level(|_| Some(v.to_string())) {
        Some(Ok(l)) => Ok(l as u8),
        Some(Err(e)) => Err(format!(
            "{e} (HAMi-core's scale: 0 or 1 errors, 2 warnings, 3 info, 4 debug, 5 trace); using {}",
            DEFAULT_LOG_LEVEL as u8 + 1
        )),
        None => Ok(DEFAULT_LEVEL),
    }
}

fn current_level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != UNSET {
        return l;
    }
    let v = getenv(ENV_LOG_LEVEL);
    match check_level(v.as_deref()) {
        Ok(l) => {
            LEVEL.store(l, Ordering::Relaxed);
            l
        }
        Err(msg) => {
            // Stored first: the warning below reads the level again.
            if LEVEL
                .compare_exchange(UNSET, DEFAULT_LEVEL, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                write(Level::Warn, format_args!("{msg}"));
            }
            DEFAULT_LEVEL
        }
    }
}

/// Reads `LIBCUDA_LOG_LEVEL` now (at the first CUDA call), so that a malformed value is
/// reported even if nothing else is ever logged.
pub fn init() {
    current_level();
}

/// Whether a message of `level` would be written.
pub fn enabled(level: Level) -> bool {
    level == Level::Error || (level as u8) <= current_level()
}

/// Writes one line to stderr (file descriptor 2) with a single `write`, ignoring failures.
pub fn write(level: Level, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut line = format!("[hami-preload pid={pid}] {}: {args}", level.name());
    // One message, one line.
    if line.contains('\n') {
        line = line.replace('\n', " ");
    }
    line.push('\n');
    let bytes = line.as_bytes();
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe {
            libc::write(
                2,
                bytes[off..].as_ptr().cast::<libc::c_void>(),
                bytes.len() - off,
            )
        };
        if n <= 0 {
            break;
        }
        off += n as usize;
    }
}

/// Logs at error level (always shown).
#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { $crate::ffi::log::write($crate::ffi::log::Level::Error, format_args!($($t)*)) };
}
/// Logs at warning level.
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::ffi::log::write($crate::ffi::log::Level::Warn, format_args!($($t)*)) };
}
/// Logs at info level.
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::ffi::log::write($crate::ffi::log::Level::Info, format_args!($($t)*)) };
}
/// Logs at debug level.
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::ffi::log::write($crate::ffi::log::Level::Debug, format_args!($($t)*)) };
}
/// Logs at trace level.
#[macro_export]
macro_rules! trace {
    ($($t:tt)*) => { $crate::ffi::log::write($crate::ffi::log::Level::Trace, format_args!($($t)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_on_hami_cores_scale() {
        let shown = |v: Option<&str>| parse_level(v);
        assert_eq!(shown(None), Level::Warn as u8, "default: warnings");
        assert_eq!(shown(Some("0")), Level::Error as u8);
        assert_eq!(shown(Some("1")), Level::Error as u8);
        assert_eq!(shown(Some("2")), Level::Warn as u8);
        assert_eq!(shown(Some(" 3 ")), Level::Info as u8);
        assert_eq!(shown(Some("4")), Level::Debug as u8);
        assert_eq!(shown(Some("5")), Level::Trace as u8);
        assert_eq!(shown(Some("9")), Level::Trace as u8);
        assert_eq!(shown(Some("loud")), DEFAULT_LEVEL);
        assert_eq!(shown(Some("-1")), DEFAULT_LEVEL);
        assert_eq!(check_level(Some("3")), Ok(Level::Info as u8));
        assert_eq!(check_level(None), Ok(DEFAULT_LEVEL));
        let e = check_level(Some("debug")).unwrap_err();
        assert!(
            e.starts_with("invalid LIBCUDA_LOG_LEVEL=\"debug\": ") && e.ends_with("using 2"),
            "{e}"
        );
    }
}
