/*
 * Helpers shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.c, docs/fuzzing.md).
 *
 * The loaders under test take file names, so a harness writes its input to a scratch file of
 * its own (one per process and harness, on tmpfs when /dev/shm exists) and hands over the path.
 * The same harness code runs under libFuzzer (clang, -fsanitize=fuzzer) and under the replay
 * driver (replay_main.c, gcc + ASan/UBSan in the normal sanitizer build), which is how `make
 * test-asan` replays every corpus and regression input.
 */
#ifndef ISOKV_FUZZ_UTIL_H
#define ISOKV_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes data to this process's scratch file for `tag` and returns its path (static storage),
 * or NULL if it cannot be written (the harness then skips the input). */
static inline const char *fuzz_write_file(const char *tag, const uint8_t *data, size_t size) {
    static char path[512];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(path, sizeof path, "%s/isokv-fuzz-%s-%ld", dir, tag, (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    int bad = size && fwrite(data, 1, size, f) != size;
    bad |= fclose(f) != 0;
    return bad ? NULL : path;
}

/* A NUL-terminated copy of at most max bytes of data (caller frees). */
static inline char *fuzz_string(const uint8_t *data, size_t size, size_t max) {
    size_t n = size < max ? size : max;
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, data, n);
    s[n] = 0;
    return s;
}

/* A small deterministic choice from the input (its length and last byte), so option variants
 * are explored without taking bytes away from the format under test. */
static inline unsigned fuzz_pick(const uint8_t *data, size_t size, unsigned n) {
    unsigned h = (unsigned)size * 2654435761u;
    if (size) h ^= data[size - 1];
    return n ? h % n : 0;
}

#endif
