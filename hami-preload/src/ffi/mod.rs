//! The bottom layer: the foreign interface and the environment. The driver's and NVML's
//! types ([`cuda`]), the real functions by name ([`symbols`]) over the real libraries and the
//! real `dlsym` ([`real`]), the hook prelude ([`shim`]), the panic guard's unwinder
//! ([`unwind`]), logging ([`log`]), the configuration read from the environment ([`config`])
//! and what glibc before 2.34 kept in `libdl` and `libpthread` ([`glibc_compat`]).

pub mod config;
pub mod cuda;
pub mod glibc_compat;
#[macro_use]
pub mod log;
pub mod real;
pub mod shim;
pub mod symbols;
pub mod unwind;
