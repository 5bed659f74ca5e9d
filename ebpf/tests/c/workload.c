/* A test process that calls CUDA driver entry points through a library given on the command
 * line, on command: the observer's tests drive it line by line over stdin and wait for "ok".
 *   workload LIB        then lines:  launch N | htod N BYTES | memset32 N COUNT | copy2d W H | sync |
 *                                    ioctl N DEVICE | exit
 * It initialises the driver the way a CUDA program does (cuInit, cuDeviceGet, cuCtxCreate,
 * cuMemAlloc) when the library exports those calls, so a faithful fake accepts the copies. */
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(unsigned);
typedef int (*device_get_fn)(int *, int);
typedef int (*ctx_create_fn)(void **, unsigned, int);
typedef int (*mem_alloc_fn)(uint64_t *, size_t);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
			 void **, void **);
typedef int (*htod_fn)(uint64_t, const void *, size_t);
typedef int (*memset32_fn)(uint64_t, unsigned, size_t);
typedef int (*copy2d_fn)(const void *);
typedef int (*sync_fn)(void);
typedef int (*module_load_fn)(void **, const void *);
typedef int (*get_function_fn)(void **, void *, const char *);

static void *need(void *lib, const char *name)
{
	void *f = dlsym(lib, name);
	if (!f) {
		fprintf(stderr, "workload: %s not exported\n", name);
		exit(3);
	}
	return f;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: workload LIB\n");
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "workload: %s\n", dlerror());
		return 2;
	}
	uint64_t dptr = 0x1000;
	void *ctx = 0;
	init_fn cu_init = (init_fn)dlsym(lib, "cuInit");
	if (cu_init && cu_init(0) != 0) {
		fprintf(stderr, "workload: cuInit failed\n");
		return 4;
	}
	device_get_fn device_get = (device_get_fn)dlsym(lib, "cuDeviceGet");
	ctx_create_fn ctx_create = (ctx_create_fn)dlsym(lib, "cuCtxCreate_v2");
	int dev = 0;
	if (device_get && ctx_create && (device_get(&dev, 0) != 0 || ctx_create(&ctx, 0, dev) != 0)) {
		fprintf(stderr, "workload: context creation failed\n");
		return 4;
	}
	mem_alloc_fn mem_alloc = (mem_alloc_fn)dlsym(lib, "cuMemAlloc_v2");
	size_t allocated = 0;
	/* A real kernel to launch where the library has modules: fill_f32(dst, 1.0f, 1) on a
	 * 4-byte buffer (tests/fake-cuda's built-in kernel); any handle for the tiny stand-in. */
	void *function = (void *)0x1;
	uint64_t kernel_buf = 0;
	float fill_value = 1.0f;
	uint64_t fill_n = 1;
	void *params[3] = {&kernel_buf, &fill_value, &fill_n};
	module_load_fn module_load = (module_load_fn)dlsym(lib, "cuModuleLoadData");
	get_function_fn get_function = (get_function_fn)dlsym(lib, "cuModuleGetFunction");
	if (module_load && get_function && mem_alloc) {
		void *module = 0;
		if (module_load(&module, "") != 0 || get_function(&function, module, "fill_f32") != 0 ||
		    mem_alloc(&kernel_buf, 4) != 0) {
			fprintf(stderr, "workload: module/function/buffer setup failed\n");
			return 4;
		}
	}
	char line[256];
	printf("ready\n");
	fflush(stdout);
	while (fgets(line, sizeof line, stdin)) {
		unsigned long n = 0, a = 0, b = 0;
		int rc = 0;
		if (sscanf(line, "launch %lu", &n) == 1) {
			launch_fn f = (launch_fn)need(lib, "cuLaunchKernel");
			for (unsigned long i = 0; i < n && rc == 0; i++)
				rc = f(function, 1, 1, 1, 1, 1, 1, 0, 0, params, 0);
		} else if (sscanf(line, "htod %lu %lu", &n, &a) == 2) {
			htod_fn f = (htod_fn)need(lib, "cuMemcpyHtoD_v2");
			void *buf = calloc(1, a);
			if (mem_alloc && allocated < a) {
				rc = mem_alloc(&dptr, a);
				allocated = a;
			}
			for (unsigned long i = 0; i < n && rc == 0; i++)
				rc = f(dptr, buf, a);
			free(buf);
		} else if (sscanf(line, "memset32 %lu %lu", &n, &a) == 2) {
			memset32_fn f = (memset32_fn)need(lib, "cuMemsetD32_v2");
			for (unsigned long i = 0; i < n && rc == 0; i++)
				rc = f(dptr, 0, a);
		} else if (sscanf(line, "copy2d %lu %lu", &a, &b) == 2) {
			copy2d_fn f = (copy2d_fn)need(lib, "cuMemcpy2D_v2");
			size_t desc[16] = {0}; /* CUDA_MEMCPY2D: WidthInBytes at byte 112, Height at 120 */
			desc[14] = a;
			desc[15] = b;
			rc = f(desc);
		} else if (strncmp(line, "ioctl ", 6) == 0) {
			char path[200];
			if (sscanf(line, "ioctl %lu %199s", &n, path) != 2) {
				fprintf(stderr, "workload: usage: ioctl N DEVICE\n");
				return 2;
			}
			int fd = open(path, O_RDWR);
			if (fd < 0) {
				perror(path);
				return 2;
			}
			struct termios t;
			/* The answer does not matter (ENOTTY on most devices): the ioctl entering the
			 * kernel is what the observer counts. */
			for (unsigned long i = 0; i < n; i++)
				(void)ioctl(fd, TCGETS, &t);
			close(fd);
		} else if (strncmp(line, "sync", 4) == 0) {
			rc = ((sync_fn)need(lib, "cuCtxSynchronize"))();
		} else if (strncmp(line, "exit", 4) == 0) {
			return 0;
		} else {
			fprintf(stderr, "workload: unknown command %s", line);
			return 2;
		}
		if (rc != 0)
			printf("err %d\n", rc);
		else
			printf("ok\n");
		fflush(stdout);
	}
	return 0;
}
