//! Fake NVML: see issue 2.
