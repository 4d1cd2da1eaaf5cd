/* Holds N MiB of device memory through the driver API for S seconds, then exits.
 * Prints "HOLDING <pid>" once the memory is allocated. Build: gcc hold.c -lcuda. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 256;
    int secs = argc > 2 ? atoi(argv[2]) : 10;
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "hold: no context\n");
        return 2;
    }
    CUresult r = cuMemAlloc(&p, mib << 20);
    if (r) {
        fprintf(stderr, "hold: cuMemAlloc(%zu MiB) = %d\n", mib, (int)r);
        return 3;
    }
    printf("HOLDING %d %zu\n", (int)getpid(), mib);
    fflush(stdout);
    sleep(secs);
    return 0;
}
