// The C entry points of liburingtier (declared in uringtier.h). Each checks
// that this process was not forked after the library was loaded, before it
// enters the Go runtime (which does not survive fork and could hang), then
// calls the Go function of the same name with the prefix utgo_.

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "uringtier.h"

// Set in a child of fork(2), and in its children: the Go runtime there has
// lost every thread but the one that forked.
static volatile int ut_forked;
static pid_t ut_loaded_pid; // the process that loaded the library

// The last error on this thread, for ut_last_error.
static __thread char ut_err[1024];

static void ut_atfork_child(void) { ut_forked = 1; }

__attribute__((constructor)) static void ut_init(void) {
	ut_loaded_pid = getpid();
	pthread_atfork(NULL, NULL, ut_atfork_child);
}

// ut__seterr records msg (n bytes, not NUL-terminated) as this thread's
// last error; called by the Go side on every failure.
void ut__seterr(char *msg, size_t n) {
	if (n >= sizeof ut_err) {
		n = sizeof ut_err - 1;
	}
	memcpy(ut_err, msg, n);
	ut_err[n] = 0;
}

static int ut_fork_error(void) {
	snprintf(ut_err, sizeof ut_err,
	         "uringtier: process %d was forked from process %d after liburingtier was loaded there, "
	         "and the Go runtime inside the library does not survive fork: load it after the fork "
	         "(Python: multiprocessing start method \"spawn\" or \"forkserver\")",
	         (int)getpid(), (int)ut_loaded_pid);
	return UT_EFORK;
}

#define UT_GUARD()                      \
	do {                                \
		if (ut_forked) {                \
			return ut_fork_error();     \
		}                               \
	} while (0)

int ut_abi_version(void) { return UT_ABI_VERSION; }

const char *ut_strerror(int code) {
	switch (code) {
	case UT_OK:
		return "success";
	case UT_EBUSY:
		return "uringtier: busy, depth full (nothing was queued: poll and retry)";
	case UT_ECLOSED:
		return "uringtier: tier closed";
	case UT_EINVAL:
		return "uringtier: invalid request (key size, buffer size, batch size or request ID in flight)";
	case UT_EOPTIONS:
		return "uringtier: invalid options";
	case UT_EHANDLE:
		return "uringtier: not a tier handle, or one already freed";
	case UT_ESTUCK:
		return "uringtier: operations still held by a hung filesystem at the close timeout";
	case UT_EFORK:
		return "uringtier: process forked after the library was loaded; load it after the fork";
	case UT_EIO:
		return "uringtier: the directory or the IO engine could not be set up";
	case UT_ERANGE:
		return "uringtier: a waiting result has more keys than the status array holds";
	case UT_EARG:
		return "uringtier: NULL pointer or impossible length";
	case UT_EBROKEN:
		return "uringtier: the IO engine failed; close and reopen the tier";
	}
	return "uringtier: unknown error code";
}

const char *ut_last_error(void) { return ut_err; }

int ut_open(const char *dir, const char *options, ut_tier *out) {
	UT_GUARD();
	return utgo_open((char *)dir, (char *)options, NULL, 0, 0, out);
}

size_t ut_buffers_size(size_t block_size, size_t n) {
	if (ut_forked) {
		ut_fork_error();
		return 0;
	}
	return utgo_buffers_size(block_size, n);
}

int ut_open_buffers(const char *dir, const char *options, void *mem, size_t mem_size, size_t n, ut_tier *out) {
	UT_GUARD();
	if (n == 0) {
		snprintf(ut_err, sizeof ut_err, "uringtier: bad argument: ut_open_buffers: n is 0 (use ut_open)");
		return UT_EARG;
	}
	return utgo_open((char *)dir, (char *)options, mem, mem_size, n, out);
}

int ut_buffers(ut_tier t, void **bufs, size_t cap) {
	UT_GUARD();
	return utgo_buffers(t, bufs, cap);
}

int ut_lookup(ut_tier t, uint64_t req, const void *keys, size_t keys_size, const uint32_t *key_sizes,
              size_t n) {
	UT_GUARD();
	return utgo_submit(t, UT_OP_LOOKUP, 0, req, (void *)keys, keys_size, (uint32_t *)key_sizes, n, NULL, 0);
}

int ut_lookup_prefix(ut_tier t, uint64_t req, const void *keys, size_t keys_size,
                     const uint32_t *key_sizes, size_t n) {
	UT_GUARD();
	return utgo_submit(t, UT_OP_LOOKUP, 1, req, (void *)keys, keys_size, (uint32_t *)key_sizes, n, NULL, 0);
}

int ut_delete(ut_tier t, uint64_t req, const void *keys, size_t keys_size, const uint32_t *key_sizes,
              size_t n) {
	UT_GUARD();
	return utgo_submit(t, UT_OP_DELETE, 0, req, (void *)keys, keys_size, (uint32_t *)key_sizes, n, NULL, 0);
}

int ut_load(ut_tier t, uint64_t req, const void *keys, size_t keys_size, const uint32_t *key_sizes,
            size_t n, void *const *bufs, size_t buf_size) {
	UT_GUARD();
	return utgo_submit(t, UT_OP_LOAD, 0, req, (void *)keys, keys_size, (uint32_t *)key_sizes, n,
	                   (void **)bufs, buf_size);
}

int ut_store(ut_tier t, uint64_t req, const void *keys, size_t keys_size, const uint32_t *key_sizes,
             size_t n, const void *const *bufs, size_t buf_size) {
	UT_GUARD();
	return utgo_submit(t, UT_OP_STORE, 0, req, (void *)keys, keys_size, (uint32_t *)key_sizes, n,
	                   (void **)bufs, buf_size);
}

int ut_poll(ut_tier t, ut_result *results, size_t results_cap, uint8_t *status, size_t status_cap) {
	UT_GUARD();
	return utgo_poll(t, results, results_cap, status, status_cap);
}

int ut_fd(ut_tier t) {
	UT_GUARD();
	return utgo_fd(t);
}

int ut_cancel(ut_tier t, uint64_t req) {
	UT_GUARD();
	return utgo_cancel(t, req);
}

int ut_close(ut_tier t, int64_t timeout_ms) {
	UT_GUARD();
	return utgo_close(t, timeout_ms);
}

int ut_free(ut_tier t) {
	UT_GUARD();
	return utgo_free(t);
}

int ut_read_gauges(ut_tier t, ut_gauges *out) {
	UT_GUARD();
	return utgo_gauges(t, out);
}

int ut_stats(ut_tier t, char *buf, size_t cap) {
	UT_GUARD();
	return utgo_stats(t, buf, cap);
}

int ut_engine(ut_tier t, char *buf, size_t cap) {
	UT_GUARD();
	return utgo_engine(t, buf, cap);
}

int ut_exists(const char *paths, size_t paths_size, size_t n, int64_t timeout_ms, uint8_t *status) {
	UT_GUARD();
	return utgo_exists((char *)paths, paths_size, n, timeout_ms, status);
}
