//! Over [`crate::objects`]: the compute share. [`gate`]: the launch gate, its driver
//! (events, clock) and the share it applies.

pub mod gate;
