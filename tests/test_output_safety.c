/*
 * Regression tests for the output-safety defects of issue 9, through the isokv binary (IKV_BIN)
 * as a user (or an attacker choosing flag values) runs it:
 *   1. `sim sweep --out DIR` ran gnuplot through system() with DIR inside quotes: no shell now,
 *      and no system()/popen() anywhere in src/, bench/ or tests/;
 *   2. --title and --out were pasted into the gnuplot script: every user string is escaped, for
 *      the sweep's plot and plan --plot;
 *   3. outputs written as temp + rename replaced devices/FIFOs/symlinks: non-regular targets are
 *      refused (and left as they were), symlinks to regular files are written through;
 *   4. model init -o X --tokenizer-out X overwrote the checkpoint: refused, by any spelling;
 *   5. partial outputs (checkpoint without tokenizer, sweep.csv without sweep.json): the
 *      outputs of one command appear together or not at all.
 * Each child runs in a private temporary directory through fork/execv (no shell); the file size
 * limit (RLIMIT_FSIZE) stands in for a full disk.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static char dir[256], src[4096], outp[512], errp[512];

static const char *bin(void) {
    static char b[4200];
    const char *e = getenv("IKV_BIN");
    if (e && *e) return e;
    snprintf(b, sizeof b, "%s/build/isokv", src);
    return b;
}

static const char *tp(const char *name) {
    static char buf[8][1024];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* Runs isokv with argv (argv[0] replaced) in the temporary directory, stdout and stderr
 * captured; path_prefix (or NULL) is put in front of PATH; fsize (or 0) limits the size of
 * every file the child writes. Returns the exit status, -1 when killed. */
static int run_isokv(char **argv, const char *path_prefix, long fsize) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0 || chdir(dir)) _exit(126);
        dup2(o, 1), dup2(e, 2);
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        if (path_prefix) {
            char p[8192];
            snprintf(p, sizeof p, "%s:%s", path_prefix, getenv("PATH") ? getenv("PATH") : "");
            setenv("PATH", p, 1);
        }
        if (fsize) {
            struct rlimit r = {(rlim_t)fsize, (rlim_t)fsize};
            signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG */
            setrlimit(RLIMIT_FSIZE, &r);
        }
        argv[0] = (char *)bin();
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static int is_kind(const char *path, mode_t kind) {
    struct stat sb;
    return lstat(path, &sb) == 0 && (sb.st_mode & S_IFMT) == kind;
}

/* Names in directory d (recursively counted files only), to show that nothing was left. */
static int count_files(const char *d) {
    DIR *h = opendir(d);
    if (!h) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(h));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(h);
    return n;
}

static const char *weka(void) {
    static char p[4200];
    snprintf(p, sizeof p, "%s/tests/data/weka_5conv.jsonl.gz", src);
    return p;
}

static int have_gnuplot(void) {
    const char *path = getenv("PATH");
    char buf[4096];
    for (const char *p = path ? path : "/usr/bin"; *p;) {
        size_t l = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/gnuplot", (int)l, p);
        if (l && access(buf, X_OK) == 0) return 1;
        p += l;
        if (*p) p++;
    }
    return 0;
}

/* ---- 1. no shell --------------------------------------------------------------------------- */

/* Regression: `--out "x';touch P;'"` ran `touch` through system(). */
static void test_sweep_out_no_shell(void **st) {
    (void)st;
    if (!have_gnuplot()) skip();
    const char *outs[] = {"x';touch P1;'", "y$(touch P2)`touch P3`", "z\";touch P4;\""};
    for (size_t i = 0; i < 3; i++) {
        char *argv[] = {"isokv",
                        "sim",
                        "sweep",
                        (char *)weka(),
                        "--vary",
                        "conversations=1,2",
                        "--capacity-tokens",
                        "50k",
                        "--jobs",
                        "1",
                        "--out",
                        (char *)outs[i],
                        NULL};
        assert_int_equal(run_isokv(argv, NULL, 0), 0);
        char p[1200];
        snprintf(p, sizeof p, "%s/sweep.svg", tp(outs[i]));
        assert_true(is_kind(p, S_IFREG));
        snprintf(p, sizeof p, "%s/sweep.csv", tp(outs[i]));
        assert_true(is_kind(p, S_IFREG));
    }
    assert_false(exists(tp("P1")));
    assert_false(exists(tp("P2")));
    assert_false(exists(tp("P3")));
    assert_false(exists(tp("P4")));
}

/* Regression: no system() or popen() call anywhere in src/, bench/ or tests/ (the project promise:
 * never pass a user string to a shell). Scans the C sources for the call tokens, outside
 * comments. */
static int scan_file(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)ftw;
    size_t l = strlen(path);
    if (flag != FTW_F || l < 3 || (strcmp(path + l - 2, ".c") && strcmp(path + l - 2, ".h")))
        return 0;
    if (strstr(path, "/tests/test_output_safety.c")) return 0; /* its payloads name system() */
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        const char *t = line + strspn(line, " \t");
        if (*t == '*' || !strncmp(t, "//", 2) || !strncmp(t, "/*", 2)) continue; /* comments */
        char *c = strstr(line, "/*");
        if (c) *c = 0; /* a trailing comment */
        const char *names[] = {"system", "popen"};
        for (int k = 0; k < 2; k++)
            for (const char *p = line; (p = strstr(p, names[k])); p++) {
                const char *q = p + strlen(names[k]);
                while (*q == ' ')
                    q++;
                int ident_before =
                    p > line && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                 (p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= '0' && p[-1] <= '9'));
                if (*q == '(' && !ident_before)
                    fail_msg("%s:%d calls %s(): %s", path, ln, names[k], line);
            }
    }
    fclose(f);
    return 0;
}

static void test_no_system_or_popen_in_sources(void **st) {
    (void)st;
    char p[4200];
    snprintf(p, sizeof p, "%s/src", src);
    assert_int_equal(nftw(p, scan_file, 16, FTW_PHYS), 0);
    snprintf(p, sizeof p, "%s/bench", src);
    assert_int_equal(nftw(p, scan_file, 16, FTW_PHYS), 0);
    snprintf(p, sizeof p, "%s/tests", src);
    assert_int_equal(nftw(p, scan_file, 16, FTW_PHYS), 0);
}

/* ---- 2. gnuplot script strings ------------------------------------------------------------- */

/* Regression: a quote or newline in --title / --out / --plot ran gnuplot's `system`, and a
 * backquote in a double-quoted title ran a shell command. Each string must come out as text. */
static void test_gnuplot_strings_escaped(void **st) {
    (void)st;
    if (!have_gnuplot()) skip();
    const char *title =
        "T1 'q' \"d\" `touch G1` @x \\ \nsystem('touch G2')\n'; system(\"touch G3\") #";
    const char *out = "o'\n`touch G4`";
    char *argv[] = {"isokv",        "sim",       "sweep",
                    (char *)weka(), "--vary",    "conversations=1,2",
                    "--policy",     "lru,value", "--capacity-tokens",
                    "50k",          "--jobs",    "1",
                    "--out",        (char *)out, "--title",
                    (char *)title,  NULL};
    assert_int_equal(run_isokv(argv, NULL, 0), 0);
    char p[1200];
    snprintf(p, sizeof p, "%s/sweep.svg", tp(out));
    const char *svg = slurp(p);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "touch G1")); /* the title is drawn as text */
    snprintf(p, sizeof p, "%s/sweep.png", tp(out));
    assert_true(is_kind(p, S_IFREG));
    /* plan --plot: the path is written into the script too */
    const char *plot = "p'\n`touch G5`\".svg";
    char *pargv[] = {"isokv", "plan", "--plot", (char *)plot, NULL};
    assert_int_equal(run_isokv(pargv, NULL, 0), 0);
    assert_true(is_kind(tp(plot), S_IFREG));
    assert_true(is_kind(tp("p'\n`touch G5`\".png"), S_IFREG));
    const char *g[] = {"G1", "G2", "G3", "G4", "G5"};
    for (int i = 0; i < 5; i++)
        if (exists(tp(g[i]))) fail_msg("%s was created: a script string ran as code", g[i]);
}

/* ---- 3. non-regular targets ---------------------------------------------------------------- */

/* Regression: `-o /dev/null` (here a FIFO, the same code path, harmless to test) was replaced
 * by a regular file by every writer. Each must refuse, name the target and its kind, and leave
 * it as it was; a symlink to a regular file is written through and stays a link. */
static void test_outputs_refuse_non_regular(void **st) {
    (void)st;
    assert_int_equal(mkfifo(tp("fifo"), 0600), 0);
    assert_int_equal(mkdir(tp("adir"), 0700), 0);
    char *gen[] = {"isokv", "gen", "-q", "--requests", "10", "-o", (char *)tp("fifo"), NULL};
    assert_int_equal(run_isokv(gen, NULL, 0), 1);
    assert_non_null(strstr(slurp(errp), "is a FIFO"));
    char *gen2[] = {"isokv", "gen", "-q", "--requests", "10", "-o", (char *)tp("adir"), NULL};
    assert_int_equal(run_isokv(gen2, NULL, 0), 1);
    assert_non_null(strstr(slurp(errp), "is a directory"));
    char *mi[] = {"isokv", "model", "init", "--config", "tiny", "-o", (char *)tp("fifo"), NULL};
    assert_int_equal(run_isokv(mi, NULL, 0), 1);
    assert_non_null(strstr(slurp(errp), "fifo: is a FIFO"));
    char *mt[] = {"isokv",
                  "model",
                  "init",
                  "--config",
                  "tiny",
                  "-o",
                  (char *)tp("m.bin"),
                  "--tokenizer-out",
                  (char *)tp("fifo"),
                  NULL};
    assert_int_equal(run_isokv(mt, NULL, 0), 1);
    assert_false(exists(tp("m.bin")));
    char *pl[] = {"isokv", "plan", "--plot", (char *)tp("fifo"), NULL};
    assert_int_equal(run_isokv(pl, NULL, 0), 1);
    assert_non_null(strstr(slurp(errp), "is a FIFO"));
    /* a sweep whose sweep.json is a FIFO: refused before any run, nothing written */
    assert_int_equal(mkdir(tp("sw"), 0700), 0);
    assert_int_equal(mkfifo(tp("sw/sweep.json"), 0600), 0);
    char *sw[] = {"isokv",  "sim", "sweep", (char *)weka(),   "--no-plot",
                  "--jobs", "1",   "--out", (char *)tp("sw"), NULL};
    assert_int_equal(run_isokv(sw, NULL, 0), 1);
    assert_non_null(strstr(slurp(errp), "sweep.json: is a FIFO"));
    assert_int_equal(count_files(tp("sw")), 1);
    assert_true(is_kind(tp("sw/sweep.json"), S_IFIFO));
    assert_true(is_kind(tp("fifo"), S_IFIFO));
    assert_true(is_kind(tp("adir"), S_IFDIR));
    /* through a symlink */
    FILE *f = fopen(tp("real.jsonl"), "w");
    fputs("old\n", f);
    fclose(f);
    assert_int_equal(symlink("real.jsonl", tp("link.jsonl")), 0);
    char *gl[] = {"isokv", "gen", "-q", "--requests", "10", "-o", (char *)tp("link.jsonl"), NULL};
    assert_int_equal(run_isokv(gl, NULL, 0), 0);
    assert_true(is_kind(tp("link.jsonl"), S_IFLNK));
    assert_non_null(strstr(slurp(tp("real.jsonl")), "isokv-segments"));
    /* a link to a device is refused as the device would be */
    assert_int_equal(symlink("/dev/null", tp("null.lnk")), 0);
    char *gn[] = {"isokv", "gen", "-q", "--requests", "10", "-o", (char *)tp("null.lnk"), NULL};
    assert_int_equal(run_isokv(gn, NULL, 0), 1);
    assert_non_null(strstr(slurp(errp), "symbolic link to a character device"));
    assert_true(is_kind(tp("null.lnk"), S_IFLNK));
    struct stat sb;
    assert_int_equal(stat("/dev/null", &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
}

/* ---- 4. the same file twice ---------------------------------------------------------------- */

/* Regression: `model init -o X --tokenizer-out X` wrote the tokenizer over the checkpoint. */
static void test_model_init_same_file(void **st) {
    (void)st;
    char dotted[1100];
    snprintf(dotted, sizeof dotted, "%s/./same.bin", dir);
    const char *second[] = {tp("same.bin"), dotted, "same.bin"};
    for (int i = 0; i < 3; i++) {
        char *argv[] = {"isokv",
                        "model",
                        "init",
                        "--config",
                        "tiny",
                        "-o",
                        (char *)tp("same.bin"),
                        "--tokenizer-out",
                        (char *)second[i],
                        NULL};
        assert_int_equal(run_isokv(argv, NULL, 0), 1);
        assert_non_null(strstr(slurp(errp), "same file"));
        assert_false(exists(tp("same.bin")));
    }
    /* an existing checkpoint, named again through a hard link and a symlink: left as it was */
    char *mk[] = {
        "isokv", "model", "init", "--config", "tiny", "--seed", "3", "-o", (char *)tp("keep.bin"),
        NULL};
    assert_int_equal(run_isokv(mk, NULL, 0), 0);
    struct stat before, after;
    assert_int_equal(stat(tp("keep.bin"), &before), 0);
    assert_int_equal(link(tp("keep.bin"), tp("hard.bin")), 0);
    assert_int_equal(symlink("keep.bin", tp("soft.bin")), 0);
    const char *alias[] = {tp("hard.bin"), tp("soft.bin")};
    for (int i = 0; i < 2; i++) {
        char *argv[] = {"isokv",
                        "model",
                        "init",
                        "--config",
                        "tiny",
                        "-o",
                        (char *)tp("keep.bin"),
                        "--tokenizer-out",
                        (char *)alias[i],
                        NULL};
        assert_int_equal(run_isokv(argv, NULL, 0), 1);
        assert_non_null(strstr(slurp(errp), "same file"));
    }
    assert_int_equal(stat(tp("keep.bin"), &after), 0);
    assert_int_equal(before.st_ino, after.st_ino);
    assert_int_equal(before.st_size, after.st_size);
    assert_int_equal(before.st_mtime, after.st_mtime);
}

/* ---- 5. all or nothing --------------------------------------------------------------------- */

/* Regression: model init left the checkpoint when the tokenizer could not be written, and a
 * sweep on a full disk left sweep.csv without sweep.json. */
static void test_outputs_all_or_nothing(void **st) {
    (void)st;
    assert_int_equal(mkdir(tp("an"), 0700), 0);
    /* the tokenizer's directory does not exist: no checkpoint either */
    char *m1[] = {"isokv",
                  "model",
                  "init",
                  "--config",
                  "tiny",
                  "-o",
                  (char *)tp("an/m.bin"),
                  "--tokenizer-out",
                  (char *)tp("an/missing/t.bin"),
                  NULL};
    assert_int_equal(run_isokv(m1, NULL, 0), 1);
    assert_non_null(strstr(slurp(errp), "missing"));
    assert_int_equal(count_files(tp("an")), 0);
    /* a "full disk" (file size limit) while writing: neither file, no temporary */
    char *m2[] = {"isokv",
                  "model",
                  "init",
                  "--config",
                  "tiny",
                  "-o",
                  (char *)tp("an/m.bin"),
                  "--tokenizer-out",
                  (char *)tp("an/t.bin"),
                  NULL};
    assert_int_equal(run_isokv(m2, NULL, 100000), 1);
    assert_non_null(strstr(slurp(errp), "write failed"));
    assert_int_equal(count_files(tp("an")), 0);
    assert_int_equal(run_isokv(m2, NULL, 0), 0); /* and without the limit both appear */
    assert_int_equal(count_files(tp("an")), 2);

    /* sweep: sweep.csv fits under the limit, sweep.json does not; an older sweep.csv stays */
    assert_int_equal(mkdir(tp("full"), 0700), 0);
    FILE *f = fopen(tp("full/sweep.csv"), "w");
    fputs("older\n", f);
    fclose(f);
    char *sw[] = {
        "isokv",     "sim",    "sweep", (char *)weka(), "--vary",           "conversations=1,2,3",
        "--no-plot", "--jobs", "1",     "--out",        (char *)tp("full"), NULL};
    assert_int_equal(run_isokv(sw, NULL, 1500), 1);
    assert_non_null(strstr(slurp(errp), "sweep.json"));
    assert_string_equal(slurp(tp("full/sweep.csv")), "older\n");
    assert_int_equal(count_files(tp("full")), 1);
    assert_int_equal(run_isokv(sw, NULL, 0), 0);
    assert_int_equal(count_files(tp("full")), 2);
    assert_non_null(strstr(slurp(tp("full/sweep.csv")), "token_hit_ratio"));

    /* gnuplot fails after the CSV and JSON are written: none of the four files appears */
    if (have_gnuplot()) {
        assert_int_equal(mkdir(tp("fakebin"), 0700), 0);
        f = fopen(tp("fakebin/gnuplot"), "w");
        fputs("#!/bin/sh\nexit 3\n", f);
        fclose(f);
        chmod(tp("fakebin/gnuplot"), 0700);
        char *sp[] = {"isokv",          "sim", "sweep", (char *)weka(), "--jobs", "1", "--out",
                      (char *)tp("gp"), NULL};
        assert_int_equal(run_isokv(sp, tp("fakebin"), 0), 1);
        assert_non_null(strstr(slurp(errp), "gnuplot failed (exit 3)"));
        assert_false(exists(tp("gp"))); /* the directory it made is removed again, empty */
        char *pp[] = {"isokv", "plan", "--plot", (char *)tp("pl.svg"), NULL};
        assert_int_equal(run_isokv(pp, tp("fakebin"), 0), 1);
        assert_false(exists(tp("pl.svg")));
        assert_false(exists(tp("pl.png")));
    }
}

/* ---- setup --------------------------------------------------------------------------------- */

static int setup(void **st) {
    (void)st;
    const char *s = getenv("IKV_SOURCE_DIR");
    if (s && *s)
        snprintf(src, sizeof src, "%s", s);
    else if (!getcwd(src, sizeof src))
        return -1;
    if (tu_tmpdir(dir, sizeof dir, "output_safety")) return -1;
    snprintf(outp, sizeof outp, "%s.out", dir);
    snprintf(errp, sizeof errp, "%s.err", dir);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    unlink(outp);
    unlink(errp);
    return tu_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep_out_no_shell),
        cmocka_unit_test(test_no_system_or_popen_in_sources),
        cmocka_unit_test(test_gnuplot_strings_escaped),
        cmocka_unit_test(test_outputs_refuse_non_regular),
        cmocka_unit_test(test_model_init_same_file),
        cmocka_unit_test(test_outputs_all_or_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
