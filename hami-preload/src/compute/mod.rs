//! Over [`crate::objects`]: the compute share. [`gate`]: the launch gate, its driver
//! (events, clock) and the share it applies; [`arming`]: its process-wide switch, armed from
//! the region's record (one atomic load on a launch without a share).

pub mod arming;
pub mod gate;
