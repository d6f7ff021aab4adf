// A kernel and a host check: the toolkit tests compile it for sm_120a (-cubin, no GPU needed);
// on a GPU machine, `nvcc -arch=sm_90a -o axpy axpy.cu && ./axpy` runs it and checks the result.
#include <cstdio>
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
int main() {
  const int n = 1 << 20;
  float *x, *y;
  if (cudaMallocManaged(&x, n * sizeof(float)) != cudaSuccess || cudaMallocManaged(&y, n * sizeof(float)) != cudaSuccess) { printf("alloc failed\n"); return 2; }
  for (int i = 0; i < n; ++i) { x[i] = 1.0f; y[i] = 2.0f; }
  axpy<<<(n + 255) / 256, 256>>>(3.0f, x, y, n);
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) { printf("kernel failed: %s\n", cudaGetErrorString(err)); return 3; }
  for (int i = 0; i < n; ++i) if (y[i] != 5.0f) { printf("wrong y[%d]=%f\n", i, y[i]); return 1; }
  printf("axpy ok on %d elements\n", n);
  return 0;
}
