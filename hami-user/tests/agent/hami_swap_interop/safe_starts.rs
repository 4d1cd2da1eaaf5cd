//! HAMi's starts with hami-rs's procedure, every version: option A (HAMi's own image and the
//! chart's hami-swap container) and option B (HAMi's image without its library) never write a
//! library a container maps.

use super::*;

/// HAMi 2.5+ with its own image (the chart's hami-swap container, option A): a restart
/// re-copies HAMi-core under a new name, never into a mapped file; install, upgrade and
/// rollback only rename.
fn stock_image_with_hami_swap(rel: &'static Release) {
    let mut n = Node::new(rel);
    let log = n.device_plugin_start();
    let versioned = n.path(&rel.image_lib_name());
    assert!(versioned.exists(), "HAMi's start copied no library:\n{log}");
    n.container_gets_hami_core("a container from before the swap");

    let log = n.swap_ok(&["install"]);
    assert!(log.contains("layout 2.5+"), "{log}");
    n.container_gets(&n.ours.clone(), "a container allocated after install");
    n.all_untouched("after install");

    // A device-plugin restart: HAMi's real start script, HAMi's own image.
    let log = n.device_plugin_start();
    n.all_untouched(&format!("after a device-plugin restart:\n{log}"));
    assert!(versioned.exists(), "{log}");
    n.container_gets_hami_core("a container allocated in the restart window");
    assert_eq!(
        fs::read_to_string(n.path("ld.so.preload"))
            .unwrap()
            .trim_end(),
        CTR_LIB
    );
    n.swap_ok(&["install"]);
    n.container_gets(&n.ours.clone(), "a container allocated after the next pass");

    // An upgrade of hami-rs, then another restart.
    let v2 = n.ours_v2();
    n.install_lib(&v2);
    n.swap_ok(&["install"]);
    n.container_gets(&v2, "a container allocated after the upgrade");
    n.device_plugin_start();
    n.all_untouched("after the upgrade and a restart");
    n.swap_ok(&["install"]);

    // Rollback, then a restart with HAMi's image: everything HAMi-core again.
    let log = n.swap_ok(&["rollback"]);
    n.container_gets_hami_core(&format!("a container allocated after the rollback:\n{log}"));
    n.all_untouched("after the rollback");
    let log = n.device_plugin_start();
    n.all_untouched(&format!("after the rollback and a restart:\n{log}"));
    n.container_gets_hami_core("a container allocated at the end");
}

/// Option B, every version: HAMi's image without its library (our Dockerfile's RUN line), and
/// hami-swap.sh with --device-plugin-without-lib. No start writes a library; no restart
/// window.
fn image_without_lib_with_hami_swap(rel: &'static Release) {
    let mut n = Node::new(rel);
    n.device_plugin_start();
    n.container_gets_hami_core("a container from before the swap");

    // Step 1: the device plugin runs from the image without HAMi-core.
    n.set_image(Image::WithoutLib);
    let log = n.device_plugin_start();
    n.all_untouched(&format!(
        "after the device plugin's switch to option B:\n{log}"
    ));
    n.container_gets_hami_core("a container allocated before install");

    // Step 2: hami-swap.
    let log = n.swap_ok(&["install", "--device-plugin-without-lib"]);
    n.container_gets(&n.ours.clone(), &format!("after install:\n{log}"));
    n.all_untouched("after install");

    // Restarts change nothing: a container allocated right after gets hami-preload.
    for i in 0..2 {
        let log = n.device_plugin_start();
        n.all_untouched(&format!("after restart {i}:\n{log}"));
        n.container_gets(
            &n.ours.clone(),
            "a container allocated right after a restart",
        );
    }
    let before = n.swap(&["install", "--device-plugin-without-lib"]);
    assert!(
        before.status.success() && before.stdout.is_empty(),
        "nothing left to do after the restarts: {before:?}"
    );

    // Upgrade, restart, rollback.
    let v2 = n.ours_v2();
    n.install_lib(&v2);
    n.swap_ok(&["install", "--device-plugin-without-lib"]);
    n.container_gets(&v2, "a container allocated after the upgrade");
    n.device_plugin_start();
    n.all_untouched("after the upgrade and a restart");
    // Rollback (docs/deploy.md). 2.5+: HAMi's own image first (its start creates
    // libvgpu.so.<version> as a new file, which watch moves aside), then hami-swap.sh
    // rollback gives it back. 2.4: hami-swap.sh rollback first (HAMi's own 2.4 image would
    // cp HAMi-core into hami-preload), then HAMi's own image.
    if rel.versioned() {
        n.set_image(Image::Stock);
        let log = n.device_plugin_start();
        n.all_untouched(&format!("after the restart with HAMi's image:\n{log}"));
        let log = n.swap_ok(&["install", "--device-plugin-without-lib"]);
        n.container_gets(
            &v2,
            &format!("a container allocated between the steps:\n{log}"),
        );
        let log = n.swap_ok(&["rollback"]);
        n.container_gets_hami_core(&format!("a container allocated after the rollback:\n{log}"));
        let log = n.device_plugin_start();
        n.all_untouched(&format!("after the rollback and a restart:\n{log}"));
    } else {
        let log = n.swap_ok(&["rollback"]);
        n.container_gets_hami_core(&format!("a container allocated after the rollback:\n{log}"));
        n.all_untouched("after the rollback");
        n.set_image(Image::Stock);
        let log = n.device_plugin_start();
        // HAMi 2.4's own start rewrites its libvgpu.so in place (identical bytes) under
        // HAMi-core's containers, as at every start; hami-preload's are untouched.
        let errs: Vec<String> = n
            .mapped
            .iter_mut()
            .filter(|m| m.what.contains("after install") || m.what.contains("upgrade"))
            .filter_map(|m| m.check().err())
            .collect();
        assert!(errs.is_empty(), "{log}\n{}", errs.join("\n"));
    }
    n.container_gets_hami_core("a container allocated at the end");
}

#[test]
fn hami_v2_10_0_real_start_with_hami_swap_never_writes_a_mapped_library() {
    stock_image_with_hami_swap(&V2100);
}

#[test]
fn hami_v2_9_0_real_start_with_hami_swap_never_writes_a_mapped_library() {
    stock_image_with_hami_swap(&V290);
}

#[test]
fn hami_v2_10_0_image_without_lib_never_writes_a_library_and_has_no_restart_window() {
    image_without_lib_with_hami_swap(&V2100);
}

#[test]
fn hami_v2_9_0_image_without_lib_never_writes_a_library_and_has_no_restart_window() {
    image_without_lib_with_hami_swap(&V290);
}

#[test]
fn hami_v2_4_0_image_without_lib_never_writes_a_library_and_has_no_restart_window() {
    image_without_lib_with_hami_swap(&V240);
}
