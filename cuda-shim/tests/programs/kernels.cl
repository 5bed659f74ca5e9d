// Source of kernels.ptx, the real-GPU twins of the fake-cuda TEST DOUBLE built-in kernels.
// Regenerate: clang -target nvptx64-nvidia-nvcl -cl-std=CL1.2 -O2 -S -Xclang -target-cpu -Xclang sm_70 \
//   -o kernels.ptx kernels.cl && sed -i "s/, texmode_independent//" kernels.ptx
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
static ulong gid(void) { return (ulong)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() + __nvvm_read_ptx_sreg_tid_x(); }
static ulong gsize(void) { return (ulong)__nvvm_read_ptx_sreg_nctaid_x() * __nvvm_read_ptx_sreg_ntid_x(); }
__kernel void fill_f32(__global float *dst, float v, ulong n) {
    for (ulong i = gid(); i < n; i += gsize()) dst[i] = v;
}
__kernel void axpy_f32(__global float *y, __global const float *x, float a, ulong n) {
    for (ulong i = gid(); i < n; i += gsize()) y[i] += a * x[i];
}
__kernel void sum_f32(__global float *out, __global const float *x, ulong n) {
    if (gid() != 0) return;
    double s = 0.0;
    for (ulong i = 0; i < n; i++) s += (double)x[i];
    out[0] = (float)s;
}
