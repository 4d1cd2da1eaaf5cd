//! The shell and C programs `hami_swap_interop.rs` runs, beside it.

/// The mount namespace + chroot runner (ours; HAMi's commands run inside it unmodified).
pub(super) const NS_SCRIPT: &str = r#"set -eu
for d in bin sbin lib lib32 lib64 libx32; do
    if [ -d "/$d" ] && [ ! -L "/$d" ]; then
        mount --bind "/$d" "$ROOT/$d"; mount -o remount,bind,ro "$ROOT/$d"
    fi
done
mount --bind /usr "$ROOT/usr"
mount -o remount,bind,ro "$ROOT/usr"
mount -t tmpfs -o size=1m,mode=0755 hami-rs-test "$ROOT/usr/local"
mkdir "$ROOT/usr/local/vgpu"
mount --bind /proc "$ROOT/proc"
mount --bind /dev "$ROOT/dev"
case "$STEP" in
device-plugin)
    mount --bind "$HOSTV" "$ROOT/usr/local/vgpu"
    mount --bind "$IMAGE" "$ROOT/k8s-vgpu"
    mount -o remount,bind,ro "$ROOT/k8s-vgpu"
    ;;
image-build)
    mount --bind "$IMAGE" "$ROOT/k8s-vgpu"
    ;;
container)
    : > "$ROOT/usr/local/vgpu/libvgpu.so"
    mount --bind "$LIBSRC" "$ROOT/usr/local/vgpu/libvgpu.so"
    mount -o remount,bind,ro "$ROOT/usr/local/vgpu/libvgpu.so"
    mount --bind "$PRE" "$ROOT/etc/ld.so.preload"
    mount -o remount,bind,ro "$ROOT/etc/ld.so.preload"
    ;;
*) echo "unknown step $STEP" >&2; exit 1 ;;
esac
exec env -i PATH=/k8s-vgpu/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    chroot "$ROOT" "$@"
"#;

/// The container's process: maps the library, re-reads it, answers each stdin line with its
/// state, exits at EOF.
pub(super) const MAPPER_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t fnv(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    return h;
}

/* One byte of every page, and the last: cheap enough to run every few milliseconds, and a
   read of a page past the end of a truncated file is a SIGBUS. */
static uint64_t pages(const volatile unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i += 4096) { h ^= p[i]; h *= 1099511628211ULL; }
    if (n) { h ^= p[n - 1]; h *= 1099511628211ULL; }
    return h;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *path = argv[1];
    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); return 2; }
    struct stat st;
    if (fstat(fd, &st) != 0) { perror("fstat"); return 2; }
    size_t n = (size_t)st.st_size;
    unsigned char *m = mmap(NULL, n, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 2; }
    uint64_t h0 = fnv(m, n);
    /* The loader's own mapping of the preloaded library (another address than ours). */
    unsigned long preloaded = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b, off, ino; char perms[8], dev[32], p[512] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %31s %lu %511s", &a, &b, perms, &off, dev, &ino, p) == 7
            && strcmp(p, path) == 0 && (a > (unsigned long)m + n || b <= (unsigned long)m)) {
            preloaded = ino;
            break;
        }
    }
    if (f) fclose(f);
    printf("mapped ino=%lu size=%zu sum=%016llx preloaded=%lu mtime=%ld.%09ld\n",
           (unsigned long)st.st_ino, n, (unsigned long long)h0, preloaded,
           (long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    fflush(stdout);
    unsigned long changes = 0;
    uint64_t p0 = pages(m, n);
    for (;;) {
        struct pollfd pf = { 0, POLLIN, 0 };
        int r = poll(&pf, 1, 5);
        if (pages(m, n) != p0) changes++;
        if (r > 0) {
            char b[256];
            ssize_t k = read(0, b, sizeof b);
            struct stat now;
            fstat(fd, &now);
            printf("state sum=%016llx changes=%lu ino=%lu mtime=%ld.%09ld size=%lld\n",
                   (unsigned long long)fnv(m, n), changes, (unsigned long)now.st_ino,
                   (long)now.st_mtim.tv_sec, now.st_mtim.tv_nsec, (long long)now.st_size);
            fflush(stdout);
            if (k <= 0) return 0;
        }
    }
}
"#;
