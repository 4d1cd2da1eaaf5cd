//! Over [`crate::ffi`]: what the real driver and NVML answer, read or rewritten, with no
//! table of ours. [`devmap`]: which container device each CUDA ordinal is; [`proclist`]:
//! NVML's process lists narrowed to the container; [`export_table`]: NVML's private export
//! table; [`hostpid`]: this process's pid in the host's namespace.

pub mod devmap;
pub mod export_table;
pub mod hostpid;
pub mod proclist;
