/*
 * cudaprobe_ops.h: the helpers of cudaprobe.c's ops, included by it once after
 * cudaprobe_driver.h: picking records, printing and freeing them, signals, the timed spin
 * kernel of the device-clock ops, and the usage text.
 */
#ifndef CUDAPROBE_OPS_H
#define CUDAPROBE_OPS_H

/* Picks a record: an index, "last" (last live record of one of the kinds), or an address. */
static long pick(const char *arg, unsigned kinds) {
  if (!strcmp(arg, "last")) {
    for (size_t i = nrecs; i-- > 0;)
      if (recs[i].live && (kinds & (1u << recs[i].kind))) return (long)i;
    return -1;
  }
  if (!strncmp(arg, "0x", 2)) {
    CUdeviceptr p = strtoull(arg, NULL, 16);
    for (size_t i = nrecs; i-- > 0;)
      if (recs[i].live && recs[i].ptr == p) return (long)i;
    return -1;
  }
  char *e;
  long i = strtol(arg, &e, 10);
  if (*e || i < 0 || (size_t)i >= nrecs) return -1;
  return i;
}

/* An optional IDX argument: "last" or a number; otherwise (another op follows) "last". */
static const char *opt_idx(int argc, char **argv, int *a) {
  if (*a + 1 < argc && (!strcmp(argv[*a + 1], "last") || (argv[*a + 1][0] >= '0' && argv[*a + 1][0] <= '9')))
    return argv[++*a];
  return "last";
}

static void print_alloc(const char *op, size_t size, CUresult rc, CUdeviceptr p, int kind) {
  printf("op=%s size=%zu", op, size);
  if (rc == 0) {
    size_t i = add_rec((rec_t){.kind = kind, .ptr = p, .size = size});
    printf(" idx=%zu ptr=0x%llx", i, p);
  }
  end(rc);
}

static CUresult free_rec(size_t i) {
  rec_t *r = &recs[i];
  CUresult rc;
  switch (r->kind) {
    case K_VMM:
      rc = cu.MemUnmap(r->ptr, r->size);
      while (!rc && r->handle_refs > 0) {
        rc = cu.MemRelease(r->handle);
        if (!rc) r->handle_refs--;
      }
      if (!rc) rc = cu.MemAddressFree(r->ptr, r->size);
      break;
    case K_ARRAY: rc = cu.ArrayDestroy(r->obj); break;
    case K_CTX: rc = cu.CtxDestroy(r->obj); break;
    case K_MIPMAP: rc = cu.MipmappedArrayDestroy(r->obj); break;
    case K_MODULE: rc = cu.ModuleUnload(r->obj); break;
    case K_LIBRARY: rc = cu.LibraryUnload(r->obj); break;
    case K_FUNC: case K_KERNEL: rc = 0; break;
    case K_EVENT: rc = cu.EventDestroy(r->obj); break;
    case K_GRAPH:
      rc = cu.GraphExecDestroy(r->obj);
      if (!rc) rc = cu.GraphDestroy(r->obj2);
      break;
    case K_GREEN: rc = cu.GreenCtxDestroy(r->obj); break;
    default: rc = cu.MemFree(r->ptr);
  }
  if (!rc) r->live = 0;
  return rc;
}

static volatile sig_atomic_t got_signal;
static void on_signal(int s) { got_signal = s; }

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

/* The timed kernel of the device-clock ops: on the fake driver a module "FAKECUBIN globals=0
 * ns=param" (each launch takes its first parameter, a u64, in ns); on a real driver (which
 * rejects that image with CUDA_ERROR_INVALID_IMAGE) a PTX kernel spinning on %globaltimer
 * for that many ns, on SPIN_BLOCKS blocks. */
#define SPIN_BLOCKS 132
static const char spin_ptx[] =
    ".version 7.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns) {\n"
    "  .reg .u64 %t0, %t1, %d, %n;\n  .reg .pred %p;\n"
    "  ld.param.u64 %n, [ns];\n  mov.u64 %t0, %globaltimer;\n"
    "LOOP:\n  mov.u64 %t1, %globaltimer;\n  sub.u64 %d, %t1, %t0;\n"
    "  setp.lt.u64 %p, %d, %n;\n  @%p bra LOOP;\n  ret;\n}\n";
static CUfunction spin_fn;

static CUresult spin_kernel(void) {
  if (spin_fn) return 0;
  if (!cu.ModuleLoadData || !cu.ModuleGetFunction) return -1;
  CUmodule m = NULL;
  CUresult rc = cu.ModuleLoadData(&m, "FAKECUBIN globals=0 ns=param");
  if (rc == CUDA_ERROR_INVALID_IMAGE /* a real driver */) rc = cu.ModuleLoadData(&m, spin_ptx);
  if (!rc) rc = cu.ModuleGetFunction(&spin_fn, m, "spin");
  return rc;
}

static CUresult spin_launch(unsigned long long ns, int coop) {
  void *args[] = {&ns};
  if (coop) return cu.LaunchCooperativeKernel(spin_fn, SPIN_BLOCKS, 1, 1, 32, 1, 1, 0, stream, args);
  return cu.LaunchKernel(spin_fn, SPIN_BLOCKS, 1, 1, 32, 1, 1, 0, stream, args, NULL);
}

static unsigned long long parse_ns(const char *s) {
  char *e;
  double v = strtod(s, &e);
  if (e == s || v < 0) die("bad duration '%s'", s);
  if (!strcmp(e, "s")) v *= 1e9;
  else if (!strcmp(e, "ms")) v *= 1e6;
  else if (!strcmp(e, "us")) v *= 1e3;
  else if (*e && strcmp(e, "ns")) die("bad duration '%s'", s);
  return (unsigned long long)(v + 0.5);
}

/* This thread's time spent runnable but waiting for a CPU so far, in ns: the second field of
 * /proc/thread-self/schedstat (0 if unreadable). The difference between two readings
 * bounds how much a loaded machine delayed the ops between them. */
static unsigned long long runqueue_wait_ns(void) {
  unsigned long long run = 0, wait = 0;
  FILE *f = fopen("/proc/thread-self/schedstat", "r");
  if (!f) return 0;
  if (fscanf(f, "%llu %llu", &run, &wait) != 2) wait = 0;
  fclose(f);
  return wait;
}

static void usage(void) {
  puts("usage: cudaprobe [--via direct|dlsym|procaddr] [--device N] [--cuda-version V] OP...\n"
       "ops (sizes take K/M/G/T suffixes; IDX is a record index, 'last' or 0xADDR):\n"
       "  init | ctx | ctxcreate | ctxdestroy [IDX] | ctxrelease | ctxnull | ctxpop | ctxsync\n"
       "  device N | count | name | uuid | totalmem | meminfo | version | ctxdevice\n"
       "  alloc SIZE | alloc-null | free IDX|ADDR|last|all | free-raw 0xADDR\n"
       "  pitch WIDTH HEIGHT | managed SIZE | async SIZE | async-ptsz SIZE | freeasync IDX\n"
       "  pool SIZE | create SIZE | release IDX | releasemapped IDX | retain IDX | unmap IDX | array W H | array3d W H D | arraydestroy IDX\n"
       "  fill SIZE | bench-pair N SIZE | bench-for SECONDS SIZE | getproc NAME [VERSION [FLAGS]] | getproc1 NAME [VERSION [FLAGS]]\n"
       "  errname CODE\n"
       "  poolinfo default|own | threshold default|own SIZE|max | trim default|own SIZE | pooldestroy | setpool\n"
       "  streamsync | eventsync | streamnew | capture-begin | capture-end | mipmap W H LEVELS | mipmapdestroy IDX\n"
       "  modload SIZE [local=SIZE] | modloadex SIZE | modloadfat SIZE | modloadfile SIZE | modunload IDX\n"
       "  getfunc [IDX] | launch [IDX] | launchex [IDX]\n"
       "  libload SIZE | libloadfile SIZE | libunload IDX | getkernel [IDX] | kernelfunc [IDX]\n"
       "  modloadimg[ex|fat|wrap|file|static] PATH | libloadimg[wrap|file|static] PATH   (a real image file)\n"
       "  getglobal [IDX] | libgetglobal [IDX] | libgetmodule [IDX]\n"
       "  setlimit stack|printf|heap|syncdepth|pending|N SIZE | getlimit NAME | funcattr ATTR [IDX]\n"
       "  bench-launch N [IDX] | launchcoop [IDX]\n"
       "  kernel | launch-ns NS [COUNT] | launch-cost N | coop-ns NS [COUNT] | launch-for SECONDS NS | streams-for SECONDS NS N | streamquery\n"
       "  evcreate [FLAGS] | evrecord [IDX] | evquery [IDX] | evsync [IDX] | elapsed IDX IDX | evdestroy IDX\n"
       "  graph-capture NS COUNT | graph-launch N [IDX] | graphdestroy IDX\n"
       "  gmem-alloc SIZE | gmem-free | gmem-inst [FLAGS] | gmem-inst-upload | gmem-upload [IDX] | gmem-memfree\n"
       "  gmem-attr | gmem-trim | greenctx | greenctxdestroy IDX | streamsync-t | ctxsync-t\n"
       "  rq (this thread's runqueue wait so far, rq_ns=) | sleep SECONDS | wait | exit CODE");
}

#endif /* CUDAPROBE_OPS_H */
