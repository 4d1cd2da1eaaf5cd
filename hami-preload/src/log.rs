//! Logging to stderr, one line per message: `[hami-preload pid=N] LEVEL: message`.
//!
//! The level comes from `LIBCUDA_LOG_LEVEL` (0-4, read on the first message). Errors are
//! always shown; 1 adds warnings (the default), 2 info, 3 debug, 4 trace.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// Severity of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Always shown.
    Error = 0,
    /// Shown from `LIBCUDA_LOG_LEVEL=1` (the default).
    Warn = 1,
    /// Shown from level 2.
    Info = 2,
    /// Shown from level 3.
    Debug = 3,
    /// Shown from level 4.
    Trace = 4,
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

/// Default level when `LIBCUDA_LOG_LEVEL` is unset or invalid.
pub const DEFAULT_LEVEL: u8 = 1;
const UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

/// Parses a `LIBCUDA_LOG_LEVEL` value: an integer 0-4 (larger values mean 4).
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
    match v.trim().parse::<u64>() {
        Ok(n) => Ok(n.min(4) as u8),
        Err(_) => Err(format!(
            "invalid LIBCUDA_LOG_LEVEL={v:?}: not an integer 0-4; using {DEFAULT_LEVEL}"
        )),
    }
}

fn current_level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != UNSET {
        return l;
    }
    let v = std::env::var("LIBCUDA_LOG_LEVEL").ok();
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
    ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) };
}
/// Logs at warning level.
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) };
}
/// Logs at info level.
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) };
}
/// Logs at debug level.
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($t)*)) };
}
/// Logs at trace level.
#[macro_export]
macro_rules! trace {
    ($($t:tt)*) => { $crate::log::write($crate::log::Level::Trace, format_args!($($t)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse() {
        assert_eq!(parse_level(None), DEFAULT_LEVEL);
        assert_eq!(parse_level(Some("0")), 0);
        assert_eq!(parse_level(Some(" 3 ")), 3);
        assert_eq!(parse_level(Some("9")), 4);
        assert_eq!(parse_level(Some("loud")), DEFAULT_LEVEL);
        assert_eq!(parse_level(Some("-1")), DEFAULT_LEVEL);
        assert_eq!(check_level(Some("2")), Ok(2));
        assert_eq!(check_level(None), Ok(DEFAULT_LEVEL));
        let e = check_level(Some("debug")).unwrap_err();
        assert!(
            e.contains("LIBCUDA_LOG_LEVEL=\"debug\"") && e.contains("using 1"),
            "{e}"
        );
    }
}
