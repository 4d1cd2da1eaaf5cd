//! Fake CUDA driver: see issue 2.
