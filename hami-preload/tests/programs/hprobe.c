/* hprobe: drives the CUDA driver API the three ways programs reach it, for hami-preload's
 * integration tests. Usage: hprobe [--via direct|dlsym|procaddr] [--no-ctx] OP...
 * Every OP prints one line "OP rc=N ..." on stdout (flushed).
 *
 * OPs: alloc SIZE | pitch W H | managed SIZE | async SIZE | asyncptsz SIZE | pool SIZE | poolptsz SIZE |
 *      create SIZE | hostcreate SIZE | array W H | array3d W H D | free [PTR] |
 *      freeasync | release | destroy | info | total | nullalloc | nullinfo | nulltotal |
 *      freeunknown | nullinfo2 (both out pointers NULL) | freezero (cuMemFree(0)) |
 *      createdev DEV SIZE (cuMemCreate located on device DEV) |
 *      racefree N SIZE (N allocations of SIZE, each freed by a second thread while this one
 *      goes on allocating; that thread also frees an unknown pointer and each pointer twice) |
 *      doublefree N SIZE (N rounds: allocate, then two threads free the pointer at once) |
 *      fill CHUNK (alloc until refused, prints total) | sleep MS |
 *      fork OP... (child runs the rest, parent waits) | exit CODE | loop N SIZE |
 *      ctxcreate (cuCtxCreate_v2 on device 0) | ctxretain (primary context of device 0, not
 *      made current) | ctxcur (cuCtxGetCurrent) | ctxpop (cuCtxPopCurrent_v2); these print
 *      ctx=POINTER and always call the exports directly |
 *      ctxrace free|alloc ptr|array destroy|release|reset (a context torn down while a second
 *      thread's release of one of its objects, or allocation in it, is inside the driver: the
 *      context is a created one (destroy: cuCtxDestroy_v2) or the primary one of device 0
 *      (release: cuDevicePrimaryCtxRelease_v2, then retained again and made current; reset:
 *      cuDevicePrimaryCtxReset_v2); the object a 64M pointer or a 1024x1024 float4 array. The
 *      teardown comes half of FAKE_CUDA_RELEASE_DELAY_MS / FAKE_CUDA_ALLOC_DELAY_MS after the
 *      thread is about to make its call; prints rc= of the teardown and op= of the thread's
 *      call).
 * SIZE accepts K/M/G suffixes. The last pointer/handle/array allocated is the default
 * argument of the release ops. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { size_t w, h; unsigned fmt, ch; } AD;
typedef struct { size_t w, h, d; unsigned fmt, ch, flags; } AD3;
typedef struct { unsigned type, htypes; struct { unsigned type; int id; } loc; void *win32; unsigned char flags[8]; } Prop;

/* Direct-link declarations (resolved by the dynamic linker: the preload's exports win). */
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuCtxCreate_v2(void **, unsigned, int);
CUresult cuCtxGetCurrent(void **);
CUresult cuCtxPopCurrent_v2(void **);
CUresult cuCtxDestroy_v2(void *);
CUresult cuDevicePrimaryCtxRelease_v2(int);
CUresult cuDevicePrimaryCtxReset_v2(int);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, void *);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, void *);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, void *, void *);
CUresult cuDeviceGetDefaultMemPool(void **, int);
CUresult cuMemCreate(unsigned long long *, size_t, const Prop *, unsigned long long);
CUresult cuArrayCreate_v2(void **, const AD *);
CUresult cuArray3DCreate_v2(void **, const AD3 *);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
CUresult cuMemRelease(unsigned long long);
CUresult cuArrayDestroy(void *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, int);

enum { ALLOC, PITCH, MANAGED, ASYNC, ASYNCPTSZ, POOLALLOC, POOLGET, CREATE, ARRAY, ARRAY3D, FREE, FREEASYNC, RELEASE, DESTROY, INFO, TOTAL, POOLPTSZ, NFN };
static void *fn[NFN];
static const char *dl_names[NFN] = {"cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuDeviceGetDefaultMemPool", "cuMemCreate", "cuArrayCreate_v2", "cuArray3DCreate_v2", "cuMemFree_v2", "cuMemFreeAsync", "cuMemRelease", "cuArrayDestroy", "cuMemGetInfo_v2", "cuDeviceTotalMem_v2", "cuMemAllocFromPoolAsync_ptsz"};
/* cuGetProcAddress: base name, version, flags (2 = per-thread default stream). */
static const char *pa_names[NFN] = {"cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuDeviceGetDefaultMemPool", "cuMemCreate", "cuArrayCreate", "cuArray3DCreate", "cuMemFree", "cuMemFreeAsync", "cuMemRelease", "cuArrayDestroy", "cuMemGetInfo", "cuDeviceTotalMem", "cuMemAllocFromPoolAsync"};
static const unsigned long long pa_flags[NFN] = {[ASYNCPTSZ] = 2, [POOLPTSZ] = 2};

static unsigned long long parse_size(const char *s) {
    char *end;
    unsigned long long n = strtoull(s, &end, 0);
    switch (*end) {
    case 'k': case 'K': return n << 10;
    case 'm': case 'M': return n << 20;
    case 'g': case 'G': return n << 30;
    }
    return n;
}

static CUdeviceptr last_ptr;
static unsigned long long last_handle;
static void *last_array;

#define CALL(T, i, ...) ((T)fn[i])(__VA_ARGS__)
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);

/* racefree: a ring of pointers the allocating thread hands to the freeing thread. */
#define RING 64
static CUdeviceptr ring[RING];
static long ring_head, ring_tail, ring_done;
static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_cv = PTHREAD_COND_INITIALIZER;
static long race_freed, race_free_failed, race_double_ok, race_unknown_ok;

static void *race_freer(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&ring_mu);
        while (ring_head == ring_tail && !ring_done) pthread_cond_wait(&ring_cv, &ring_mu);
        if (ring_head == ring_tail && ring_done) { pthread_mutex_unlock(&ring_mu); return NULL; }
        CUdeviceptr p = ring[ring_tail++ % RING];
        pthread_cond_broadcast(&ring_cv);
        pthread_mutex_unlock(&ring_mu);
        if (CALL(CUresult(*)(CUdeviceptr), FREE, p) == 0) race_freed++; else race_free_failed++;
        /* Again: a double free, or, if the driver has meanwhile handed the address to the
         * allocating thread, the free of that live allocation (whose own free, later in the
         * ring, is then the double one). Either way each allocation is freed once. */
        if (CALL(CUresult(*)(CUdeviceptr), FREE, p) == 0) race_double_ok++;
        if (CALL(CUresult(*)(CUdeviceptr), FREE, 0xdead0000ULL) == 0) race_unknown_ok++;
    }
}

/* doublefree: two threads free the same pointer at the same moment, each round. */
static pthread_barrier_t dbl_start, dbl_end;
static CUdeviceptr dbl_ptr;
static long dbl_rounds, dbl_ok[2];

static void *dbl_freer(void *arg) {
    long me = (long)arg;
    for (long k = 0; k < dbl_rounds; k++) {
        pthread_barrier_wait(&dbl_start);
        if (CALL(CUresult(*)(CUdeviceptr), FREE, dbl_ptr) == 0) dbl_ok[me]++;
        pthread_barrier_wait(&dbl_end);
    }
    return NULL;
}

/* ctxrace: the second thread's call, in context race_ctx. */
static void *race_ctx;
static int race_alloc, race_array;
static CUresult race_rc;
static CUdeviceptr race_ptr;
static void *race_arr;
static int race_go;
static pthread_mutex_t race_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t race_cv = PTHREAD_COND_INITIALIZER;

static void *ctx_racer(void *arg) {
    (void)arg;
    cuCtxSetCurrent(race_ctx);
    pthread_mutex_lock(&race_mu);
    race_go = 1;
    pthread_cond_broadcast(&race_cv);
    pthread_mutex_unlock(&race_mu);
    if (race_alloc && race_array) {
        AD d = {1024, 1024, 0x20, 4};
        race_rc = CALL(CUresult(*)(void **, const AD *), ARRAY, &race_arr, &d);
    } else if (race_alloc) {
        race_rc = CALL(alloc_t, ALLOC, &race_ptr, 64ULL << 20);
    } else if (race_array) {
        race_rc = CALL(CUresult(*)(void *), DESTROY, race_arr);
    } else {
        race_rc = CALL(CUresult(*)(CUdeviceptr), FREE, race_ptr);
    }
    return NULL;
}

static long env_ms(const char *name) {
    const char *v = getenv(name);
    return v && *v ? atol(v) : 200;
}

static int run(int argc, char **argv, int i) {
    for (; i < argc; i++) {
        const char *op = argv[i];
        CUresult r;
        if (!strcmp(op, "alloc")) {
            CUdeviceptr p = 0;
            r = CALL(alloc_t, ALLOC, &p, parse_size(argv[++i]));
            if (!r) last_ptr = p;
            printf("alloc rc=%d ptr=0x%llx\n", r, p);
        } else if (!strcmp(op, "pitch")) {
            CUdeviceptr p = 0; size_t pitch = 0;
            size_t w = parse_size(argv[++i]), h = parse_size(argv[++i]);
            r = CALL(CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned), PITCH, &p, &pitch, w, h, 4);
            if (!r) last_ptr = p;
            printf("pitch rc=%d ptr=0x%llx pitch=%zu\n", r, p, pitch);
        } else if (!strcmp(op, "managed")) {
            CUdeviceptr p = 0;
            r = CALL(CUresult(*)(CUdeviceptr *, size_t, unsigned), MANAGED, &p, parse_size(argv[++i]), 1);
            if (!r) last_ptr = p;
            printf("managed rc=%d ptr=0x%llx\n", r, p);
        } else if (!strcmp(op, "async") || !strcmp(op, "asyncptsz")) {
            CUdeviceptr p = 0;
            int k = !strcmp(op, "async") ? ASYNC : ASYNCPTSZ;
            r = CALL(CUresult(*)(CUdeviceptr *, size_t, void *), k, &p, parse_size(argv[++i]), NULL);
            if (!r) last_ptr = p;
            printf("%s rc=%d ptr=0x%llx\n", op, r, p);
        } else if (!strcmp(op, "pool") || !strcmp(op, "poolptsz")) {
            CUdeviceptr p = 0; void *pool = NULL;
            int k = !strcmp(op, "pool") ? POOLALLOC : POOLPTSZ;
            r = CALL(CUresult(*)(void **, int), POOLGET, &pool, 0);
            if (!r) r = CALL(CUresult(*)(CUdeviceptr *, size_t, void *, void *), k, &p, parse_size(argv[++i]), pool, NULL);
            else i++;
            if (!r) last_ptr = p;
            printf("%s rc=%d ptr=0x%llx\n", op, r, p);
        } else if (!strcmp(op, "create") || !strcmp(op, "hostcreate")) {
            Prop prop; memset(&prop, 0, sizeof prop);
            prop.type = 1; /* PINNED */
            prop.loc.type = !strcmp(op, "create") ? 1 : 2; /* DEVICE : HOST */
            prop.loc.id = 0;
            unsigned long long h = 0;
            r = CALL(CUresult(*)(unsigned long long *, size_t, const Prop *, unsigned long long), CREATE, &h, parse_size(argv[++i]), &prop, 0);
            if (!r) last_handle = h;
            printf("%s rc=%d handle=0x%llx\n", op, r, h);
        } else if (!strcmp(op, "array")) {
            AD d = {parse_size(argv[i + 1]), parse_size(argv[i + 2]), 0x20, 4};
            i += 2;
            void *a = NULL;
            r = CALL(CUresult(*)(void **, const AD *), ARRAY, &a, &d);
            if (!r) last_array = a;
            printf("array rc=%d\n", r);
        } else if (!strcmp(op, "array3d")) {
            AD3 d = {parse_size(argv[i + 1]), parse_size(argv[i + 2]), parse_size(argv[i + 3]), 0x20, 4, 0};
            i += 3;
            void *a = NULL;
            r = CALL(CUresult(*)(void **, const AD3 *), ARRAY3D, &a, &d);
            if (!r) last_array = a;
            printf("array3d rc=%d\n", r);
        } else if (!strcmp(op, "free")) {
            r = CALL(CUresult(*)(CUdeviceptr), FREE, last_ptr);
            printf("free rc=%d\n", r);
        } else if (!strcmp(op, "freeunknown")) {
            r = CALL(CUresult(*)(CUdeviceptr), FREE, 0xdead0000ULL);
            printf("freeunknown rc=%d\n", r);
        } else if (!strcmp(op, "freeasync")) {
            r = CALL(CUresult(*)(CUdeviceptr, void *), FREEASYNC, last_ptr, NULL);
            printf("freeasync rc=%d\n", r);
        } else if (!strcmp(op, "release")) {
            r = CALL(CUresult(*)(unsigned long long), RELEASE, last_handle);
            printf("release rc=%d\n", r);
        } else if (!strcmp(op, "destroy")) {
            r = CALL(CUresult(*)(void *), DESTROY, last_array);
            printf("destroy rc=%d\n", r);
        } else if (!strcmp(op, "info")) {
            size_t f = 0, t = 0;
            r = CALL(CUresult(*)(size_t *, size_t *), INFO, &f, &t);
            printf("info rc=%d free=%zu total=%zu\n", r, f, t);
        } else if (!strcmp(op, "total")) {
            size_t t = 0;
            r = CALL(CUresult(*)(size_t *, int), TOTAL, &t, 0);
            printf("total rc=%d total=%zu\n", r, t);
        } else if (!strcmp(op, "nullalloc")) {
            printf("nullalloc rc=%d\n", CALL(alloc_t, ALLOC, NULL, 1024));
        } else if (!strcmp(op, "nullinfo")) {
            size_t t;
            printf("nullinfo rc=%d\n", CALL(CUresult(*)(size_t *, size_t *), INFO, NULL, &t));
        } else if (!strcmp(op, "nulltotal")) {
            printf("nulltotal rc=%d\n", CALL(CUresult(*)(size_t *, int), TOTAL, NULL, 0));
        } else if (!strcmp(op, "nullinfo2")) {
            printf("nullinfo2 rc=%d\n", CALL(CUresult(*)(size_t *, size_t *), INFO, NULL, NULL));
        } else if (!strcmp(op, "freezero")) {
            printf("freezero rc=%d\n", CALL(CUresult(*)(CUdeviceptr), FREE, 0ULL));
        } else if (!strcmp(op, "createdev")) {
            Prop prop; memset(&prop, 0, sizeof prop);
            prop.type = 1; /* PINNED */
            prop.loc.type = 1; /* DEVICE */
            prop.loc.id = atoi(argv[++i]);
            unsigned long long h = 0;
            r = CALL(CUresult(*)(unsigned long long *, size_t, const Prop *, unsigned long long), CREATE, &h, parse_size(argv[++i]), &prop, 0);
            if (!r) last_handle = h;
            printf("createdev rc=%d handle=0x%llx\n", r, h);
        } else if (!strcmp(op, "racefree")) {
            long n = atol(argv[++i]);
            unsigned long long size = parse_size(argv[++i]);
            long refused = 0, failed = 0;
            pthread_t t;
            ring_head = ring_tail = ring_done = 0;
            pthread_create(&t, NULL, race_freer, NULL);
            for (long k = 0; k < n; k++) {
                CUdeviceptr p = 0;
                r = CALL(alloc_t, ALLOC, &p, size);
                if (r == 2) { refused++; continue; }
                if (r) { failed++; continue; }
                pthread_mutex_lock(&ring_mu);
                while (ring_head - ring_tail == RING) pthread_cond_wait(&ring_cv, &ring_mu);
                ring[ring_head++ % RING] = p;
                pthread_cond_broadcast(&ring_cv);
                pthread_mutex_unlock(&ring_mu);
            }
            pthread_mutex_lock(&ring_mu);
            ring_done = 1;
            pthread_cond_broadcast(&ring_cv);
            pthread_mutex_unlock(&ring_mu);
            pthread_join(t, NULL);
            printf("racefree rc=%d allocated=%ld refused=%ld failed=%ld freed=%ld free_failed=%ld double_ok=%ld unknown_ok=%ld\n",
                   failed ? 1 : 0, n - refused - failed, refused, failed, race_freed, race_free_failed, race_double_ok, race_unknown_ok);
        } else if (!strcmp(op, "doublefree")) {
            dbl_rounds = atol(argv[++i]);
            unsigned long long size = parse_size(argv[++i]);
            long failed = 0;
            pthread_t t[2];
            pthread_barrier_init(&dbl_start, NULL, 3);
            pthread_barrier_init(&dbl_end, NULL, 3);
            for (long k = 0; k < 2; k++) pthread_create(&t[k], NULL, dbl_freer, (void *)k);
            for (long k = 0; k < dbl_rounds; k++) {
                if (CALL(alloc_t, ALLOC, &dbl_ptr, size)) { failed++; dbl_ptr = 0xdead0000ULL; }
                pthread_barrier_wait(&dbl_start);
                pthread_barrier_wait(&dbl_end);
            }
            for (long k = 0; k < 2; k++) pthread_join(t[k], NULL);
            printf("doublefree rc=%d rounds=%ld freed=%ld\n", failed ? 1 : 0, dbl_rounds, dbl_ok[0] + dbl_ok[1]);
        } else if (!strcmp(op, "fill")) {
            unsigned long long chunk = parse_size(argv[++i]), got = 0;
            CUdeviceptr p;
            while ((r = CALL(alloc_t, ALLOC, &p, chunk)) == 0) got += chunk;
            printf("fill rc=%d bytes=%llu\n", r, got);
        } else if (!strcmp(op, "loop")) {
            long n = atol(argv[++i]);
            unsigned long long size = parse_size(argv[++i]);
            int fails = 0;
            for (long k = 0; k < n; k++) {
                CUdeviceptr p;
                if (CALL(alloc_t, ALLOC, &p, size) == 0) CALL(CUresult(*)(CUdeviceptr), FREE, p);
                else fails++;
            }
            printf("loop rc=0 refused=%d\n", fails);
        } else if (!strcmp(op, "ctxcreate") || !strcmp(op, "ctxretain") || !strcmp(op, "ctxcur") ||
                   !strcmp(op, "ctxpop")) {
            void *c = NULL;
            r = cuInit(0);
            if (!r) {
                if (!strcmp(op, "ctxcreate")) r = cuCtxCreate_v2(&c, 0, 0);
                else if (!strcmp(op, "ctxretain")) r = cuDevicePrimaryCtxRetain(&c, 0);
                else if (!strcmp(op, "ctxcur")) r = cuCtxGetCurrent(&c);
                else r = cuCtxPopCurrent_v2(&c);
            }
            printf("%s rc=%d ctx=%p\n", op, r, c);
        } else if (!strcmp(op, "ctxrace")) {
            race_alloc = !strcmp(argv[++i], "alloc");
            race_array = !strcmp(argv[++i], "array");
            const char *how = argv[++i];
            int primary = strcmp(how, "destroy") != 0;
            r = primary ? cuCtxGetCurrent(&race_ctx) : cuCtxCreate_v2(&race_ctx, 0, 0);
            if (!r && !race_alloc && race_array) {
                AD d = {1024, 1024, 0x20, 4};
                r = CALL(CUresult(*)(void **, const AD *), ARRAY, &race_arr, &d);
            } else if (!r && !race_alloc) {
                r = CALL(alloc_t, ALLOC, &race_ptr, 64ULL << 20);
            }
            if (r) {
                printf("ctxrace rc=%d stage=setup\n", r);
                fflush(stdout);
                continue;
            }
            pthread_t t;
            long ms = env_ms(race_alloc ? "FAKE_CUDA_ALLOC_DELAY_MS" : "FAKE_CUDA_RELEASE_DELAY_MS");
            race_go = 0;
            pthread_create(&t, NULL, ctx_racer, NULL);
            pthread_mutex_lock(&race_mu);
            while (!race_go) pthread_cond_wait(&race_cv, &race_mu);
            pthread_mutex_unlock(&race_mu);
            usleep(ms * 500);
            if (!strcmp(how, "destroy")) r = cuCtxDestroy_v2(race_ctx);
            else if (!strcmp(how, "release")) r = cuDevicePrimaryCtxRelease_v2(0);
            else r = cuDevicePrimaryCtxReset_v2(0);
            pthread_join(t, NULL);
            if (!r && !strcmp(how, "release")) {
                void *c = NULL;
                CUresult r2 = cuDevicePrimaryCtxRetain(&c, 0);
                if (!r2) r2 = cuCtxSetCurrent(c);
                if (r2) r = r2;
            }
            printf("ctxrace rc=%d op=%d\n", r, race_rc);
        } else if (!strcmp(op, "sleep")) {
            usleep(atoi(argv[++i]) * 1000);
            printf("sleep rc=0\n");
        } else if (!strcmp(op, "fork")) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                run(argc, argv, i + 1);
                fflush(stdout);
                exit(0);
            }
            int st;
            waitpid(pid, &st, 0);
            printf("fork rc=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            return 0;
        } else if (!strcmp(op, "exit")) {
            fflush(stdout);
            _exit(atoi(argv[++i]));
        } else {
            fprintf(stderr, "unknown op %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *via = "direct";
    int i = 1, ctx = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--via")) via = argv[++i];
        else if (!strcmp(argv[i], "--no-ctx")) ctx = 0;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
    if (!strcmp(via, "direct")) {
        void *d[NFN] = {cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged, cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemAllocFromPoolAsync, cuDeviceGetDefaultMemPool, cuMemCreate, cuArrayCreate_v2, cuArray3DCreate_v2, cuMemFree_v2, cuMemFreeAsync, cuMemRelease, cuArrayDestroy, cuMemGetInfo_v2, cuDeviceTotalMem_v2, cuMemAllocFromPoolAsync_ptsz};
        memcpy(fn, d, sizeof d);
    } else if (!strcmp(via, "dlsym")) {
        for (int k = 0; k < NFN; k++) fn[k] = dlsym(h, dl_names[k]);
    } else {
        CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(h, "cuGetProcAddress_v2");
        for (int k = 0; k < NFN; k++) {
            int st = 0;
            if (gpa(pa_names[k], &fn[k], 12000, pa_flags[k], &st)) fn[k] = NULL;
        }
    }
    for (int k = 0; k < NFN; k++)
        if (!fn[k]) { fprintf(stderr, "missing %s\n", dl_names[k]); return 4; }
    if (ctx) {
        void *c;
        CUresult r = cuInit(0);
        if (!r) r = cuDevicePrimaryCtxRetain(&c, 0);
        if (!r) r = cuCtxSetCurrent(c);
        if (r) { fprintf(stderr, "init failed %d\n", r); return 5; }
    }
    return run(argc, argv, i);
}
