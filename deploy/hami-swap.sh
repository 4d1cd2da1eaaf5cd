#!/bin/sh
# hami-swap.sh: puts libhami_preload.so where HAMi's device plugin takes the library it
# mounts into every vGPU container, keeps ld.so.preload right, and undoes it.
#
# What HAMi does (read from its sources, v2.4.0 to v2.10.0; docs/hami.md):
#   * v2.4.x mounts the host's <vgpu>/libvgpu.so; its postStart hook copies the image's
#     /k8s-vgpu/lib/nvidia/* over <vgpu>/ at every device-plugin start (cp -f: in place,
#     into the existing file, even when the content is the same).
#   * v2.5.0 and later mount <vgpu>/libvgpu.so.<version> when that file exists, else
#     <vgpu>/libvgpu.so; the image ships only libvgpu.so.<version> (and ld.so.preload), and
#     vgpu-init.sh copies each of its files whose content differs from the host's (in place
#     when the host has one). v2.10 also rewrites ld.so.preload in place at every start.
#
# So this script installs hami-preload as <vgpu>/libvgpu.so and moves every
# <vgpu>/libvgpu.so.<version> aside: HAMi >= 2.5 then falls back to libvgpu.so, and a
# device-plugin restart recreates libvgpu.so.<version> as a new file (never writing into
# the one containers map); `watch` moves it aside again. Originals go to <vgpu>/hami-rs-orig/
# (the newest HAMi-core library seen under each name), and `rollback` puts them back.
# Every file it writes is written under a temporary name and renamed into place: running
# containers keep the file they mapped, and nothing is ever written into it.
# On a node where HAMi mounts libvgpu.so and nothing shows HAMi >= 2.5 (HAMi 2.4), the
# device plugin's postStart would copy HAMi-core into that very file at its next start, so
# install refuses unless --device-plugin-without-lib says that HAMi's image carries no
# library (docs/deploy.md, option B: deploy/hami-device-plugin/Dockerfile).
#
# usage: hami-swap.sh install|rollback|status|watch|gc [options]  (gc: one --pod-logs pass)
#   --vgpu-dir DIR        the host folder HAMi copies its library to, as this script sees it
#                         (default /usr/local/vgpu)
#   --lib FILE            the libhami_preload.so to install (default /usr/lib/hami/libhami_preload.so)
#   --preload-line PATH   what ld.so.preload must name: the library's path inside containers
#                         (default /usr/local/vgpu/libvgpu.so, HAMi's hook path /usr/local)
#   --device-plugin-without-lib
#                         HAMi's device-plugin image carries no libvgpu.so* (option B): needed
#                         to install where HAMi mounts libvgpu.so (HAMi 2.4); `watch` warns
#                         when the device plugin copies a library all the same
#   --interval SECONDS    watch: seconds between two full passes (default 10)
#   --check-ms MS         watch: milliseconds between two looks at the folder (default 500):
#                         a look starts no process (shell builtins only) and triggers a full
#                         pass as soon as a libvgpu.so.<version> appears, libvgpu.so goes or
#                         ld.so.preload names something else (a device-plugin restart)
#   --hold                rollback: stay running afterwards (a DaemonSet container)
#   --pod-logs DIR        watch: also remove <vgpu>/containers/<pod uid>_<container>/ folders
#                         of pods that left the node (what HAMi's vGPU monitor does, for when
#                         it is turned off): a folder goes when no DIR/<ns>_<name>_<pod uid>
#                         exists (the kubelet's /var/log/pods) and it is older than
#                         --stale-minutes (default 10)
#   --self-uid UID        with --pod-logs: this pod's own uid; nothing is removed unless its
#                         log folder is seen (a wrong or empty DIR never removes anything)
# Exit status: 0 done (or nothing to do), 1 bad usage or a failed step, 2 (status only)
# not installed.
set -u

VGPU=/usr/local/vgpu
LIB=/usr/lib/hami/libhami_preload.so
LINE=/usr/local/vgpu/libvgpu.so
INTERVAL=10
CHECK_MS=500
NO_LIB=0
WATCHED=0
HOLD=0
POD_LOGS=""
SELF_UID=""
STALE_MIN=10
MARKER=hami_preload_marker

say() { echo "hami-swap: $*"; }
die() { echo "hami-swap: error: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: hami-swap.sh install|rollback|status|watch|gc [--vgpu-dir DIR] [--lib FILE] [--preload-line PATH] [--device-plugin-without-lib] [--interval S] [--check-ms MS] [--hold] [--pod-logs DIR]"
MODE=$1
shift
while [ $# -gt 0 ]; do
    # --opt=value is --opt value.
    case "$1" in
        --*=*) opt=${1%%=*}; val=${1#*=}; shift; set -- "$opt" "$val" "$@" ;;
    esac
    case "$1" in
        --vgpu-dir) [ $# -ge 2 ] || die "--vgpu-dir needs a value"; VGPU=$2; shift 2 ;;
        --lib) [ $# -ge 2 ] || die "--lib needs a value"; LIB=$2; shift 2 ;;
        --preload-line) [ $# -ge 2 ] || die "--preload-line needs a value"; LINE=$2; shift 2 ;;
        --interval) [ $# -ge 2 ] || die "--interval needs a value"; INTERVAL=$2; shift 2 ;;
        --check-ms) [ $# -ge 2 ] || die "--check-ms needs a value"; CHECK_MS=$2; shift 2 ;;
        --device-plugin-without-lib) NO_LIB=1; shift ;;
        --hold) HOLD=1; shift ;;
        --pod-logs) [ $# -ge 2 ] || die "--pod-logs needs a value"; POD_LOGS=$2; shift 2 ;;
        --self-uid) [ $# -ge 2 ] || die "--self-uid needs a value"; SELF_UID=$2; shift 2 ;;
        --stale-minutes) [ $# -ge 2 ] || die "--stale-minutes needs a value"; STALE_MIN=$2; shift 2 ;;
        *) die "unknown argument '$1'" ;;
    esac
done
case "$INTERVAL" in ''|*[!0-9]*|0) die "--interval must be a positive number of seconds, not '$INTERVAL'" ;; esac
case "$CHECK_MS" in ''|*[!0-9]*|0) die "--check-ms must be a positive number of milliseconds, not '$CHECK_MS'" ;; esac
case "$STALE_MIN" in ''|*[!0-9]*) die "--stale-minutes must be a number of minutes, not '$STALE_MIN'" ;; esac
ORIG="$VGPU/hami-rs-orig"

# A hami-rs build (any version) names its marker symbol; HAMi-core's library does not.
is_ours() { [ -f "$1" ] && grep -q "$MARKER" "$1" 2>/dev/null; }

# HAMi's versioned libraries in the folder (libvgpu.so.<version>), one a line.
versioned() {
    for f in "$VGPU"/libvgpu.so.*; do
        [ -f "$f" ] || continue
        case "$f" in *.hami-tmp) continue ;; esac
        echo "$f"
    done
}

# Whether HAMi >= 2.5 shows: a libvgpu.so.<version> in the folder or moved aside by us.
shows_25() {
    [ -n "$(versioned)" ] && return 0
    for f in "$ORIG"/libvgpu.so.*; do
        case "$f" in *.absent) continue ;; esac
        [ -f "$f" ] && return 0
    done
    return 1
}

# Which layout the folder shows: 2.5+ when a libvgpu.so.<version> is there or was moved
# aside by us, else 2.4.
layout() {
    if shows_25; then
        echo "2.5+ (libvgpu.so.<version>)"
    else
        echo "2.4 (libvgpu.so)"
    fi
}

# Moves FILE (HAMi's) into the backup folder under its name, replacing an older backup.
keep_original() {
    mkdir -p "$ORIG" || die "cannot create $ORIG"
    mv -f "$1" "$ORIG/$(basename "$1")" || die "cannot move $1 to $ORIG"
    say "kept HAMi's $(basename "$1") in $ORIG"
}

# Writes FILE's new content from stdin under a temporary name, then renames it over FILE:
# whoever has FILE open or mapped keeps the old file, untouched.
replace_with() {
    rm -f "$1.hami-tmp" && cat > "$1.hami-tmp" && chmod "$2" "$1.hami-tmp" \
        && mv -f "$1.hami-tmp" "$1" || { rm -f "$1.hami-tmp"; return 1; }
}

# Whether the folder still looks as an install pass leaves it, with shell builtins only (no
# process started, so that `watch` can look often for nothing): no libvgpu.so.<version>, a
# libvgpu.so, and ld.so.preload's first line is --preload-line. What this does not see (a
# libvgpu.so rewritten in place, a second line) the full pass every --interval catches.
looks_installed() {
    for f in "$VGPU"/libvgpu.so.*; do
        case "$f" in *.hami-tmp) continue ;; esac
        [ -e "$f" ] && return 1
    done
    [ -f "$VGPU/libvgpu.so" ] && [ -f "$VGPU/ld.so.preload" ] || return 1
    line=""
    { IFS= read -r line < "$VGPU/ld.so.preload"; } 2>/dev/null
    [ "$line" = "$LINE" ]
}

do_install() {
    [ -d "$VGPU" ] || die "$VGPU is not a folder (HAMi's device plugin creates it; --vgpu-dir)"
    is_ours "$LIB" || die "$LIB is not libhami_preload.so (it does not define $MARKER)"
    # HAMi 2.4's postStart (cp -f) writes its libvgpu.so into the existing host file, the one
    # containers map, at every device-plugin start: ours must not be that file unless the
    # device plugin's image carries no library.
    if [ "$NO_LIB" = 0 ] && ! shows_25; then
        is_ours "$VGPU/libvgpu.so" && say "warning: hami-preload is $VGPU/libvgpu.so from an earlier install: HAMi 2.4's next device-plugin start writes HAMi-core into it under the containers that map it; switch the device plugin to option B or roll back"
        die "not installing: HAMi mounts $VGPU/libvgpu.so here and no libvgpu.so.<version> shows HAMi >= 2.5 (HAMi 2.4, or HAMi not started yet). HAMi 2.4's device plugin copies its libvgpu.so into that very file (cp -f, in place) at every start, under every container that maps it. Run HAMi's device plugin from an image without its library (docs/deploy.md, option B: deploy/hami-device-plugin/Dockerfile) and pass --device-plugin-without-lib (chart: hamiSwap.devicePluginWithoutLib=true)"
    fi
    changed=0
    # HAMi >= 2.5: every libvgpu.so.<version> it would pick goes aside.
    for f in $(versioned); do
        if is_ours "$f"; then
            rm -f "$f" || die "cannot remove $f"
        else
            # Under watch, after its first pass: a device-plugin start copied it.
            [ "$NO_LIB" = 1 ] && [ "$WATCHED" = 1 ] && say "warning: the device plugin copied $(basename "$f"): its image carries HAMi-core, not the image of option B (--device-plugin-without-lib)"
            keep_original "$f"
        fi
        changed=1
    done
    # libvgpu.so itself: HAMi 2.4's name and the fallback of 2.5+.
    dst="$VGPU/libvgpu.so"
    [ -d "$dst" ] && die "$dst is a folder"
    if [ -f "$dst" ] && ! is_ours "$dst"; then
        keep_original "$dst"
    elif [ ! -e "$dst" ] && [ ! -e "$ORIG/libvgpu.so" ] && [ ! -e "$ORIG/libvgpu.so.absent" ]; then
        mkdir -p "$ORIG" && : > "$ORIG/libvgpu.so.absent" || die "cannot write $ORIG"
    fi
    if ! cmp -s "$LIB" "$dst" 2>/dev/null; then
        replace_with "$dst" 0755 < "$LIB" || die "cannot install $dst"
        say "installed $LIB as $dst"
        changed=1
    fi
    # ld.so.preload: one line naming the library's path inside containers.
    pre="$VGPU/ld.so.preload"
    if [ "$(cat "$pre" 2>/dev/null)" != "$LINE" ]; then
        # HAMi's own (when there is one) is kept; a missing one is written (HAMi writes the
        # same line) and stays after a rollback.
        if [ -f "$pre" ] && [ ! -e "$ORIG/ld.so.preload" ]; then
            mkdir -p "$ORIG" && replace_with "$ORIG/ld.so.preload" 0644 < "$pre" \
                || die "cannot keep $pre"
        fi
        printf '%s\n' "$LINE" | replace_with "$pre" 0644 || die "cannot write $pre"
        say "wrote $pre: $LINE"
        changed=1
    fi
    [ "$changed" = 1 ] && say "layout $(layout): containers allocated from now on get hami-preload"
    return 0
}

# Removes the per-container folders of pods that left the node (see --pod-logs).
do_gc() {
    [ -n "$POD_LOGS" ] || return 0
    [ -d "$VGPU/containers" ] || return 0
    if [ -n "$SELF_UID" ]; then
        if ! ls -d "$POD_LOGS"/*_"$SELF_UID" >/dev/null 2>&1; then
            say "not removing folders: this pod's own log folder (*_$SELF_UID) is not in $POD_LOGS"
            return 0
        fi
    elif [ -z "$(ls -A "$POD_LOGS" 2>/dev/null)" ]; then
        say "not removing folders: $POD_LOGS is empty or missing"
        return 0
    fi
    for d in "$VGPU"/containers/*_*; do
        [ -d "$d" ] || continue
        name=$(basename "$d")
        uid=${name%%_*}
        [ -n "$uid" ] || continue
        ls -d "$POD_LOGS"/*_"$uid" >/dev/null 2>&1 && continue
        # Old enough: a folder is created at allocation, before the pod's log folder.
        [ -n "$(find "$d" -maxdepth 0 -mmin +"$STALE_MIN" 2>/dev/null)" ] || continue
        rm -rf "$d" && say "removed $d: pod $uid left the node"
    done
}

do_rollback() {
    [ -d "$VGPU" ] || die "$VGPU is not a folder (--vgpu-dir)"
    if [ ! -d "$ORIG" ]; then
        say "nothing to roll back in $VGPU"
        return 0
    fi
    for f in "$ORIG"/*; do
        [ -e "$f" ] || continue
        name=$(basename "$f")
        case "$name" in
            *.absent)
                base=${name%.absent}
                if [ "$base" = libvgpu.so ] && is_ours "$VGPU/$base"; then rm -f "$VGPU/$base"; fi
                rm -f "$f"
                ;;
            libvgpu.so*)
                # A newer HAMi-core copied since (a device-plugin restart) stays.
                if [ -f "$VGPU/$name" ] && ! is_ours "$VGPU/$name"; then
                    rm -f "$f"
                else
                    mv -f "$f" "$VGPU/$name" || die "cannot restore $name"
                fi
                ;;
            *) mv -f "$f" "$VGPU/$name" || die "cannot restore $name" ;;
        esac
        say "restored $name"
    done
    # Versioned names of ours (none are installed, but older runs may have) and libvgpu.so
    # when HAMi had none.
    for f in $(versioned); do is_ours "$f" && rm -f "$f"; done
    rmdir "$ORIG" 2>/dev/null || die "$ORIG is not empty after the rollback"
    say "rolled back: containers allocated from now on get HAMi-core"
}

do_status() {
    [ -d "$VGPU" ] || die "$VGPU is not a folder (--vgpu-dir)"
    say "layout $(layout)"
    mounted=""
    for f in $(versioned); do mounted=$f; done
    [ -n "$mounted" ] || mounted="$VGPU/libvgpu.so"
    if is_ours "$mounted"; then
        say "HAMi mounts $mounted: hami-preload"
        st=0
    elif [ -f "$mounted" ]; then
        say "HAMi mounts $mounted: HAMi-core"
        st=2
    else
        say "HAMi mounts $mounted: missing"
        st=2
    fi
    say "ld.so.preload: $(cat "$VGPU/ld.so.preload" 2>/dev/null || echo missing)"
    return $st
}

case "$MODE" in
    install) do_install ;;
    rollback)
        do_rollback
        if [ "$HOLD" = 1 ]; then
            trap 'exit 0' TERM INT
            while :; do sleep 3600 & wait $!; done
        fi
        ;;
    status) do_status; exit $? ;;
    gc)
        [ -n "$POD_LOGS" ] || die "gc needs --pod-logs"
        do_gc
        ;;
    watch)
        trap 'exit 0' TERM INT
        # A look every CHECK_MS (a sleep that takes no fractions: every second), a full pass
        # when the look finds a change and every INTERVAL seconds whatever it finds.
        tick=$((CHECK_MS / 1000)).$(printf '%03d' $((CHECK_MS % 1000)))
        if ! sleep 0.001 2>/dev/null; then
            CHECK_MS=$(( (CHECK_MS + 999) / 1000 * 1000 ))
            tick=$((CHECK_MS / 1000))
        fi
        per_pass=$((INTERVAL * 1000 / CHECK_MS))
        [ "$per_pass" -ge 1 ] || per_pass=1
        say "watching $VGPU: a look every ${tick}s, a full pass when it finds a change and every ${INTERVAL}s"
        left=0
        stuck=0
        while :; do
            if [ "$left" -le 0 ] || { [ "$stuck" = 0 ] && ! looks_installed; }; then
                # A failed pass (the folder not there yet) is retried, never fatal.
                (do_install) || true
                (do_gc) || true
                left=$per_pass
                WATCHED=1
                # A folder that a pass does not put right (a refused install) waits for the
                # next full pass instead of one pass per look.
                if looks_installed; then stuck=0; else stuck=1; fi
            fi
            sleep "$tick" & wait $!
            left=$((left - 1))
        done
        ;;
    *) die "unknown mode '$MODE' (install, rollback, status, watch, gc)" ;;
esac
