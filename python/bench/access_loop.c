// The merged design of the reference problem: a C loop calling access()
// once per path, called from a Python lookup thread through ctypes.CDLL,
// which releases the GIL for the whole batch. scheduler.py builds this file
// into a shared library with the system's cc.
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

// batch_access checks n paths stored back to back, each NUL-terminated, and
// writes out[i] = 1 if path i exists, else 0. It returns how many exist.
size_t batch_access(const char *paths, size_t n, uint8_t *out) {
	size_t found = 0;
	for (size_t i = 0; i < n; i++) {
		out[i] = access(paths, F_OK) == 0;
		found += out[i];
		paths += strlen(paths) + 1;
	}
	return found;
}
