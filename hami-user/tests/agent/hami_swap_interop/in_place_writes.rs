//! What the check must catch: HAMi 2.4's own start rewriting the mapped `libvgpu.so` in
//! place, and the former option B writing into the mapped HAMi-core library.

use super::*;

/// HAMi 2.4 with its own image: its postStart `cp -f` rewrites the mapped `libvgpu.so` in
/// place at every start (the check sees it), it would write HAMi-core into hami-preload
/// (shown with the guard overridden), and hami-swap.sh refuses to install there.
#[test]
fn hami_v2_4_0_own_image_writes_in_place_so_install_is_refused_there() {
    let mut n = Node::new(&V240);
    n.device_plugin_start();
    n.container_gets_hami_core("a HAMi-core container");
    n.device_plugin_start();
    let err = n.mapped[0].check().expect_err(
        "HAMi 2.4's postStart cp -f rewrites libvgpu.so in place: the check must see it",
    );
    assert_written_in_place(&err);

    let before = fs::read(n.path("libvgpu.so")).unwrap();
    let out = n.swap(&["install"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--device-plugin-without-lib") && err.contains("cp -f"),
        "{err}"
    );
    assert_eq!(fs::read(n.path("libvgpu.so")).unwrap(), before);
    assert!(!n.path("hami-rs-orig").exists());

    // What the refusal prevents: hami-preload at libvgpu.so, HAMi 2.4's own image restarts.
    n.swap_ok(&["install", "--device-plugin-without-lib"]);
    n.container_gets(&n.ours.clone(), "a hami-preload container");
    n.device_plugin_start();
    let err = n.mapped[1].check().expect_err(
        "HAMi 2.4's own image writes HAMi-core into the mapped hami-preload: the check must \
         see it",
    );
    assert_written_in_place(&err);
}

/// The former option B (hami-preload in HAMi's image under HAMi's file name): HAMi's
/// vgpu-init.sh copies it into the host's libvgpu.so.<version>, the HAMi-core file running
/// containers map.
#[test]
fn the_former_option_b_writes_into_the_mapped_hami_core() {
    let mut n = Node::new(&V2100);
    n.device_plugin_start();
    n.container_gets_hami_core("a HAMi-core container");
    let ours = n.ours.clone();
    n.set_image(Image::OursUnderHamisName(&ours));
    n.device_plugin_start();
    let err = n.mapped[0]
        .check()
        .expect_err("vgpu-init.sh cp's into the existing file: the check must see it");
    assert_written_in_place(&err);
}

/// What a write into a mapped file can look like to the process that maps it: a new mtime on
/// the same inode, changed bytes in its mapping, death by SIGBUS when it touched a page while
/// `cp` had the file truncated, or by SIGSEGV/SIGILL when it ran code that changed under it.
/// Any of these proves the write went in place; another inode (a rename) or an exit would not.
fn assert_written_in_place(err: &str) {
    assert!(
        err.contains("written in place")
            || err.contains("content changed")
            || err.contains("killed by SIGBUS")
            || err.contains(&format!("killed by signal {}", libc::SIGSEGV))
            || err.contains(&format!("killed by signal {}", libc::SIGILL)),
        "{err}"
    );
}
