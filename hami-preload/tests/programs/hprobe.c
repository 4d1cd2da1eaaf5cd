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
 *      fill CHUNK (alloc until refused, prints total) | sleep MS | touch PATH | waitfile PATH |
 *      fork OP... (child runs the rest, parent waits) | exit CODE | loop N SIZE |
 *      ctxcreate (cuCtxCreate_v2 on device 0) | ctxretain (primary context of device 0, not
 *      made current) | ctxcur (cuCtxGetCurrent) | ctxpop (cuCtxPopCurrent_v2); these print
 *      ctx=POINTER and always call the exports directly |
 *      ctxrace free|alloc ptr|array destroy|release|reset (a context torn down while a second
 *      thread's release of one of its objects, or allocation in it, is inside the driver: the
 *      context is a created one (destroy: cuCtxDestroy_v2) or the primary one of device 0
 *      (release: cuDevicePrimaryCtxRelease_v2, then retained again and made current; reset:
 *      cuDevicePrimaryCtxReset_v2); the object a 64M pointer or a 1024x1024 float4 array. With
 *      the fake's gate FAKE_CUDA_RELEASE_GATE / FAKE_CUDA_ALLOC_GATE=PATH, the teardown comes
 *      once the thread's call is held inside the driver (PATH.inside exists; at most 60 s),
 *      then PATH.go lets the call go on, and inside=1 is printed (0: the call never got
 *      there); without it, half of FAKE_CUDA_RELEASE_DELAY_MS / FAKE_CUDA_ALLOC_DELAY_MS after
 *      the thread is about to make its call; prints rc= of the teardown and op= of the
 *      thread's call).
 *      call SYMBOL ARG... (any hooked CUDA function that allocates or releases, called by its
 *      row's Shape, see call_row; prints rc=, sym= and key=, the object made or released) |
 *      fns (one line per function of the tables, "fn rc=0 name= sym= lib= off=": what --via
 *      reaches, as dladdr names it: symbol, library, offset in the library).
 * SIZE accepts K/M/G suffixes. The last pointer/handle/array/mipmapped array allocated is the
 * default argument of the release ops.
 *
 * The function tables (hp_fns: name, cuGetProcAddress base name and flags, Shape, memory,
 * key space; hp_direct: the direct calls; indices F_<symbol>) are hprobe_fns.h, generated
 * from hami_abi::intercept::INTERCEPTS by the tests
 * (hami-preload/tests/preload/support/header.rs).
 * Each function is looked up the --via way on its first use; one that cannot be found exits
 * with 4 ("missing SYMBOL"). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The types and prototypes: hami_cuda.h (<cuda.h> where it exists), every function under the
 * name of its symbol (what hprobe calls by name is resolved by the dynamic linker: the
 * preload's exports win). */
#define HAMI_CUDA_ABI_NAMES
#include "hami_cuda.h"

/* A function-pointer type, from the function's prototype. */
#define FN(sym) __typeof__(&sym)

#include "hprobe_fns.h"

/* The functions of the named ops. */
#define ALLOC F_cuMemAlloc_v2
#define PITCH F_cuMemAllocPitch_v2
#define MANAGED F_cuMemAllocManaged
#define ASYNC F_cuMemAllocAsync
#define ASYNCPTSZ F_cuMemAllocAsync_ptsz
#define POOLALLOC F_cuMemAllocFromPoolAsync
#define POOLPTSZ F_cuMemAllocFromPoolAsync_ptsz
#define POOLGET F_cuDeviceGetDefaultMemPool
#define CREATE F_cuMemCreate
#define ARRAY F_cuArrayCreate_v2
#define ARRAY3D F_cuArray3DCreate_v2
#define FREE F_cuMemFree_v2
#define FREEASYNC F_cuMemFreeAsync
#define RELEASE F_cuMemRelease
#define DESTROY F_cuArrayDestroy
#define INFO F_cuMemGetInfo_v2
#define TOTAL F_cuDeviceTotalMem_v2

static const char *via = "direct";
static void *lib;
static FN(cuGetProcAddress_v2) gpa;
static void *fn[NFN];

/* Function k reached the --via way, or NULL. cuGetProcAddress: at the highest CUDA version
 * (from the driver's own down, by 10) at which the base name gives the function of that name
 * (dladdr): a row that is an older variant (cuCtxCreate_v2) is what older versions get. */
static void *resolve(int k) {
    if (!strcmp(via, "direct")) return (void *)hp_direct[k];
    if (!strcmp(via, "dlsym")) return dlsym(lib, hp_fns[k].name);
    int top = 0;
    if (!gpa || cuDriverGetVersion(&top)) return NULL;
    for (int v = top; v >= 1000; v -= 10) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = 0;
        Dl_info d;
        if (gpa(hp_fns[k].pa_name, &p, v, hp_fns[k].pa_flags, &st)) continue;
        if (!p) {
            if (st) break; /* not found, or older than its first version */
            continue;
        }
        if (dladdr(p, &d) && d.dli_sname && !strcmp(d.dli_sname, hp_fns[k].name)) return p;
    }
    return NULL;
}

/* Function k, looked up on first use (threads may race to it: both find the same). */
static void *get(int k) {
    void *p = __atomic_load_n(&fn[k], __ATOMIC_ACQUIRE);
    if (!p) {
        p = resolve(k);
        if (!p) {
            fflush(stdout);
            fprintf(stderr, "missing %s (--via %s)\n", hp_fns[k].name, via);
            _exit(4);
        }
        __atomic_store_n(&fn[k], p, __ATOMIC_RELEASE);
    }
    return p;
}

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

/* The last object made in each key space. */
static unsigned long long last[HP_NSPACES];
#define last_ptr last[HP_SPACE_POINTER]
#define last_handle last[HP_SPACE_HANDLE]
#define last_array last[HP_SPACE_ARRAY]

#define CALL(T, i, ...) ((T)get(i))(__VA_ARGS__)

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
        if (CALL(FN(cuMemFree_v2), FREE, p) == 0) race_freed++; else race_free_failed++;
        /* Again: a double free, or, if the driver has meanwhile handed the address to the
         * allocating thread, the free of that live allocation (whose own free, later in the
         * ring, is then the double one). Either way each allocation is freed once. */
        if (CALL(FN(cuMemFree_v2), FREE, p) == 0) race_double_ok++;
        if (CALL(FN(cuMemFree_v2), FREE, 0xdead0000ULL) == 0) race_unknown_ok++;
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
        if (CALL(FN(cuMemFree_v2), FREE, dbl_ptr) == 0) dbl_ok[me]++;
        pthread_barrier_wait(&dbl_end);
    }
    return NULL;
}

/* ctxrace: the second thread's call, in context race_ctx. */
static CUcontext race_ctx;
static int race_alloc, race_array;
static CUresult race_rc;
static CUdeviceptr race_ptr;
static CUarray race_arr;
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
        CUDA_ARRAY_DESCRIPTOR d = {1024, 1024, CU_AD_FORMAT_FLOAT, 4};
        race_rc = CALL(FN(cuArrayCreate_v2), ARRAY, &race_arr, &d);
    } else if (race_alloc) {
        race_rc = CALL(FN(cuMemAlloc_v2), ALLOC, &race_ptr, 64ULL << 20);
    } else if (race_array) {
        race_rc = CALL(FN(cuArrayDestroy), DESTROY, race_arr);
    } else {
        race_rc = CALL(FN(cuMemFree_v2), FREE, race_ptr);
    }
    return NULL;
}

static long env_ms(const char *name) {
    const char *v = getenv(name);
    return v && *v ? atol(v) : 200;
}

/* Creates the empty file PATH; 0 if it could. */
static int touch_path(const char *path) {
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    return f ? 0 : 1;
}

/* Waits until PATH exists, at most MS milliseconds; 0 if it does. */
static int wait_path(const char *path, long ms) {
    for (long waited = 0; access(path, F_OK) != 0 && waited < ms; waited++) usleep(1000);
    return access(path, F_OK) == 0 ? 0 : 1;
}

typedef unsigned long long u64;
/* `call` passes every function 8 integer-class arguments: the ABIs hprobe runs on (x86-64
 * System V, AAPCS64) pass them in registers and caller-cleaned stack slots, so a function
 * taking fewer ignores the rest (which are 0 unless given). */
typedef CUresult (*call8_t)(u64, u64, u64, u64, u64, u64, u64, u64);

/* An argument of `call`: starts with a digit or '@' (an op name never does). */
static int is_call_arg(const char *s) { return (*s >= '0' && *s <= '9') || *s == '@'; }

/* A number (K/M/G suffixes), @pool (device 0's default memory pool, looked up the --via
 * way) or @last (the last object of the key space of row k). */
static u64 call_arg(const char *s, int k) {
    if (!strcmp(s, "@pool")) {
        CUmemoryPool pool = NULL;
        CUresult r = CALL(FN(cuDeviceGetDefaultMemPool), POOLGET, &pool, 0);
        if (r) fprintf(stderr, "@pool: rc=%d\n", r);
        return (uintptr_t)pool;
    }
    if (!strcmp(s, "@last")) return hp_fns[k].space >= 0 ? last[hp_fns[k].space] : 0;
    if (*s == '@') { fprintf(stderr, "call: unknown argument %s\n", s); exit(2); }
    return parse_size(s);
}

/* call SYMBOL ARG...: calls row k with a[0..n) as its Shape says; the first arguments are
 * the shape's, the rest are passed after the shape's own (EXTRA: a flags word, a stream, a
 * pool):
 *   OUT_SIZE   SIZE EXTRA...   f(&key, SIZE, EXTRA...)
 *   PITCH      W H [ELEM=4]    f(&key, &pitch, W, H, ELEM)
 *   MEM_CREATE SIZE EXTRA...   f(&key, SIZE, &prop (pinned, on device 0), EXTRA...)
 *   ARRAY2D    W H             f(&key, &desc (W x H float4))
 *   ARRAY3D    W H D           f(&key, &desc (W x H x D float4))
 *   MIPMAPPED  W H D LEVELS    f(&key, &desc (W x H x D float4), LEVELS)
 *   VALUE      [KEY EXTRA...]  f(KEY, EXTRA...), KEY by default the last object of the row's
 *                              key space
 * An allocation's key becomes the last object of its key space. Returns 2 on a usage error
 * (and prints it), else 0 with the call's line printed. */
static int call_row(int k, const u64 *a, int n) {
    const struct hp_fn *f = &hp_fns[k];
    u64 x[8] = {0}, key = 0;
    size_t pitch = 0;
    CUDA_ARRAY_DESCRIPTOR ad = {0, 0, CU_AD_FORMAT_FLOAT, 4};
    CUDA_ARRAY3D_DESCRIPTOR ad3 = {0, 0, 0, CU_AD_FORMAT_FLOAT, 4, 0};
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    int need, used, at;
    switch (f->shape) {
    case HP_SHAPE_OUT_SIZE:
        need = used = 1, at = 2;
        x[0] = (uintptr_t)&key, x[1] = a[0];
        break;
    case HP_SHAPE_PITCH:
        need = 2, used = n > 2 ? 3 : 2, at = 5;
        x[0] = (uintptr_t)&key, x[1] = (uintptr_t)&pitch, x[2] = a[0], x[3] = a[1];
        x[4] = n > 2 ? a[2] : 4;
        break;
    case HP_SHAPE_MEM_CREATE:
        need = used = 1, at = 3;
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        x[0] = (uintptr_t)&key, x[1] = a[0], x[2] = (uintptr_t)&prop;
        break;
    case HP_SHAPE_ARRAY2D:
        need = used = 2, at = 2;
        ad.Width = a[0], ad.Height = a[1];
        x[0] = (uintptr_t)&key, x[1] = (uintptr_t)&ad;
        break;
    case HP_SHAPE_ARRAY3D:
        need = used = 3, at = 2;
        ad3.Width = a[0], ad3.Height = a[1], ad3.Depth = a[2];
        x[0] = (uintptr_t)&key, x[1] = (uintptr_t)&ad3;
        break;
    case HP_SHAPE_MIPMAPPED:
        need = used = 4, at = 3;
        ad3.Width = a[0], ad3.Height = a[1], ad3.Depth = a[2];
        x[0] = (uintptr_t)&key, x[1] = (uintptr_t)&ad3, x[2] = a[3];
        break;
    case HP_SHAPE_VALUE:
        need = 0, used = n > 0, at = 1;
        key = x[0] = n > 0 ? a[0] : f->space >= 0 ? last[f->space] : 0;
        break;
    default:
        fprintf(stderr, "call: %s is not a row of a shape call knows\n", f->name);
        return 2;
    }
    if (n < need || n - used > 8 - at) {
        fprintf(stderr, "call: %s takes %d to %d arguments, got %d\n", f->name, need, need + 8 - at, n);
        return 2;
    }
    for (int j = used; j < n; j++) x[at + j - used] = a[j];
    CUresult r = ((call8_t)get(k))(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]);
    if (!r && f->memory == HP_MEM_ALLOCATES) last[f->space] = key;
    printf("call rc=%d sym=%s key=0x%llx", r, f->name, key);
    if (f->shape == HP_SHAPE_PITCH) printf(" pitch=%zu", pitch);
    printf("\n");
    return 0;
}

static int run(int argc, char **argv, int i) {
    for (; i < argc; i++) {
        const char *op = argv[i];
        CUresult r;
        if (!strcmp(op, "alloc")) {
            CUdeviceptr p = 0;
            r = CALL(FN(cuMemAlloc_v2), ALLOC, &p, parse_size(argv[++i]));
            if (!r) last_ptr = p;
            printf("alloc rc=%d ptr=0x%llx\n", r, p);
        } else if (!strcmp(op, "pitch")) {
            CUdeviceptr p = 0; size_t pitch = 0;
            size_t w = parse_size(argv[++i]), h = parse_size(argv[++i]);
            r = CALL(FN(cuMemAllocPitch_v2), PITCH, &p, &pitch, w, h, 4);
            if (!r) last_ptr = p;
            printf("pitch rc=%d ptr=0x%llx pitch=%zu\n", r, p, pitch);
        } else if (!strcmp(op, "managed")) {
            CUdeviceptr p = 0;
            r = CALL(FN(cuMemAllocManaged), MANAGED, &p, parse_size(argv[++i]), 1);
            if (!r) last_ptr = p;
            printf("managed rc=%d ptr=0x%llx\n", r, p);
        } else if (!strcmp(op, "async") || !strcmp(op, "asyncptsz")) {
            CUdeviceptr p = 0;
            int k = !strcmp(op, "async") ? ASYNC : ASYNCPTSZ;
            r = CALL(FN(cuMemAllocAsync), k, &p, parse_size(argv[++i]), NULL);
            if (!r) last_ptr = p;
            printf("%s rc=%d ptr=0x%llx\n", op, r, p);
        } else if (!strcmp(op, "pool") || !strcmp(op, "poolptsz")) {
            CUdeviceptr p = 0; CUmemoryPool pool = NULL;
            int k = !strcmp(op, "pool") ? POOLALLOC : POOLPTSZ;
            r = CALL(FN(cuDeviceGetDefaultMemPool), POOLGET, &pool, 0);
            if (!r) r = CALL(FN(cuMemAllocFromPoolAsync), k, &p, parse_size(argv[++i]), pool, NULL);
            else i++;
            if (!r) last_ptr = p;
            printf("%s rc=%d ptr=0x%llx\n", op, r, p);
        } else if (!strcmp(op, "create") || !strcmp(op, "hostcreate")) {
            CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = !strcmp(op, "create") ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
            prop.location.id = 0;
            CUmemGenericAllocationHandle h = 0;
            r = CALL(FN(cuMemCreate), CREATE, &h, parse_size(argv[++i]), &prop, 0);
            if (!r) last_handle = h;
            printf("%s rc=%d handle=0x%llx\n", op, r, h);
        } else if (!strcmp(op, "array")) {
            CUDA_ARRAY_DESCRIPTOR d = {parse_size(argv[i + 1]), parse_size(argv[i + 2]), CU_AD_FORMAT_FLOAT, 4};
            i += 2;
            CUarray a = NULL;
            r = CALL(FN(cuArrayCreate_v2), ARRAY, &a, &d);
            if (!r) last_array = (uintptr_t)a;
            printf("array rc=%d\n", r);
        } else if (!strcmp(op, "array3d")) {
            CUDA_ARRAY3D_DESCRIPTOR d = {parse_size(argv[i + 1]), parse_size(argv[i + 2]), parse_size(argv[i + 3]), CU_AD_FORMAT_FLOAT, 4, 0};
            i += 3;
            CUarray a = NULL;
            r = CALL(FN(cuArray3DCreate_v2), ARRAY3D, &a, &d);
            if (!r) last_array = (uintptr_t)a;
            printf("array3d rc=%d\n", r);
        } else if (!strcmp(op, "free")) {
            r = CALL(FN(cuMemFree_v2), FREE, last_ptr);
            printf("free rc=%d\n", r);
        } else if (!strcmp(op, "freeunknown")) {
            r = CALL(FN(cuMemFree_v2), FREE, 0xdead0000ULL);
            printf("freeunknown rc=%d\n", r);
        } else if (!strcmp(op, "freeasync")) {
            r = CALL(FN(cuMemFreeAsync), FREEASYNC, last_ptr, NULL);
            printf("freeasync rc=%d\n", r);
        } else if (!strcmp(op, "release")) {
            r = CALL(FN(cuMemRelease), RELEASE, last_handle);
            printf("release rc=%d\n", r);
        } else if (!strcmp(op, "destroy")) {
            r = CALL(FN(cuArrayDestroy), DESTROY, (void *)(uintptr_t)last_array);
            printf("destroy rc=%d\n", r);
        } else if (!strcmp(op, "info")) {
            size_t f = 0, t = 0;
            r = CALL(FN(cuMemGetInfo_v2), INFO, &f, &t);
            printf("info rc=%d free=%zu total=%zu\n", r, f, t);
        } else if (!strcmp(op, "total")) {
            size_t t = 0;
            r = CALL(FN(cuDeviceTotalMem_v2), TOTAL, &t, 0);
            printf("total rc=%d total=%zu\n", r, t);
        } else if (!strcmp(op, "nullalloc")) {
            printf("nullalloc rc=%d\n", CALL(FN(cuMemAlloc_v2), ALLOC, NULL, 1024));
        } else if (!strcmp(op, "nullinfo")) {
            size_t t;
            printf("nullinfo rc=%d\n", CALL(FN(cuMemGetInfo_v2), INFO, NULL, &t));
        } else if (!strcmp(op, "nulltotal")) {
            printf("nulltotal rc=%d\n", CALL(FN(cuDeviceTotalMem_v2), TOTAL, NULL, 0));
        } else if (!strcmp(op, "nullinfo2")) {
            printf("nullinfo2 rc=%d\n", CALL(FN(cuMemGetInfo_v2), INFO, NULL, NULL));
        } else if (!strcmp(op, "freezero")) {
            printf("freezero rc=%d\n", CALL(FN(cuMemFree_v2), FREE, 0ULL));
        } else if (!strcmp(op, "createdev")) {
            CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = atoi(argv[++i]);
            CUmemGenericAllocationHandle h = 0;
            r = CALL(FN(cuMemCreate), CREATE, &h, parse_size(argv[++i]), &prop, 0);
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
                r = CALL(FN(cuMemAlloc_v2), ALLOC, &p, size);
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
                if (CALL(FN(cuMemAlloc_v2), ALLOC, &dbl_ptr, size)) { failed++; dbl_ptr = 0xdead0000ULL; }
                pthread_barrier_wait(&dbl_start);
                pthread_barrier_wait(&dbl_end);
            }
            for (long k = 0; k < 2; k++) pthread_join(t[k], NULL);
            printf("doublefree rc=%d rounds=%ld freed=%ld\n", failed ? 1 : 0, dbl_rounds, dbl_ok[0] + dbl_ok[1]);
        } else if (!strcmp(op, "fill")) {
            unsigned long long chunk = parse_size(argv[++i]), got = 0;
            CUdeviceptr p;
            while ((r = CALL(FN(cuMemAlloc_v2), ALLOC, &p, chunk)) == 0) got += chunk;
            printf("fill rc=%d bytes=%llu\n", r, got);
        } else if (!strcmp(op, "loop")) {
            long n = atol(argv[++i]);
            unsigned long long size = parse_size(argv[++i]);
            int fails = 0;
            for (long k = 0; k < n; k++) {
                CUdeviceptr p;
                if (CALL(FN(cuMemAlloc_v2), ALLOC, &p, size) == 0) CALL(FN(cuMemFree_v2), FREE, p);
                else fails++;
            }
            printf("loop rc=0 refused=%d\n", fails);
        } else if (!strcmp(op, "ctxcreate") || !strcmp(op, "ctxretain") || !strcmp(op, "ctxcur") ||
                   !strcmp(op, "ctxpop")) {
            CUcontext c = NULL;
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
                CUDA_ARRAY_DESCRIPTOR d = {1024, 1024, CU_AD_FORMAT_FLOAT, 4};
                r = CALL(FN(cuArrayCreate_v2), ARRAY, &race_arr, &d);
            } else if (!r && !race_alloc) {
                r = CALL(FN(cuMemAlloc_v2), ALLOC, &race_ptr, 64ULL << 20);
            }
            if (r) {
                printf("ctxrace rc=%d stage=setup\n", r);
                fflush(stdout);
                continue;
            }
            pthread_t t;
            const char *gate = getenv(race_alloc ? "FAKE_CUDA_ALLOC_GATE" : "FAKE_CUDA_RELEASE_GATE");
            if (gate && !*gate) gate = NULL;
            long ms = env_ms(race_alloc ? "FAKE_CUDA_ALLOC_DELAY_MS" : "FAKE_CUDA_RELEASE_DELAY_MS");
            char inside[4096], go[4096];
            snprintf(inside, sizeof inside, "%s.inside", gate ? gate : "");
            snprintf(go, sizeof go, "%s.go", gate ? gate : "");
            race_go = 0;
            pthread_create(&t, NULL, ctx_racer, NULL);
            pthread_mutex_lock(&race_mu);
            while (!race_go) pthread_cond_wait(&race_cv, &race_mu);
            pthread_mutex_unlock(&race_mu);
            /* With the gate, the teardown comes once the thread's call is inside the driver
             * (held there until go exists); without it, half the delay after the call. */
            int missed = gate ? wait_path(inside, 60000) : 0;
            if (!gate) usleep(ms * 500);
            if (!strcmp(how, "destroy")) r = cuCtxDestroy_v2(race_ctx);
            else if (!strcmp(how, "release")) r = cuDevicePrimaryCtxRelease_v2(0);
            else r = cuDevicePrimaryCtxReset_v2(0);
            if (gate) touch_path(go);
            pthread_join(t, NULL);
            if (!r && !strcmp(how, "release")) {
                CUcontext c = NULL;
                CUresult r2 = cuDevicePrimaryCtxRetain(&c, 0);
                if (!r2) r2 = cuCtxSetCurrent(c);
                if (r2) r = r2;
            }
            if (gate) printf("ctxrace rc=%d op=%d inside=%d\n", r, race_rc, !missed);
            else printf("ctxrace rc=%d op=%d\n", r, race_rc);
        } else if (!strcmp(op, "call")) {
            const char *name = i + 1 < argc ? argv[++i] : "";
            int k = 0;
            while (k < NFN && strcmp(hp_fns[k].name, name)) k++;
            if (k == NFN) {
                fprintf(stderr, "call: %s is not a hooked CUDA function\n", name);
                return 2;
            }
            u64 a[8] = {0};
            int n = 0;
            while (i + 1 < argc && is_call_arg(argv[i + 1]) && n < 8) a[n++] = call_arg(argv[++i], k);
            if (call_row(k, a, n)) return 2;
        } else if (!strcmp(op, "fns")) {
            for (int k = 0; k < NFN; k++) {
                void *p = resolve(k);
                Dl_info d;
                int found = p && dladdr(p, &d);
                printf("fn rc=%d name=%s sym=%s lib=%s off=0x%lx\n", p ? 0 : 1, hp_fns[k].name,
                       found && d.dli_sname ? d.dli_sname : "-", found && d.dli_fname ? d.dli_fname : "-",
                       found ? (unsigned long)((char *)p - (char *)d.dli_fbase) : 0UL);
            }
        } else if (!strcmp(op, "sleep")) {
            usleep(atoi(argv[++i]) * 1000);
            printf("sleep rc=0\n");
        } else if (!strcmp(op, "touch")) {
            /* touch PATH: create an empty file (tells the test this point was reached). */
            printf("touch rc=%d\n", touch_path(argv[++i]));
        } else if (!strcmp(op, "waitfile")) {
            /* waitfile PATH: wait until PATH exists (at most 120 s). */
            printf("waitfile rc=%d\n", wait_path(argv[++i], 120000));
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
    int i = 1, ctx = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--via")) via = argv[++i];
        else if (!strcmp(argv[i], "--no-ctx")) ctx = 0;
    }
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
    if (strcmp(via, "direct") && strcmp(via, "dlsym")) gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (ctx) {
        CUcontext c;
        CUresult r = cuInit(0);
        if (!r) r = cuDevicePrimaryCtxRetain(&c, 0);
        if (!r) r = cuCtxSetCurrent(c);
        if (r) { fprintf(stderr, "init failed %d\n", r); return 5; }
    }
    return run(argc, argv, i);
}
