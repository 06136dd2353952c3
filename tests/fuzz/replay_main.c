/*
 * The replay driver: a main() that feeds files to a harness's LLVMFuzzerTestOneInput, so the
 * corpora and regression inputs under tests/fuzz/ run in every build (gcc; under ASan/UBSan in
 * `make test-asan`) without clang or libFuzzer. libFuzzer's own main does the same when given
 * files, and much more when given a directory to grow.
 *
 *     fuzz_replay_NAME PATH...     each PATH a file or a directory of files (not recursive)
 *
 * Files in a directory are replayed in name order; names starting with '.' and README* are
 * skipped. A PATH that does not exist is noted and skipped. Exit 0 when every input ran (a
 * crash or sanitizer report aborts the process: the test fails), 1 when no input was found at
 * all (an empty corpus must not pass as a test), 2 on a usage error.
 */
#include "fuzz_util.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n == cap) {
            uint8_t *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "fuzz replay: %s: cannot read\n", path);
        free(buf);
        return -1;
    }
    /* a copy of exactly n bytes, so ASan sees any read past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    size_t total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "fuzz replay: %s: none (skipped)\n", argv[i]);
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i])) return 1;
            total++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "fuzz replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.' || !strncmp(e->d_name, "README", 6)) continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **p = realloc(names, cap * sizeof *p);
                if (!p) return 1;
                names = p;
            }
            names[n] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
            if (!names[n]) return 1;
            sprintf(names[n], "%s/%s", argv[i], e->d_name);
            n++;
        }
        closedir(d);
        if (n) qsort(names, n, sizeof *names, cmp_str);
        for (size_t k = 0; k < n; k++) {
            if (replay_file(names[k])) return 1;
            free(names[k]);
        }
        free(names);
        total += n;
    }
    printf("fuzz replay: %zu input(s) ran cleanly\n", total);
    return total ? 0 : 1;
}
