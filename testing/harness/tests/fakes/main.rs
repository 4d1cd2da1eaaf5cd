//! The harness's integration tests, one test binary (`cargo test -p hami-test-harness --test
//! fakes [FILTER]`; a module's tests with `fake_driver::` or `device_clock::`): the fake
//! driver and the fake NVML (`testing/fake-cuda`, `testing/fake-nvml`) that every other
//! crate's tests run against, checked on their own, each test in its own sandbox.
//!
//! * [`fake_driver`]: error codes, the three ways of reaching it, `cuGetProcAddress`
//!   semantics (against the table measured on a real driver), cross-process accounting, NVML
//!   agreement and `CUDA_VISIBLE_DEVICES`.
//! * [`device_clock`]: kernels take simulated device time on the real clock; events,
//!   synchronisation and NVML's utilisation follow it, several processes share one device.

mod device_clock;
mod fake_driver;
