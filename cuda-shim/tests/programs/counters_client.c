/* A CUDA driver-API client for the counters-file tests. It loads "libcuda.so.1" (the shim,
 * found through LD_LIBRARY_PATH) and runs the fake-cuda TEST DOUBLE's built-in kernels.
 *
 *   counters_client N M B K [C]
 *     N cuLaunchKernel, M cuMemcpyHtoD_v2 of B bytes, K cuCtxSynchronize; prints "PID p".
 *     With C: then forks a child that makes C launches and 1 sync and prints "CHILD p".
 * Exit status 0 means every call succeeded. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static CUresult (*pInit)(unsigned);
static CUresult (*pDeviceGet)(int *, int);
static CUresult (*pRetain)(void **, int);
static CUresult (*pSetCurrent)(void *);
static CUresult (*pLoad)(void **, const void *);
static CUresult (*pGetFn)(void **, void *, const char *);
static CUresult (*pAlloc)(CUdeviceptr *, size_t);
static CUresult (*pHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*pLaunch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **);
static CUresult (*pSync)(void);

#define CHECK(call)                                                    \
    do {                                                               \
        CUresult _r = (call);                                          \
        if (_r != 0) {                                                 \
            printf("FAILED %s = %d (line %d)\n", #call, _r, __LINE__); \
            fflush(stdout);                                            \
            exit(1);                                                   \
        }                                                              \
    } while (0)

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        printf("NO_SYMBOL %s\n", name);
        exit(2);
    }
    return p;
}

static void *fill_fn;
static CUdeviceptr buf;

static void setup(size_t bytes) {
    int dev;
    void *ctx, *mod;
    CHECK(pInit(0));
    CHECK(pDeviceGet(&dev, 0));
    CHECK(pRetain(&ctx, dev));
    CHECK(pSetCurrent(ctx));
    CHECK(pLoad(&mod, ""));
    CHECK(pGetFn(&fill_fn, mod, "fill_f32"));
    CHECK(pAlloc(&buf, bytes < 256 ? 256 : bytes));
}

static void launch(void) {
    float v = 1.0f;
    unsigned long long n = 64;
    void *args[] = {&buf, &v, &n};
    CHECK(pLaunch(fill_fn, 1, 1, 1, 64, 1, 1, 0, NULL, args, NULL));
}

int main(int argc, char **argv) {
    if (argc < 5) return 64;
    long n = atol(argv[1]), m = atol(argv[2]), k = atol(argv[4]);
    size_t b = strtoull(argv[3], NULL, 10);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("DLOPEN_FAILED %s\n", dlerror());
        return 2;
    }
    pInit = sym(h, "cuInit");
    pDeviceGet = sym(h, "cuDeviceGet");
    pRetain = sym(h, "cuDevicePrimaryCtxRetain");
    pSetCurrent = sym(h, "cuCtxSetCurrent");
    pLoad = sym(h, "cuModuleLoadData");
    pGetFn = sym(h, "cuModuleGetFunction");
    pAlloc = sym(h, "cuMemAlloc_v2");
    pHtoD = sym(h, "cuMemcpyHtoD_v2");
    pLaunch = sym(h, "cuLaunchKernel");
    pSync = sym(h, "cuCtxSynchronize");
    setup(b);
    char *host = calloc(b ? b : 1, 1);
    for (long i = 0; i < n; i++) launch();
    for (long i = 0; i < m; i++) CHECK(pHtoD(buf, host, b));
    for (long i = 0; i < k; i++) CHECK(pSync());
    printf("PID %d\n", (int)getpid());
    fflush(stdout);
    if (argc > 5) {
        long c = atol(argv[5]);
        pid_t child = fork();
        if (child == 0) {
            setup(256);
            for (long i = 0; i < c; i++) launch();
            CHECK(pSync());
            printf("CHILD %d\n", (int)getpid());
            fflush(stdout);
            _exit(0);
        }
        int status = -1;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 3;
    }
    return 0;
}
