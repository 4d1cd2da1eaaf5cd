//! Over [`crate::driver`]: what the process is charged. [`accounting`] (charge / call /
//! record, the allocation table) with its [`keymap`], its shards' lock ([`spin`]) and its
//! context → device cache ([`ctx_devices`]); [`backstop`] (what no hook saw); [`refusals`]
//! (the refusal warning's rate limit); [`policy`] (views and estimates).

pub mod accounting;
pub mod backstop;
pub mod ctx_devices;
pub(crate) mod keymap;
pub mod policy;
pub mod refusals;
pub mod spin;
