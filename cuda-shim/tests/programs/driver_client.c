/* A CUDA driver-API client used by the lease tests. It loads "libcuda.so.1" the way
 * cudart does (dlopen by soname, found through LD_LIBRARY_PATH = the shim's private
 * directory), resolves everything except cuGetProcAddress_v2 through
 * cuGetProcAddress_v2, and runs the fake-cuda TEST DOUBLE's built-in kernels.
 *
 * Modes (argv[1]):
 *   basic                 COUNT, NULL-output checks, one alloc/fill/sum
 *   phases N              alloc x,y (N floats); READY; wait for a stdin line; axpy; AFTER;
 *                         wait for another line
 *   turns V ROUNDS MIB    alloc MIB MiB; per round fill V+r, check sum, idle 300 ms
 *   fork                  parent and forked child each compute on their own memory
 *   launches N            N leased cuLaunchKernel calls in a row
 *   threads N             N threads race for the lease with their first driver calls;
 *                         each then computes on its own buffer (THREAD lines)
 *   limits BYTES          each device allocation entry point against the host's limit
 *                         of BYTES: over it, half of it, the rest, free (LIMIT lines)
 * Every line printed is flushed; exit status 0 means every check passed. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

static CUresult (*pGetProc)(const char *, void **, int, unsigned long long, int *);
static CUresult (*pInit)(unsigned);
static CUresult (*pCount)(int *);
static CUresult (*pDeviceGet)(CUdevice *, int);
static CUresult (*pRetain)(CUcontext *, CUdevice);
static CUresult (*pSetCurrent)(CUcontext);
static CUresult (*pCtxGetDevice)(CUdevice *);
static CUresult (*pAlloc)(CUdeviceptr *, size_t);
static CUresult (*pFree)(CUdeviceptr);
static CUresult (*pDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*pHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*pLoad)(CUmodule *, const void *);
static CUresult (*pGetFn)(CUfunction *, CUmodule, const char *);
static CUresult (*pLaunch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
static CUresult (*pMemGetInfo)(size_t *, size_t *);

static void *resolve_flags(const char *name, unsigned long long flags) {
    void *p = NULL;
    int status = -1;
    CUresult r = pGetProc(name, &p, 12080, flags, &status);
    if (r != 0 || p == NULL || status != 0) {
        printf("RESOLVE_FAILED %s %d %d\n", name, r, status);
        fflush(stdout);
        exit(3);
    }
    return p;
}

static void *resolve(const char *name) { return resolve_flags(name, 0); }

static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("DLOPEN_FAILED %s\n", dlerror());
        exit(2);
    }
    pGetProc = dlsym(h, "cuGetProcAddress_v2");
    if (!pGetProc) exit(2);
    pInit = resolve("cuInit");
    pCount = resolve("cuDeviceGetCount");
    pDeviceGet = resolve("cuDeviceGet");
    pRetain = resolve("cuDevicePrimaryCtxRetain");
    pSetCurrent = resolve("cuCtxSetCurrent");
    pCtxGetDevice = resolve("cuCtxGetDevice");
    pAlloc = resolve("cuMemAlloc");
    pFree = resolve("cuMemFree");
    pDtoH = resolve("cuMemcpyDtoH");
    pHtoD = resolve("cuMemcpyHtoD");
    pLoad = resolve("cuModuleLoadData");
    pGetFn = resolve("cuModuleGetFunction");
    pLaunch = resolve("cuLaunchKernel");
    pMemGetInfo = resolve("cuMemGetInfo");
}

#define CHECK(call)                                                  \
    do {                                                             \
        CUresult _r = (call);                                        \
        if (_r != 0) {                                               \
            printf("FAILED %s = %d (line %d)\n", #call, _r, __LINE__); \
            fflush(stdout);                                          \
            exit(1);                                                 \
        }                                                            \
    } while (0)

static CUfunction fn_fill, fn_axpy, fn_sum;

/* The module image: kernels.ptx when NBOS_TEST_PTX names it (a real GPU needs it; the
 * fake-cuda TEST DOUBLE ignores the image and runs its built-in kernels by name). */
static char *module_image(void) {
    static char empty[1] = "";
    const char *path = getenv("NBOS_TEST_PTX");
    if (!path || !*path) return empty;
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("NO_PTX %s\n", path);
        exit(5);
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void setup_context(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(pDeviceGet(&dev, 0));
    CHECK(pRetain(&ctx, dev));
    CHECK(pSetCurrent(ctx));
    CHECK(pLoad(&mod, module_image()));
    CHECK(pGetFn(&fn_fill, mod, "fill_f32"));
    CHECK(pGetFn(&fn_axpy, mod, "axpy_f32"));
    CHECK(pGetFn(&fn_sum, mod, "sum_f32"));
}

static void fill(CUdeviceptr p, float v, unsigned long long n) {
    void *args[] = {&p, &v, &n};
    CHECK(pLaunch(fn_fill, 1, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
}

static void axpy(CUdeviceptr y, CUdeviceptr x, float a, unsigned long long n) {
    void *args[] = {&y, &x, &a, &n};
    CHECK(pLaunch(fn_axpy, 1, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
}

static double sum(CUdeviceptr x, unsigned long long n) {
    CUdeviceptr out;
    float host = -1;
    CHECK(pAlloc(&out, 4));
    void *args[] = {&out, &x, &n};
    CHECK(pLaunch(fn_sum, 1, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    CHECK(pDtoH(&host, out, 4));
    CHECK(pFree(out));
    return host;
}

static int basic(void) {
    int count = -1;
    CHECK(pInit(0));
    CHECK(pCount(&count));
    printf("COUNT %d\n", count);
    fflush(stdout);
    /* NULL outputs: an error code, never a crash. */
    int n1 = pCount(NULL), n2 = pDeviceGet(NULL, 0), n3 = pAlloc(NULL, 16), n4 = pGetProc("cuInit", NULL, 12080, 0, NULL);
    int n5 = pCtxGetDevice(NULL), n6 = pMemGetInfo(NULL, NULL);
    printf("NULLS %d %d %d %d %d %d\n", n1, n2, n3, n4, n5, n6);
    fflush(stdout);
    setup_context();
    size_t mfree = 0, mtotal = 0;
    CHECK(pMemGetInfo(&mfree, &mtotal));
    printf("MEMINFO %zu %zu\n", mfree, mtotal);
    fflush(stdout);
    CUdeviceptr x;
    CHECK(pAlloc(&x, 4096 * 4));
    fill(x, 1.5f, 4096);
    printf("SUM %.1f\n", sum(x, 4096));
    fflush(stdout);
    return 0;
}

static int phases(unsigned long long n) {
    CHECK(pInit(0));
    setup_context();
    CUdeviceptr x, y;
    CHECK(pAlloc(&x, n * 4));
    CHECK(pAlloc(&y, n * 4));
    fill(x, 2.0f, n);
    fill(y, 1.0f, n);
    printf("READY %llx %llx %.1f\n", x, y, sum(y, n));
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 4;
    /* The first call after the revoke blocks until the host grants and restores. */
    axpy(y, x, 3.0f, n);
    float first = 0;
    CHECK(pDtoH(&first, y, 4));
    CUdevice dev = -1;
    CHECK(pCtxGetDevice(&dev));
    printf("AFTER %llx %llx %.1f %.1f %.1f %d\n", x, y, sum(y, n), sum(x, n), first, dev);
    fflush(stdout);
    /* Stay alive (holding the lease) until the test has looked at the host's side. */
    if (!fgets(line, sizeof line, stdin)) return 4;
    return 0;
}

static int turns(float v, int rounds, int mib) {
    CHECK(pInit(0));
    setup_context();
    unsigned long long n = (unsigned long long)mib * 1024 * 1024 / 4;
    CUdeviceptr x;
    CHECK(pAlloc(&x, n * 4));
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        float want = v + (float)r;
        fill(x, want, n);
        /* Host-side check of a sample too: contents survive evictions between rounds. */
        float head = 0;
        CHECK(pDtoH(&head, x, 4));
        double s = sum(x, n);
        int ok = head == want && s == (double)want * (double)n;
        bad += !ok;
        printf("ROUND %d %s %.1f\n", r, ok ? "ok" : "CORRUPT", s);
        fflush(stdout);
        usleep(300 * 1000);
        /* The value must still be there after idling (and maybe being evicted). */
        CHECK(pDtoH(&head, x + 4 * (n - 1), 4));
        if (head != want) {
            bad++;
            printf("LOST %d %.1f\n", r, head);
            fflush(stdout);
        }
    }
    printf("DONE %d\n", bad);
    fflush(stdout);
    return bad ? 1 : 0;
}

static int forked(void) {
    CHECK(pInit(0));
    setup_context();
    CUdeviceptr x;
    CHECK(pAlloc(&x, 1024 * 4));
    fill(x, 5.0f, 1024);
    pid_t child = fork();
    if (child == 0) {
        /* The child re-initialises CUDA and registers with the host as itself. */
        int count = -1;
        CHECK(pInit(0));
        CHECK(pCount(&count));
        setup_context();
        CUdeviceptr y;
        CHECK(pAlloc(&y, 1024 * 4));
        fill(y, 7.0f, 1024);
        double s = sum(y, 1024);
        printf("CHILD %d %.1f\n", count, s);
        fflush(stdout);
        _exit(s == 7.0 * 1024 && count == 1 ? 0 : 1);
    }
    double s = sum(x, 1024);
    int status = -1;
    waitpid(child, &status, 0);
    printf("PARENT %.1f %d\n", s, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    fflush(stdout);
    return s == 5.0 * 1024 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static int launches(long n) {
    CHECK(pInit(0));
    setup_context();
    CUdeviceptr x;
    CHECK(pAlloc(&x, 64 * 4));
    fill(x, 1.0f, 64); /* the first gated call takes the lease */
    for (long i = 0; i < n; i++) fill(x, 2.0f, 64);
    printf("LAUNCHED %ld %.1f\n", n, sum(x, 64));
    fflush(stdout);
    return 0;
}

/* One racing thread: its first gated call (retaining the primary context) waits for
 * the lease like every other thread's; then it computes on its own buffer. */
static void *racer(void *arg) {
    long i = (long)arg;
    CUdevice dev;
    CUcontext ctx;
    CHECK(pDeviceGet(&dev, 0));
    CHECK(pRetain(&ctx, dev));
    CHECK(pSetCurrent(ctx));
    CUdeviceptr x;
    CHECK(pAlloc(&x, 256 * 4));
    fill(x, (float)(i + 1), 256);
    printf("THREAD %ld %.1f\n", i, sum(x, 256));
    fflush(stdout);
    CHECK(pFree(x));
    return NULL;
}

static int threads(int n) {
    CHECK(pInit(0));
    /* The module's functions are needed by every thread: load them first (this takes the
     * lease), then give it back by asking the host through stdin. */
    setup_context();
    printf("LOADED\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 4;
    pthread_t t[64];
    if (n > 64) n = 64;
    for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, racer, (void *)i);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    printf("JOINED %d\n", n);
    fflush(stdout);
    return 0;
}

/* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: resolves the _ptsz variants. */
#define PTDS 2ULL

struct alloc_prop { /* CUmemAllocationProp */
    unsigned type, handle_types, location_type;
    int location_id;
    void *win32;
    unsigned char flags[8];
};

static const char *kinds[] = {"cuMemAlloc",           "cuMemAllocPitch",         "cuMemAllocManaged",
                              "cuMemAllocAsync",      "cuMemAllocAsync_ptsz",    "cuMemAllocFromPoolAsync",
                              "cuMemAllocFromPoolAsync_ptsz", "cuMemCreate"};

/* Allocates `bytes` (a multiple of 4096) with entry point `kind`; *laid_out is what the
 * driver really laid out (pitch × height for the pitched one). */
static CUresult alloc_kind(int kind, size_t bytes, CUdeviceptr *p, size_t *laid_out, void *pool) {
    *laid_out = bytes;
    switch (kind) {
    case 0:
        return pAlloc(p, bytes);
    case 1: {
        size_t pitch = 0;
        CUresult (*f)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) = resolve("cuMemAllocPitch");
        CUresult r = f(p, &pitch, 4096, bytes / 4096, 4);
        *laid_out = pitch * (bytes / 4096);
        return r;
    }
    case 2: {
        CUresult (*f)(CUdeviceptr *, size_t, unsigned) = resolve("cuMemAllocManaged");
        return f(p, bytes, 1 /* CU_MEM_ATTACH_GLOBAL */);
    }
    case 3:
    case 4: {
        CUresult (*f)(CUdeviceptr *, size_t, CUstream) = resolve_flags("cuMemAllocAsync", kind == 4 ? PTDS : 0);
        return f(p, bytes, NULL);
    }
    case 5:
    case 6: {
        CUresult (*f)(CUdeviceptr *, size_t, void *, CUstream) =
            resolve_flags("cuMemAllocFromPoolAsync", kind == 6 ? PTDS : 0);
        return f(p, bytes, pool, NULL);
    }
    default: {
        struct alloc_prop prop = {1 /* pinned */, 0, 1 /* device */, 0, NULL, {0}};
        CUresult (*f)(unsigned long long *, size_t, const struct alloc_prop *, unsigned long long) =
            resolve("cuMemCreate");
        return f(p, bytes, &prop, 0);
    }
    }
}

static CUresult free_kind(int kind, CUdeviceptr p) {
    if (kind <= 2) return pFree(p);
    if (kind <= 6) {
        CUresult (*f)(CUdeviceptr, CUstream) = resolve_flags("cuMemFreeAsync", (kind == 4 || kind == 6) ? PTDS : 0);
        return f(p, NULL);
    }
    CUresult (*f)(unsigned long long) = resolve("cuMemRelease");
    return f(p);
}

static size_t free_bytes(void) {
    size_t mfree = 0, mtotal = 0;
    CHECK(pMemGetInfo(&mfree, &mtotal));
    return mfree;
}

/* Every entry point: over the limit, half of it, more than the rest, then free. Sizes are
 * multiples of 2 MiB (the VMM granularity of real GPUs) when the limit is. */
static int limits(size_t limit) {
    CHECK(pInit(0));
    setup_context();
    size_t mfree = 0, mtotal = 0;
    CHECK(pMemGetInfo(&mfree, &mtotal));
    printf("MEMINFO %zu %zu\n", mfree, mtotal);
    size_t device_total = 0;
    CUresult (*total_mem)(size_t *, CUdevice) = resolve("cuDeviceTotalMem");
    CHECK(total_mem(&device_total, 0));
    printf("TOTALMEM %zu\n", device_total);
    void *pool = NULL;
    CUresult (*get_pool)(void **, CUdevice) = resolve("cuDeviceGetDefaultMemPool");
    CHECK(get_pool(&pool, 0));
    size_t step = 2u << 20;
    for (int kind = 0; kind < (int)(sizeof kinds / sizeof *kinds); kind++) {
        CUdeviceptr p = 0, q = 0;
        size_t laid = 0, laid_q = 0;
        CUresult over = alloc_kind(kind, limit + step, &q, &laid_q, pool);
        CUresult half = alloc_kind(kind, limit / 2, &p, &laid, pool);
        size_t after_half = free_bytes();
        CUresult rest = alloc_kind(kind, limit / 2 + step, &q, &laid_q, pool);
        CUresult freed = half == 0 ? free_kind(kind, p) : -1;
        printf("LIMIT %s over=%d half=%d laid=%zu free=%zu rest=%d freed=%d free=%zu\n", kinds[kind], over, half,
               laid, after_half, rest, freed, free_bytes());
        fflush(stdout);
    }
    /* Rows of 100 bytes need less than the limit, but pitched rows more. The driver's
     * pitch for such rows is learnt first (512 on the test double and current GPUs). */
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CUresult (*f)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) = resolve("cuMemAllocPitch");
    CHECK(f(&p, &pitch, 100, 1, 4));
    CHECK(pFree(p));
    CUresult r = f(&p, &pitch, 100, limit / pitch + 1, 4);
    printf("PITCHED %d pitch=%zu free=%zu\n", r, pitch, free_bytes());
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    load();
    if (argc > 1 && !strcmp(argv[1], "basic")) return basic();
    if (argc > 2 && !strcmp(argv[1], "phases")) return phases(strtoull(argv[2], NULL, 10));
    if (argc > 4 && !strcmp(argv[1], "turns")) return turns(atof(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc > 1 && !strcmp(argv[1], "fork")) return forked();
    if (argc > 2 && !strcmp(argv[1], "launches")) return launches(atol(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "threads")) return threads(atoi(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "limits")) return limits(strtoull(argv[2], NULL, 10));
    fprintf(stderr, "usage: driver_client basic|phases N|turns V ROUNDS MIB|fork\n");
    return 64;
}
