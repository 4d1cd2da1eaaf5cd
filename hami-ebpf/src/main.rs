#![no_std]
#![no_main]
//! eBPF programs: see issue 2/4.
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
