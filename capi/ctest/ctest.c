// ctest checks liburingtier through its header, as a C program sees it.
//
//	cc -Wall -Werror -pthread -o ctest ctest.c -I.. -L<libdir> -luringtier -Wl,-rpath,<libdir>
//	./ctest DIR [ENGINE...]    (engines default to "sync uring")
//
// It prints one line per failed check and ends with "N passed, M failed";
// the exit status is 1 if any check failed.

#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "uringtier.h"

static int passed, failed;

#define CHECK(cond, ...)                                                       \
	do {                                                                       \
		if (cond) {                                                            \
			passed++;                                                          \
		} else {                                                               \
			failed++;                                                          \
			fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond);   \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, " (last error: %s)\n", ut_last_error());           \
		}                                                                      \
	} while (0)

enum { BLOCK = 8192, KEY = 32, NKEYS = 8, STATUS_CAP = 4096 };

// key fills k with test key i: distinct, not all zero.
static void key(uint8_t *k, int i, int salt) {
	for (int j = 0; j < KEY; j++) {
		k[j] = (uint8_t)(i * 31 + j * 7 + salt * 131 + 1);
	}
}

static void payload(uint8_t *p, int i) {
	for (int j = 0; j < BLOCK; j++) {
		p[j] = (uint8_t)(i ^ (j * 13));
	}
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// wait_result waits on the tier's eventfd with poll(2) and polls until it
// has the result of req, which it copies to *out with its statuses.
static int wait_result(ut_tier t, uint64_t req, ut_result *out, uint8_t *statuses) {
	static ut_result res[16];
	static uint8_t status[STATUS_CAP];
	double deadline = now() + 10;
	struct pollfd pfd = {.fd = ut_fd(t), .events = POLLIN};
	while (now() < deadline) {
		int n = ut_poll(t, res, 16, status, STATUS_CAP);
		if (n < 0) {
			return n;
		}
		for (int i = 0; i < n; i++) {
			if (res[i].req == req && res[i].op != UT_OP_RELEASE) {
				*out = res[i];
				memcpy(statuses, status + res[i].first, res[i].keys);
				return 0;
			}
		}
		if (n == 0) {
			poll(&pfd, 1, 100);
		}
	}
	return -1000;
}

static void test_errors(void) {
	CHECK(ut_abi_version() == UT_ABI_VERSION, "abi %d", ut_abi_version());
	const char *unknown = ut_strerror(12345);
	for (int code = UT_OK; code >= UT_EARG; code--) {
		const char *s = ut_strerror(code);
		CHECK(s != NULL && s[0] != 0 && strcmp(s, unknown) != 0, "ut_strerror(%d)", code);
	}
	ut_tier t = 0;
	CHECK(ut_open("/tmp", "namespace=x", &t) == UT_EOPTIONS, "missing block_size");
	CHECK(strstr(ut_last_error(), "block_size") != NULL, "message: %s", ut_last_error());
	CHECK(ut_open("/tmp", "block_size=4096 colour=blue", &t) == UT_EOPTIONS, "unknown option");
	CHECK(strstr(ut_last_error(), "colour") != NULL, "message: %s", ut_last_error());
	CHECK(ut_open("/tmp", "block_size=4096 lookup_timeout=5", &t) == UT_EOPTIONS, "duration without unit");
	CHECK(ut_open("/tmp", "block_size=4096,engine=fast", &t) == UT_EOPTIONS, "bad engine");
	CHECK(ut_open("/tmp", "block_size=4096 namespace=../x", &t) == UT_EOPTIONS, "bad namespace");
	CHECK(ut_open("/proc/version/x", "block_size=4096", &t) == UT_EIO, "directory that cannot be");
	CHECK(ut_open(NULL, "block_size=4096", &t) == UT_EARG, "NULL dir");
	CHECK(t == 0, "no handle on failure");
	CHECK(ut_lookup(987654, 1, NULL, 0, NULL, 0) == UT_EHANDLE, "bogus handle");
	uint8_t st[1];
	CHECK(ut_poll(987654, NULL, 0, st, 1) == UT_EHANDLE, "bogus handle poll");
}

static void test_engine(const char *dir, const char *engine) {
	char opts[256];
	snprintf(opts, sizeof opts, "block_size=%d namespace=c-%s engine=%s depth=4 lookup_timeout=2s", BLOCK, engine,
	         engine);
	ut_tier t = 0;
	int rc = ut_open(dir, opts, &t);
	CHECK(rc == UT_OK && t != 0, "ut_open %s: %d", opts, rc);
	if (rc != UT_OK) {
		return;
	}
	char json[4096];
	int n = ut_engine(t, json, sizeof json);
	char want[64];
	snprintf(want, sizeof want, "\"kind\":\"%s\"", engine);
	CHECK(n > 0 && n < (int)sizeof json && strstr(json, want) != NULL, "engine json %s", json);

	// Store NKEYS/2 blocks from malloc'd memory.
	uint8_t keys[NKEYS * KEY];
	for (int i = 0; i < NKEYS; i++) {
		key(keys + i * KEY, i, engine[0]);
	}
	void *bufs[NKEYS];
	for (int i = 0; i < NKEYS; i++) {
		CHECK(posix_memalign(&bufs[i], 4096, BLOCK) == 0, "memalign");
		payload(bufs[i], i);
	}
	ut_result r;
	uint8_t st[NKEYS];
	CHECK(ut_store(t, 1, keys, NKEYS / 2 * KEY, NULL, NKEYS / 2, (const void *const *)bufs, BLOCK) == UT_OK,
	      "store");
	CHECK(wait_result(t, 1, &r, st) == 0, "store result");
	CHECK(r.op == UT_OP_STORE && r.keys == NKEYS / 2 && r.prefix == NKEYS / 2 && r.held == 0, "store result %u %u %u",
	      r.op, r.keys, r.prefix);
	for (int i = 0; i < NKEYS / 2; i++) {
		CHECK(st[i] == UT_STORED, "key %d stored: %d", i, st[i]);
	}

	// Lookup: the first half exists, the second does not.
	CHECK(ut_lookup(t, 2, keys, sizeof keys, NULL, NKEYS) == UT_OK, "lookup");
	CHECK(wait_result(t, 2, &r, st) == 0, "lookup result");
	CHECK(r.op == UT_OP_LOOKUP && r.keys == NKEYS && r.prefix == NKEYS / 2, "lookup prefix %u", r.prefix);
	for (int i = 0; i < NKEYS; i++) {
		CHECK(st[i] == (i < NKEYS / 2 ? UT_FOUND : UT_MISSING), "key %d: %d", i, st[i]);
	}
	// Variable key sizes: one 16-byte key and one 32-byte key.
	uint32_t sizes[2] = {16, 32};
	CHECK(ut_lookup(t, 3, keys, 48, sizes, 2) == UT_OK, "lookup with sizes");
	CHECK(wait_result(t, 3, &r, st) == 0 && r.keys == 2 && st[0] == UT_MISSING && st[1] == UT_MISSING,
	      "sized keys: %d %d", st[0], st[1]);
	CHECK(ut_lookup(t, 4, keys, 47, sizes, 2) == UT_EINVAL, "sizes that do not add up");
	CHECK(ut_lookup(t, 4, keys, 21, NULL, 2) == UT_EINVAL, "21 bytes do not split into 2 keys");

	// Lookup prefix: a miss first, so the rest may be skipped.
	CHECK(ut_lookup_prefix(t, 5, keys + (NKEYS - 1) * KEY, KEY, NULL, 1) == UT_OK, "lookup prefix");
	CHECK(wait_result(t, 5, &r, st) == 0 && r.prefix == 0 && st[0] == UT_MISSING, "prefix miss");

	// Load into zeroed buffers; check the bytes.
	for (int i = 0; i < NKEYS; i++) {
		memset(bufs[i], 0, BLOCK);
	}
	CHECK(ut_load(t, 6, keys, NKEYS / 2 * KEY, NULL, NKEYS / 2, bufs, BLOCK) == UT_OK, "load");
	CHECK(wait_result(t, 6, &r, st) == 0 && r.op == UT_OP_LOAD && r.prefix == NKEYS / 2, "load result");
	uint8_t want_payload[BLOCK];
	for (int i = 0; i < NKEYS / 2; i++) {
		payload(want_payload, i);
		CHECK(st[i] == UT_LOADED && memcmp(bufs[i], want_payload, BLOCK) == 0, "key %d loaded: %d", i, st[i]);
	}

	// Delete two stored blocks and one never stored; the loads after it,
	// which go to the filesystem whatever the lookup cache says, miss
	// exactly the deleted ones.
	uint8_t del[3 * KEY];
	memcpy(del, keys, 2 * KEY);
	memcpy(del + 2 * KEY, keys + (NKEYS - 1) * KEY, KEY);
	CHECK(ut_delete(t, 8, del, sizeof del, NULL, 3) == UT_OK, "delete");
	CHECK(wait_result(t, 8, &r, st) == 0, "delete result");
	CHECK(r.op == UT_OP_DELETE && r.keys == 3 && r.prefix == 2 && r.held == 0, "delete result op %u keys %u prefix %u",
	      r.op, r.keys, r.prefix);
	CHECK(st[0] == UT_DELETED && st[1] == UT_DELETED && st[2] == UT_MISSING, "delete statuses %d %d %d", st[0], st[1],
	      st[2]);
	CHECK(UT_OK_STATUS(st[0]) && !UT_OK_STATUS(st[2]), "UT_OK_STATUS of deleted and missing");
	CHECK(ut_load(t, 9, keys, NKEYS / 2 * KEY, NULL, NKEYS / 2, bufs, BLOCK) == UT_OK, "load after delete");
	CHECK(wait_result(t, 9, &r, st) == 0 && r.op == UT_OP_LOAD, "load after delete result");
	for (int i = 0; i < NKEYS / 2; i++) {
		CHECK(st[i] == (i < 2 ? UT_MISSING : UT_LOADED), "key %d after delete: %d", i, st[i]);
	}
	CHECK(ut_delete(t, 9, keys, 4, NULL, 1) == UT_EINVAL, "delete of a 4-byte key");
	uint32_t del_sizes[2] = {KEY, KEY};
	CHECK(ut_delete(t, 9, keys, KEY, del_sizes, 2) == UT_EINVAL, "delete: key sizes past keys_size");

	// Bad requests.
	CHECK(ut_load(t, 7, keys, KEY, NULL, 1, bufs, BLOCK - 1) == UT_EINVAL, "wrong buffer size");
	CHECK(strstr(ut_last_error(), "block size") != NULL, "message: %s", ut_last_error());
	CHECK(ut_load(t, 7, keys, KEY, NULL, 1, NULL, BLOCK) == UT_EARG, "NULL buffers");
	CHECK(ut_lookup(t, 7, keys, 4, NULL, 1) == UT_EINVAL, "4-byte key");
	CHECK(ut_lookup(t, 7, keys, KEY, NULL, 5000) == UT_EINVAL, "more than batch_max");

	// Depth 4: the fifth request in flight is refused; a request ID in flight too.
	for (uint64_t req = 10; req < 14; req++) {
		CHECK(ut_lookup(t, req, keys, KEY, NULL, 1) == UT_OK, "lookup %lu", (unsigned long)req);
	}
	CHECK(ut_lookup(t, 14, keys, KEY, NULL, 1) == UT_EBUSY, "depth full");
	CHECK(ut_lookup(t, 13, keys, KEY, NULL, 1) == UT_EINVAL, "request ID in flight");
	CHECK(strstr(ut_last_error(), "in flight") != NULL, "message: %s", ut_last_error());
	// Poll them all, with a status array too small for 2: one at a time.
	ut_result res[8];
	uint8_t small[1];
	int got = 0;
	double deadline = now() + 10;
	while (got < 4 && now() < deadline) {
		int k = ut_poll(t, res, 8, small, 1);
		CHECK(k >= 0 && k <= 1, "poll into 1 status: %d", k);
		got += k > 0 ? k : 0;
		if (k == 0) {
			usleep(1000);
		}
	}
	CHECK(got == 4, "polled %d", got);
	// A result of 2 keys does not fit a status array of 1: UT_ERANGE until
	// the caller gives more room, and the result is not lost.
	CHECK(ut_lookup(t, 20, keys, 2 * KEY, NULL, 2) == UT_OK, "lookup of 2");
	int k = 0;
	for (deadline = now() + 10; now() < deadline && (k = ut_poll(t, res, 8, small, 1)) == 0;) {
		usleep(1000);
	}
	CHECK(k == UT_ERANGE, "poll of 2 keys into 1: %d", k);
	CHECK(wait_result(t, 20, &r, st) == 0 && r.keys == 2, "the result after UT_ERANGE");
	CHECK(ut_cancel(t, 12345) == 0, "cancel of a request not in flight");

	ut_gauges g = {.in_flight = 99, .queued = 99, .stuck = 99, .held = 99, .breaker_open = 99};
	CHECK(ut_read_gauges(t, &g) == UT_OK, "gauges");
	CHECK(g.in_flight == 0 && g.queued == 0 && g.stuck == 0 && g.held == 0 && g.breaker_open == 0,
	      "gauges with every result polled: %llu %llu %llu %llu %u", (unsigned long long)g.in_flight,
	      (unsigned long long)g.queued, (unsigned long long)g.stuck, (unsigned long long)g.held, g.breaker_open);
	CHECK(ut_read_gauges(t, NULL) == UT_EARG, "gauges into NULL");
	n = ut_stats(t, json, 8);
	CHECK(n > 8 && json[7] == 0, "truncated stats: %d", n);
	n = ut_stats(t, json, sizeof json);
	CHECK(n > 0 && n < (int)sizeof json && strstr(json, "\"lookup\"") && strstr(json, "\"found\""), "stats %s", json);
	CHECK(strstr(json, "\"delete\":{\"requests\":1,\"keys\":3,\"outcomes\":{\"deleted\":2,\"missing\":1}") != NULL,
	      "delete in stats %s", json);

	CHECK(ut_close(t, 5000) == UT_OK, "close");
	CHECK(ut_close(t, 5000) == UT_OK, "second close");
	CHECK(ut_lookup(t, 30, keys, KEY, NULL, 1) == UT_ECLOSED, "lookup after close");
	CHECK(ut_poll(t, res, 8, st, 0) >= 0, "poll after close");
	CHECK(ut_free(t) == UT_OK, "free");
	CHECK(ut_free(t) == UT_EHANDLE, "second free");
	CHECK(ut_lookup(t, 31, keys, KEY, NULL, 1) == UT_EHANDLE, "lookup after free");
	for (int i = 0; i < NKEYS; i++) {
		free(bufs[i]);
	}
}

// json_int returns the integer after "name": in json, or -1.
static long long json_int(const char *json, const char *name) {
	char pat[64];
	snprintf(pat, sizeof pat, "\"%s\":", name);
	const char *p = strstr(json, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

// test_full fills a tier with a capacity of FULL_BLOCKS blocks, whose blocks
// are never old enough to evict, and checks that stores beyond it are
// refused with UT_FULL, writing nothing.
enum { FULL_BLOCKS = 4 };

// test_buffers: a tier's buffers in memory of the caller's (ut_open_buffers).
static void test_buffers(const char *dir, const char *engine) {
	size_t size = ut_buffers_size(BLOCK, 2);
	CHECK(size >= 2 * BLOCK + 2 * 4096 && ut_buffers_size(0, 1) == 0, "ut_buffers_size %zu", size);
	uint8_t *mem = aligned_alloc(4096, size + 4096);
	memset(mem, 0xee, size + 4096);
	char opts[256];
	snprintf(opts, sizeof opts, "block_size=%d namespace=b-%s engine=%s", BLOCK, engine, engine);
	ut_tier t = 0;
	CHECK(ut_open_buffers(dir, opts, mem + 1, size, 2, &t) == UT_EOPTIONS, "unaligned memory");
	CHECK(strstr(ut_last_error(), "4 KiB boundary") != NULL, "message: %s", ut_last_error());
	CHECK(ut_open_buffers(dir, opts, mem, size - 1, 2, &t) == UT_EOPTIONS, "short memory");
	CHECK(ut_open_buffers(dir, opts, mem, size, 0, &t) == UT_EARG, "no buffers");
	CHECK(ut_open_buffers(dir, opts, NULL, size, 2, &t) == UT_EARG, "NULL memory");
	int rc = ut_open_buffers(dir, opts, mem, size, 2, &t);
	CHECK(rc == UT_OK, "ut_open_buffers %s: %d", opts, rc);
	if (rc != UT_OK) {
		free(mem);
		return;
	}
	uint8_t *bufs[3] = {0};
	CHECK(ut_buffers(t, (void **)bufs, 1) == 2 && bufs[1] == NULL, "ut_buffers with room for one");
	CHECK(ut_buffers(t, (void **)bufs, 3) == 2, "ut_buffers");
	for (int i = 0; i < 2; i++) {
		CHECK(bufs[i] >= mem + 4096 && bufs[i] + BLOCK <= mem + size && (uintptr_t)bufs[i] % 4096 == 0,
		      "buffer %d at %p, memory %p-%p", i, (void *)bufs[i], (void *)mem, (void *)(mem + size));
	}
	uint8_t k[KEY], want[BLOCK], status[1];
	ut_result r;
	key(k, 5, 'b');
	payload(want, 5);
	memcpy(bufs[0], want, BLOCK);
	CHECK(ut_store(t, 1, k, KEY, NULL, 1, (const void *const *)bufs, BLOCK) == UT_OK, "store");
	CHECK(wait_result(t, 1, &r, status) == 0 && status[0] == UT_STORED, "stored: %d", status[0]);
	CHECK(ut_load(t, 2, k, KEY, NULL, 1, (void *const *)(bufs + 1), BLOCK) == UT_OK, "load");
	CHECK(wait_result(t, 2, &r, status) == 0 && status[0] == UT_LOADED, "loaded: %d", status[0]);
	CHECK(memcmp(bufs[1], want, BLOCK) == 0, "loaded payload");
	char json[4096];
	ut_engine(t, json, sizeof json);
	CHECK(strstr(json, "\"last_page_apart\":false") != NULL, "a local filesystem counts reads right (%s)", json);
	if (strcmp(engine, "uring") == 0 && strstr(json, "\"direct\":true") && strstr(json, "\"inline\":true") &&
	    strstr(json, "\"loads_sync\":false")) {
		// One read of header and payload: the block's header, which names
		// its key, landed in the 4 KiB in front of the buffer.
		CHECK(memmem(bufs[1] - 4096, 4096, k, KEY) != NULL, "key in the header before buffer 1 (%s)", json);
	}
	CHECK(ut_close(t, 5000) == UT_OK, "close");
	CHECK(ut_buffers(t, (void **)bufs, 3) == UT_ECLOSED, "ut_buffers after close");
	CHECK(memcmp(bufs[1], want, BLOCK) == 0, "the memory is still the caller's");
	CHECK(ut_free(t) == UT_OK, "free");
	free(mem);
	CHECK(ut_open(dir, opts, &t) == UT_OK && ut_buffers(t, (void **)bufs, 3) == 0, "no buffers with ut_open");
	CHECK(ut_close(t, 5000) == UT_OK && ut_free(t) == UT_OK, "close and free");
}

static void test_full(const char *dir, const char *engine) {
	char opts[256];
	// Raw blocks: a block file is exactly BLOCK bytes, so the capacity is
	// FULL_BLOCKS files.
	snprintf(opts, sizeof opts,
	         "block_size=%d format=raw namespace=c-full-%s engine=%s capacity=%d evict_min_age=1h evict_interval=20ms",
	         BLOCK, engine, engine, FULL_BLOCKS * BLOCK);
	ut_tier t = 0;
	int rc = ut_open(dir, opts, &t);
	CHECK(rc == UT_OK, "ut_open %s: %d", opts, rc);
	if (rc != UT_OK) {
		return;
	}
	enum { N = FULL_BLOCKS + 2 };
	uint8_t keys[N * KEY];
	void *bufs[N];
	for (int i = 0; i < N; i++) {
		key(keys + i * KEY, i, 'f');
		bufs[i] = malloc(BLOCK);
		payload(bufs[i], i);
	}
	// Until its evictor has first counted the namespace, a tier on a
	// filesystem fuller than its capacity refuses stores.
	char json[8192];
	for (double deadline = now() + 10; now() < deadline;) {
		int n = ut_stats(t, json, sizeof json);
		CHECK(n > 0 && n < (int)sizeof json, "stats: %d", n);
		if (json_int(json, "scans") >= 1) {
			break;
		}
		usleep(10000);
	}
	CHECK(json_int(json, "scans") >= 1, "never counted: %s", json);
	ut_result r;
	uint8_t st[N];
	CHECK(ut_store(t, 1, keys, FULL_BLOCKS * KEY, NULL, FULL_BLOCKS, (const void *const *)bufs, BLOCK) == UT_OK,
	      "store up to the capacity");
	CHECK(wait_result(t, 1, &r, st) == 0 && r.prefix == FULL_BLOCKS, "stored %u of %d", r.prefix, FULL_BLOCKS);

	// Wait until the tier has counted them (its own stores, or its
	// evictor's scan).
	long long usage = -1, limit = -1;
	for (double deadline = now() + 10; now() < deadline;) {
		int n = ut_stats(t, json, sizeof json);
		CHECK(n > 0 && n < (int)sizeof json, "stats: %d", n);
		usage = json_int(json, "usage");
		limit = json_int(json, "capacity_limit");
		if (usage >= FULL_BLOCKS * BLOCK) {
			break;
		}
		usleep(10000);
	}
	CHECK(limit == FULL_BLOCKS * BLOCK, "capacity_limit %lld in %s", limit, json);
	CHECK(usage >= FULL_BLOCKS * BLOCK, "usage %lld never reached %d: %s", usage, FULL_BLOCKS * BLOCK, json);

	// Beyond the capacity: refused before writing.
	CHECK(ut_store(t, 2, keys + FULL_BLOCKS * KEY, (N - FULL_BLOCKS) * KEY, NULL, N - FULL_BLOCKS,
	               (const void *const *)(bufs + FULL_BLOCKS), BLOCK) == UT_OK,
	      "store beyond the capacity");
	CHECK(wait_result(t, 2, &r, st) == 0 && r.op == UT_OP_STORE && r.prefix == 0, "full store result prefix %u",
	      r.prefix);
	for (int i = 0; i < N - FULL_BLOCKS; i++) {
		CHECK(st[i] == UT_FULL && !UT_OK_STATUS(st[i]), "key %d beyond the capacity: %d", FULL_BLOCKS + i, st[i]);
	}
	CHECK(ut_lookup(t, 3, keys, sizeof keys, NULL, N) == UT_OK, "lookup");
	CHECK(wait_result(t, 3, &r, st) == 0 && r.prefix == FULL_BLOCKS, "lookup prefix %u", r.prefix);
	for (int i = FULL_BLOCKS; i < N; i++) {
		CHECK(st[i] == UT_MISSING, "key %d refused, yet %d", i, st[i]);
	}
	int n = ut_stats(t, json, sizeof json);
	CHECK(n > 0 && n < (int)sizeof json && strstr(json, "\"full\":2") != NULL, "full in stats %s", json);
	CHECK(ut_close(t, 5000) == UT_OK && ut_free(t) == UT_OK, "close and free");
	for (int i = 0; i < N; i++) {
		free(bufs[i]);
	}
}

static void test_exists(const char *dir) {
	char a[512], paths[2048];
	snprintf(a, sizeof a, "%s/exists-file", dir);
	FILE *f = fopen(a, "w");
	CHECK(f != NULL, "create %s", a);
	if (f) {
		fclose(f);
	}
	// Found, missing, a file used as a directory (ENOTDIR: missing).
	int off = 0;
	off += snprintf(paths + off, sizeof paths - off, "%s", a) + 1;
	off += snprintf(paths + off, sizeof paths - off, "%s/absent", dir) + 1;
	off += snprintf(paths + off, sizeof paths - off, "%s/below", a) + 1;
	uint8_t st[3] = {0};
	CHECK(ut_exists(paths, off, 3, 5000, st) == 1, "one of three exists");
	CHECK(st[0] == UT_FOUND && st[1] == UT_MISSING && st[2] == UT_MISSING, "statuses %d %d %d", st[0], st[1],
	      st[2]);
	CHECK(ut_exists(paths, off, 2, 5000, st) == UT_EARG, "n does not match the paths");
	CHECK(ut_exists(paths, off - 1, 3, 5000, st) == UT_EARG, "last path not NUL-terminated");
	CHECK(ut_exists(NULL, 0, 0, 5000, NULL) == 0, "no paths");
}

// test_fork checks that a child forked after the library was loaded gets
// UT_EFORK at once from every call that would enter the Go runtime, rather
// than hanging in it.
static void test_fork(const char *dir) {
	ut_tier t = 0;
	CHECK(ut_open(dir, "block_size=4096 namespace=c-fork", &t) == UT_OK, "open");
	pid_t pid = fork();
	if (pid == 0) {
		alarm(10); // a hang kills the child, which the parent reports
		uint8_t k[KEY] = {1}, st[1];
		ut_tier t2;
		int bad = 0;
		bad += ut_lookup(t, 1, k, KEY, NULL, 1) != UT_EFORK;
		bad += ut_poll(t, NULL, 0, st, 1) != UT_EFORK;
		bad += ut_open(dir, "block_size=4096", &t2) != UT_EFORK;
		bad += ut_exists("/\0", 2, 1, 100, st) != UT_EFORK;
		bad += ut_close(t, 0) != UT_EFORK;
		bad += strstr(ut_last_error(), "spawn") == NULL;
		_exit(bad);
	}
	CHECK(pid > 0, "fork: %s", strerror(errno));
	int ws = 0;
	CHECK(waitpid(pid, &ws, 0) == pid, "waitpid");
	CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child: status %#x (signal 14 = hung)", ws);
	// The parent is unaffected.
	uint8_t k[KEY] = {1};
	CHECK(ut_lookup(t, 1, k, KEY, NULL, 1) == UT_OK, "parent lookup after fork");
	CHECK(ut_close(t, 5000) == UT_OK && ut_free(t) == UT_OK, "close and free");
}

// test_threads submits from four threads at once while a fifth polls: the
// calls are safe to make concurrently, as the Go API's are.
enum { SUBMITTERS = 4, PER_THREAD = 50 };

struct submitter {
	ut_tier t;
	int id;
	int errors;
};

static void *submit_thread(void *arg) {
	struct submitter *s = arg;
	uint8_t keys[4 * KEY];
	for (int i = 0; i < 4; i++) {
		key(keys + i * KEY, i, 't');
	}
	for (int r = 0; r < PER_THREAD; r++) {
		uint64_t req = (uint64_t)s->id * 1000 + r;
		int rc;
		while ((rc = ut_lookup(s->t, req, keys, sizeof keys, NULL, 4)) == UT_EBUSY) {
			usleep(100);
		}
		s->errors += rc != UT_OK;
	}
	return NULL;
}

static void test_threads(const char *dir) {
	ut_tier t = 0;
	CHECK(ut_open(dir, "block_size=4096 namespace=c-threads depth=16", &t) == UT_OK, "open");
	pthread_t th[SUBMITTERS];
	struct submitter subs[SUBMITTERS];
	for (int i = 0; i < SUBMITTERS; i++) {
		subs[i] = (struct submitter){.t = t, .id = i + 1};
		CHECK(pthread_create(&th[i], NULL, submit_thread, &subs[i]) == 0, "pthread_create");
	}
	static uint8_t seen[SUBMITTERS + 1][PER_THREAD];
	static ut_result res[8];
	static uint8_t st[64];
	int got = 0, bad = 0;
	double deadline = now() + 20;
	while (got < SUBMITTERS * PER_THREAD && now() < deadline) {
		int n = ut_poll(t, res, 8, st, sizeof st);
		for (int i = 0; i < n; i++) {
			int id = (int)(res[i].req / 1000), r = (int)(res[i].req % 1000);
			bad += id < 1 || id > SUBMITTERS || r >= PER_THREAD || seen[id][r]++ || res[i].keys != 4;
			for (uint32_t k = 0; k < res[i].keys; k++) {
				bad += st[res[i].first + k] != UT_MISSING;
			}
		}
		got += n > 0 ? n : 0;
		if (n == 0) {
			usleep(100);
		}
	}
	for (int i = 0; i < SUBMITTERS; i++) {
		pthread_join(th[i], NULL);
		CHECK(subs[i].errors == 0, "submitter %d: %d errors", i, subs[i].errors);
	}
	CHECK(got == SUBMITTERS * PER_THREAD && bad == 0, "%d results, %d wrong", got, bad);
	CHECK(ut_close(t, 5000) == UT_OK && ut_free(t) == UT_OK, "close and free");
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: ctest DIR [ENGINE...]\n");
		return 2;
	}
	test_errors();
	if (argc == 2) {
		test_engine(argv[1], "sync");
		test_engine(argv[1], "uring");
		test_full(argv[1], "sync");
		test_full(argv[1], "uring");
		test_buffers(argv[1], "sync");
		test_buffers(argv[1], "uring");
	}
	for (int i = 2; i < argc; i++) {
		test_engine(argv[1], argv[i]);
		test_full(argv[1], argv[i]);
		test_buffers(argv[1], argv[i]);
	}
	test_exists(argv[1]);
	test_threads(argv[1]);
	test_fork(argv[1]);
	printf("%d passed, %d failed\n", passed, failed);
	return failed > 0;
}
