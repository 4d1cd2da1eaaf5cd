/*
 * scaleproc: the processes of a busy node, for `cargo xtask torture --only scale`
 * (xtask/src/torture/scale.rs).
 *
 * Linked with -lcuda (the fake driver) and run with the real preload, so that the agent sees
 * each process exactly as it sees a real one: libcuda and libhami_preload mapped, the region
 * path in its environment, a slot of its own in that region holding BYTES of device memory.
 *
 *   scaleproc PROCS BYTES
 *     Forks PROCS-1 children before any CUDA call (the libraries' relocated pages stay shared
 *     copy-on-write: a child costs a few hundred KiB, not an exec's worth), so the children
 *     share the parent's environment and so its region. Every one of the PROCS processes
 *     then does cuInit, retains the primary context of device 0 and allocates BYTES with
 *     cuMemAlloc_v2 (its first charge registers its slot), reports to the parent through a
 *     pipe and sleeps. The parent prints
 *       ready procs=N failed=F
 *     (F = processes whose CUDA calls failed, each also printed as "error pid=P op=NAME rc=RC"
 *     on stderr), then waits for EOF on stdin and SIGKILLs its children (they also die with
 *     it: PR_SET_PDEATHSIG). Run it in its own process group so that one kill(-pgid) ends
 *     the whole family even if the parent is gone.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hami_cuda.h"

#define MAX_PROCS 4096

/* The CUDA work of one process: 0 if every call succeeded. */
static int use_cuda(size_t bytes) {
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p;
  CUresult rc;
  const char *op = "cuInit";
  if ((rc = cuInit(0)) != 0) goto fail;
  op = "cuDeviceGet";
  if ((rc = cuDeviceGet(&dev, 0)) != 0) goto fail;
  op = "cuDevicePrimaryCtxRetain";
  if ((rc = cuDevicePrimaryCtxRetain(&ctx, dev)) != 0) goto fail;
  op = "cuCtxSetCurrent";
  if ((rc = cuCtxSetCurrent(ctx)) != 0) goto fail;
  op = "cuMemAlloc_v2";
  if ((rc = cuMemAlloc_v2(&p, bytes)) != 0) goto fail;
  return 0;
fail:
  fprintf(stderr, "error pid=%d op=%s rc=%d\n", (int)getpid(), op, rc);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: scaleproc PROCS BYTES\n");
    return 64;
  }
  int procs = atoi(argv[1]);
  size_t bytes = strtoull(argv[2], NULL, 0);
  if (procs < 1 || procs > MAX_PROCS || bytes == 0) {
    fprintf(stderr, "scaleproc: PROCS must be 1..%d and BYTES > 0\n", MAX_PROCS);
    return 64;
  }
  static pid_t kids[MAX_PROCS];
  int fds[2];
  if (pipe(fds) != 0) {
    perror("pipe");
    return 1;
  }
  pid_t parent = getpid();
  int nkids = 0;
  for (int i = 1; i < procs; i++) {
    pid_t k = fork();
    if (k < 0) {
      perror("fork");
      break;
    }
    if (k == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1); /* the parent died before the prctl */
      close(fds[0]);
      char ok = use_cuda(bytes) == 0 ? 'y' : 'n';
      if (write(fds[1], &ok, 1) != 1) _exit(1);
      close(fds[1]);
      for (;;) pause();
    }
    kids[nkids++] = k;
  }
  close(fds[1]);
  int failed = use_cuda(bytes) + (procs - 1 - nkids);
  for (int i = 0; i < nkids; i++) {
    char ok;
    if (read(fds[0], &ok, 1) != 1) {
      failed += nkids - i;
      break;
    }
    if (ok != 'y') failed++;
  }
  printf("ready procs=%d failed=%d\n", nkids + 1, failed);
  fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof buf) > 0) {
  }
  for (int i = 0; i < nkids; i++) kill(kids[i], SIGKILL);
  for (int i = 0; i < nkids; i++) waitpid(kids[i], NULL, 0);
  return 0;
}
