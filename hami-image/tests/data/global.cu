#include <cstdio>
__device__ char g[(size_t)1536 << 20];
__device__ int ginit[1024] = {1, 2, 3};
__constant__ int cbank[4096];
__global__ void k(int i) { g[i] = 1; ginit[i & 1023] += cbank[i & 4095]; }
int main() { k<<<1, 1>>>(5); printf("rc=%d\n", cudaDeviceSynchronize()); return 0; }
