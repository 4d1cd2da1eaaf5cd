//! The module image reader (`hami_image::statics`, `hami_image::extent`): any bytes give an
//! error or a value, and a value from `extent` never asks for less than it was given.
#![no_main]

use hami_image::{extent, statics, Extent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for sm in [80, 90, 100] {
        let _ = statics(data, sm);
    }
    if let Ok(Extent::Need(n)) = extent(data) {
        assert!(
            n > data.len() as u64 || data.len() < 16,
            "asked again for {n}"
        );
    }
});
