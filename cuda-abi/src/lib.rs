//! The C ABI of the CUDA driver API (`cuda.h`) and of NVML (`nvml.h`, in [`nvml`]): the
//! types, result codes, enum values and flags, `#[repr(C)]` structs and function-pointer
//! types that hami-rs uses, written once for the preload (`hami-preload`, which calls the real
//! driver) and the fake drivers (`testing/fake-cuda`, `testing/fake-nvml`, which implement
//! it). Nothing here has hami logic: every item mirrors a declaration of the headers, and
//! names it.
//!
//! Conventions:
//! * a C `typedef enum {...} T;` with non-negative values is `c_uint`, as gcc and bindgen give
//!   it on Linux ([`CUresult`], [`nvml::nvmlReturn_t`]); enum values that are passed as
//!   `int`-sized arguments or out-parameters (`CUlimit`, `CUdevice_attribute`, ...) are
//!   `c_int`, the type the function-pointer types of [`fns`] take them as (the same four
//!   bytes);
//! * a struct whose callers may pass a longer, newer version and of which only the leading
//!   fields are read is named `...Head` and says so;
//! * layouts are those of CUDA 12.6 / 13 and NVML 12.6 on 64-bit Linux (x86_64 and aarch64),
//!   pinned by the tests of [`structs`] and [`nvml`] (sizes and offsets as gcc gives them for
//!   the headers).
//!
//! `no_std`: it needs only `core::ffi`.

#![no_std]
#![deny(missing_docs)]
#![allow(non_camel_case_types)]

pub mod consts;
pub mod fns;
pub mod nvml;
pub mod result;
pub mod structs;
pub mod types;

pub use consts::*;
pub use fns::*;
pub use result::*;
pub use structs::*;
pub use types::*;
