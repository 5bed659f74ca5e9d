/* A tiny stand-in for the CUDA driver, used by the observer's tests until (and beside)
 * tests/fake-cuda: it exports the entry points the observer probes, with cuda.h's argument
 * order, and does nothing but count, so a uprobe's cost dominates what the bench measures.
 * Build: cc -shared -fPIC -O2 -o libmini_cuda.so mini_cuda.c */
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef void *CUstream;
typedef void *CUfunction;
typedef void *CUcontext;

static volatile uint64_t calls;

#define EXPORT __attribute__((visibility("default"), noinline))

EXPORT CUresult cuInit(unsigned flags) { (void)flags; return 0; }

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			       unsigned bz, unsigned shmem, CUstream s, void **params, void **extra)
{
	(void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s;
	(void)params; (void)extra;
	calls++;
	return 0;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
	(void)dst; (void)src; (void)bytes;
	calls++;
	return 0;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
	(void)dst; (void)src; (void)bytes;
	calls++;
	return 0;
}

EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, size_t n)
{
	(void)dst; (void)value; (void)n;
	calls++;
	return 0;
}

/* Same layout as cuda.h's CUDA_MEMCPY2D on 64-bit. */
typedef struct {
	size_t srcXInBytes, srcY;
	int srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	int dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

_Static_assert(offsetof(CUDA_MEMCPY2D, WidthInBytes) == 112, "CUDA_MEMCPY2D layout");

EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *copy)
{
	(void)copy;
	calls++;
	return 0;
}

EXPORT CUresult cuCtxSynchronize(void) { calls++; return 0; }

EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; calls++; return 0; }
