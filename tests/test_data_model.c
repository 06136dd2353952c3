/*
 * Tests of `isokv run` on the bundled trained model (data/models/stories260K/), through the
 * isokv binary (IKV_BIN, set by CTest) exactly as a user runs it:
 *   - with no --model and no prompt, greedy, it prints llama2.c's published stories260K sample,
 *     which the test reads from data/models/README.md (not from a copy of it);
 *   - greedy output equals run.c's for several prompts and lengths, the expected outputs stored
 *     under tests/data/runc-stories260K/ (made by scripts/parity_runc.sh --save, independently
 *     of this engine), at 1 and 2 threads;
 *   - the empty prompt, IKV_DATA_DIR, and the error when the bundled files are missing.
 * Children run through fork/execve with an argument vector (no shell).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *bin(void) {
    const char *b = getenv("IKV_BIN");
    return b && *b ? b : "build/isokv";
}

static char outp[256], errp[256];

/* Runs argv (argv[0] is replaced by the isokv binary) with stdout and stderr captured into
 * outp/errp; env_set "NAME=VALUE" (or NULL) is added to the environment, env_unset removed.
 * Returns the exit status, or -1 if the child did not exit normally. */
static int run_isokv(char **argv, const char *env_set, const char *env_unset) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0) _exit(126);
        dup2(o, 1), dup2(e, 2);
        if (env_unset) unsetenv(env_unset);
        if (env_set) putenv((char *)env_set);
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        argv[0] = (char *)bin();
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The whole file at path (NUL-terminated; *n its length without the NUL). */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    assert_non_null(b);
    for (size_t k; (k = fread(b + len, 1, cap - len - 1, f)) > 0;) {
        len += k;
        if (len + 1 == cap) b = realloc(b, cap *= 2);
        assert_non_null(b);
    }
    fclose(f);
    b[len] = 0;
    if (n) *n = len;
    return b;
}

/* The published greedy sample in data/models/README.md: the block indented by four spaces
 * after the line that ends in "prints", lines joined with newlines. */
static char *published_sample(void) {
    char *readme = slurp("data/models/README.md", NULL);
    assert_non_null(readme);
    char *p = strstr(readme, "prints\n");
    assert_non_null(p);
    p += strlen("prints\n");
    while (*p == '\n')
        p++;
    char *out = malloc(strlen(p) + 2);
    size_t len = 0;
    while (!strncmp(p, "    ", 4)) {
        char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) - 4 : strlen(p) - 4;
        memcpy(out + len, p + 4, l);
        len += l;
        out[len++] = '\n';
        if (!nl) break;
        p = nl + 1;
    }
    out[len] = 0;
    free(readme);
    assert_true(len > 500); /* four paragraphs of story */
    return out;
}

/* llama2.c's doc/stories260K.md: `./run stories260K.bin -z tok512.bin -t 0.0` (256 steps, empty
 * prompt) prints the sample. run.c's 256 positions sample 256 tokens after BOS, which is
 * isokv's -n 256 (-n counts generated tokens); the defaults are the bundled model and its
 * tokenizer, and the empty prompt. */
static void test_published_stories260K_sample(void **st) {
    (void)st;
    char *want = published_sample();
    char *argv[] = {"isokv", "run", "--temp", "0", "-n", "256", NULL};
    assert_int_equal(run_isokv(argv, NULL, "IKV_DATA_DIR"), 0);
    size_t n;
    char *got = slurp(outp, &n);
    assert_string_equal(got, want);
    /* stderr says it generated from BOS alone */
    char *err = slurp(errp, NULL);
    assert_non_null(strstr(err, "prompt 1 tokens"));
    free(err);
    free(got);
    free(want);
}

/* An explicit empty prompt is the default, and one token fewer stops one token earlier. */
static void test_empty_prompt(void **st) {
    (void)st;
    char *a1[] = {"isokv", "run", "--prompt", "", "--temp", "0", "-n", "30", NULL};
    assert_int_equal(run_isokv(a1, NULL, NULL), 0);
    char *x = slurp(outp, NULL);
    char *a2[] = {"isokv", "run", "--temp", "0", "-n", "30", NULL};
    assert_int_equal(run_isokv(a2, NULL, NULL), 0);
    char *y = slurp(outp, NULL);
    assert_string_equal(x, y);
    assert_true(!strncmp(x, "Once upon a time", 16));
    char *a3[] = {"isokv", "run", "--temp", "0", "-n", "29", NULL};
    assert_int_equal(run_isokv(a3, NULL, NULL), 0);
    char *z = slurp(outp, NULL);
    assert_true(strlen(z) < strlen(x) && !strncmp(x, z, strlen(z) - 1));
    free(x), free(y), free(z);
}

/* Greedy parity with llama2.c's run.c on the real model: each stored run.c output must be
 * printed byte for byte by `isokv run --temp 0 -n N` (N from cases.tsv, translated from run.c's
 * positions by the script that made them), at 1 and 2 threads. */
static void test_runc_parity_stories260K(void **st) {
    (void)st;
    char *tsv = slurp("tests/data/runc-stories260K/cases.tsv", NULL);
    assert_non_null(tsv);
    int cases = 0;
    for (char *save = NULL, *line = strtok_r(tsv, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char *f[4] = {line, NULL, NULL, NULL};
        for (int k = 1; k < 4; k++) {
            f[k] = strchr(f[k - 1], '\t');
            assert_non_null(f[k]);
            *f[k]++ = 0;
        }
        char path[512];
        snprintf(path, sizeof path, "tests/data/runc-stories260K/%s", f[0]);
        char *want = slurp(path, NULL);
        assert_non_null(want);
        for (int th = 1; th <= 2; th++) {
            char ths[4];
            snprintf(ths, sizeof ths, "%d", th);
            char *argv[] = {"isokv",       "run",
                            "--model",     "data/models/stories260K/stories260K.bin",
                            "--tokenizer", "data/models/stories260K/tok512.bin",
                            "--prompt",    f[3],
                            "--temp",      "0",
                            "-n",          f[1],
                            "--threads",   ths,
                            NULL};
            assert_int_equal(run_isokv(argv, NULL, NULL), 0);
            char *got = slurp(outp, NULL);
            if (strcmp(got, want))
                fail_msg("%s (prompt '%s', -n %s, %d threads) differs from run.c:\n%s\nvs\n%s",
                         f[0], f[3], f[1], th, got, want);
            free(got);
        }
        free(want);
        cases++;
    }
    assert_int_equal(cases, 8);
    free(tsv);
}

/* IKV_DATA_DIR replaces the compiled-in data directory; when the model is missing the error
 * names the path it looked for and the way out, and the exit code is 1. */
static void test_data_dir_missing(void **st) {
    (void)st;
    char *argv[] = {"isokv", "run", "-n", "4", NULL};
    assert_int_equal(run_isokv(argv, "IKV_DATA_DIR=/nonexistent-isokv-data", NULL), 1);
    char *err = slurp(errp, NULL);
    assert_non_null(strstr(err, "/nonexistent-isokv-data/models/stories260K/stories260K.bin"));
    assert_non_null(strstr(err, "IKV_DATA_DIR"));
    free(err);
    char *cwd = getcwd(NULL, 0);
    char env[4200];
    snprintf(env, sizeof env, "IKV_DATA_DIR=%s/data", cwd);
    assert_int_equal(run_isokv(argv, env, NULL), 0);
    free(cwd);
    /* --help says what -n counts and where the default model is */
    char *help[] = {"isokv", "run", "--help", NULL};
    assert_int_equal(run_isokv(help, NULL, NULL), 0);
    char *h = slurp(outp, NULL);
    assert_non_null(strstr(h, "-n counts GENERATED tokens"));
    assert_non_null(strstr(h, "stories260K.bin"));
    free(h);
}

static int setup(void **st) {
    (void)st;
    const char *src = getenv("IKV_SOURCE_DIR");
    if (src && chdir(src)) return -1;
    snprintf(outp, sizeof outp, "/tmp/isokv_test_data_model_%ld.out", (long)getpid());
    snprintf(errp, sizeof errp, "/tmp/isokv_test_data_model_%ld.err", (long)getpid());
    return 0;
}

static int teardown(void **st) {
    (void)st;
    unlink(outp);
    unlink(errp);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_stories260K_sample),
        cmocka_unit_test(test_empty_prompt),
        cmocka_unit_test(test_runc_parity_stories260K),
        cmocka_unit_test(test_data_dir_missing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
