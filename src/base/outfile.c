/*
 * Atomic output files: every file one command writes appears complete, all together, or not at
 * all, and an output path never destroys something that is not a regular file.
 *
 *     ikv_outset_create(&s);
 *     ikv_outset_add(s, "a.csv", &fa, NULL);     target checked, temp ".a.csv.tmp.<pid>.<n>"
 *     ikv_outset_add(s, "a.json", &fb, NULL);    created beside it, in the same directory
 *     ... write fa, fb (or let a child program write the temp whose name *tmp gives) ...
 *     ikv_outset_commit(s);                      close all (checking every error), then rename
 *     ikv_outset_destroy(s);                     every temp over its target; destroy removes
 *                                                the temps of a set that was not committed
 *
 * Target rules, checked when a path is added (so a bad path fails before any work is done):
 *   - missing: created (its directory must exist);
 *   - a regular file: replaced (its permission bits are kept);
 *   - a symbolic link to a regular file: the file it points to is replaced and the link stays,
 *     as if written through the link; a dangling link is refused;
 *   - anything else (a device such as /dev/null, a directory, a FIFO, a socket): refused with
 *     an error that names the kind, because renaming over it would replace the node;
 *   - the same file twice in one set (same name, or another name of the same file: a symlink,
 *     a hard link, "./x" and "x"): refused, since one output would overwrite the other.
 *
 * All-or-nothing: the writing, where disks fill and quotas bite, happens on temporary files;
 * only when every one of them has been flushed and closed without error are they renamed, one
 * after the other (a rename within one directory does not write data). A failure anywhere
 * before that removes every temporary and leaves every target as it was. Not for hot paths:
 * each call allocates.
 */
#include "isokv/base.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_OUTPUTS 16

typedef struct outfile {
    char *path;  /* as given (for messages) */
    char *final; /* the file renamed over: path, or the regular file a symlink points to */
    char *canon; /* canonical name (realpath of its directory + base name), for same-file checks */
    char *tmp;   /* the temporary sibling of final */
    FILE *f;     /* stream on tmp, or NULL when the caller writes tmp by name */
    int exists;
    dev_t dev;
    ino_t ino;
} outfile;

struct ikv_outset {
    outfile o[MAX_OUTPUTS];
    size_t n;
    int committed;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = ikv_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* The kind of a non-regular file, for messages. */
static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

/* Splits path into a freshly allocated directory ("." when none) and a pointer to its base
 * name inside path. NULL when out of memory. */
static char *dir_of(const char *path, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!slash) return dup_str(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = ikv_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

/* The canonical name of `final` into *out: realpath of its directory, then its base name.
 * Returns 0, IKV_EIO (the directory cannot be resolved) or IKV_ENOMEM, with the error set. */
static int canonical(const char *given, const char *final, char **out) {
    const char *base;
    char *dir = dir_of(final, &base), *real = NULL;
    int rc = 0;
    *out = NULL;
    if (!dir) return ikv_error(IKV_ENOMEM, "out of memory");
    real = realpath(dir, NULL);
    if (!real) {
        rc = ikv_error(IKV_EIO, "%s: cannot write in directory '%s': %s", given, dir,
                       strerror(errno));
    } else {
        size_t n = strlen(real) + strlen(base) + 2;
        *out = ikv_malloc(n);
        if (*out)
            snprintf(*out, n, "%s/%s", strcmp(real, "/") ? real : "", base);
        else
            rc = ikv_error(IKV_ENOMEM, "out of memory");
    }
    free(real); /* from realpath: libc's malloc */
    ikv_free(dir);
    return rc;
}

int ikv_outset_create(ikv_outset **out) {
    ikv_outset *s = ikv_calloc(1, sizeof *s);
    if (!s) return ikv_error(IKV_ENOMEM, "out of memory");
    *out = s;
    return 0;
}

/* Creates the temporary sibling of o->final with mode 0666 less the umask (the mode of the
 * replaced file when there is one); O_EXCL, so an existing name is never reused. */
static int make_temp(outfile *o, mode_t keep_mode) {
    const char *base;
    char *dir = dir_of(o->final, &base);
    if (!dir) return ikv_error(IKV_ENOMEM, "out of memory");
    size_t n = strlen(dir) + strlen(base) + 64;
    o->tmp = ikv_malloc(n);
    if (!o->tmp) {
        ikv_free(dir);
        return ikv_error(IKV_ENOMEM, "out of memory");
    }
    static atomic_uint counter; /* sets may be filled on several threads */
    int fd = -1, err = 0;
    for (int tries = 0; tries < 1000 && fd < 0; tries++) {
        snprintf(o->tmp, n, "%s/.%s.tmp.%ld.%u", dir, base, (long)getpid(),
                 atomic_fetch_add(&counter, 1u));
        fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        err = errno;
        if (fd < 0 && err != EEXIST) break;
    }
    if (fd < 0) {
        int rc = ikv_error(IKV_EIO, "%s: cannot create a temporary file in '%s': %s", o->path, dir,
                           strerror(err));
        ikv_free(dir);
        ikv_free(o->tmp);
        o->tmp = NULL;
        return rc;
    }
    ikv_free(dir);
    if (keep_mode) (void)fchmod(fd, keep_mode & 07777);
    close(fd);
    return 0;
}

static void outfile_free(outfile *o) {
    ikv_free(o->path);
    ikv_free(o->final);
    ikv_free(o->canon);
    ikv_free(o->tmp);
    memset(o, 0, sizeof *o);
}

int ikv_outset_add(ikv_outset *s, const char *path, FILE **f, const char **tmp) {
    IKV_ASSERT(s && path && !s->committed);
    if (s->n == MAX_OUTPUTS) return ikv_error(IKV_ERANGE, "%s: too many outputs in one set", path);
    if (!*path) return ikv_error(IKV_EINVAL, "an output file name is empty");
    outfile *o = &s->o[s->n];
    memset(o, 0, sizeof *o);
    struct stat st, lst;
    mode_t keep = 0;
    int rc = 0;
    if (!(o->path = dup_str(path))) return ikv_error(IKV_ENOMEM, "out of memory");
    if (lstat(path, &lst) == 0) {
        char *real = NULL;
        if (S_ISLNK(lst.st_mode)) {
            if (stat(path, &st) != 0) {
                rc = ikv_error(IKV_EIO,
                               "%s: is a symbolic link to a missing file; refusing to "
                               "write through it",
                               path);
                goto fail;
            }
            if (!S_ISREG(st.st_mode)) {
                rc = ikv_error(IKV_EINVAL,
                               "%s: is a symbolic link to %s, not a regular file; outputs are "
                               "written to a temporary file and renamed, which would replace it",
                               path, kind_of(st.st_mode));
                goto fail;
            }
            real = realpath(path, NULL);
            if (!real) {
                rc = ikv_error(IKV_EIO, "%s: cannot resolve the symbolic link: %s", path,
                               strerror(errno));
                goto fail;
            }
        } else if (!S_ISREG(lst.st_mode)) {
            rc = ikv_error(IKV_EINVAL,
                           "%s: is %s, not a regular file; outputs are written to a temporary "
                           "file and renamed, which would replace it",
                           path, kind_of(lst.st_mode));
            goto fail;
        } else {
            st = lst;
        }
        o->final = dup_str(real ? real : path);
        free(real);
        if (!o->final) {
            rc = ikv_error(IKV_ENOMEM, "out of memory");
            goto fail;
        }
        o->exists = 1;
        o->dev = st.st_dev;
        o->ino = st.st_ino;
        keep = st.st_mode;
    } else if (errno != ENOENT) {
        rc = ikv_error(IKV_EIO, "%s: %s", path, strerror(errno));
        goto fail;
    } else if (!(o->final = dup_str(path))) {
        rc = ikv_error(IKV_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = canonical(path, o->final, &o->canon))) goto fail;
    for (size_t i = 0; i < s->n; i++) {
        const outfile *p = &s->o[i];
        if (!strcmp(p->canon, o->canon) ||
            (p->exists && o->exists && p->dev == o->dev && p->ino == o->ino)) {
            rc = ikv_error(IKV_EEXIST, "%s and %s are the same file; each output needs its own",
                           p->path, path);
            goto fail;
        }
    }
    if ((rc = make_temp(o, keep))) goto fail;
    if (f) {
        o->f = fopen(o->tmp, "wb");
        if (!o->f) {
            rc = ikv_error(IKV_EIO, "%s: cannot open %s: %s", path, o->tmp, strerror(errno));
            unlink(o->tmp);
            goto fail;
        }
        *f = o->f;
    }
    if (tmp) *tmp = o->tmp;
    s->n++;
    return 0;
fail:
    outfile_free(o);
    return rc;
}

int ikv_outset_commit(ikv_outset *s) {
    IKV_ASSERT(s && !s->committed);
    int rc = 0;
    for (size_t i = 0; i < s->n; i++) {
        outfile *o = &s->o[i];
        if (!o->f) continue;
        int bad = fflush(o->f) != 0 || ferror(o->f);
        int e = errno;
        if (fclose(o->f) != 0 && !bad) bad = 1, e = errno;
        o->f = NULL;
        if (bad && !rc)
            rc = ikv_error(IKV_EIO, "%s: write failed: %s", o->path, strerror(e ? e : EIO));
    }
    if (rc) return rc; /* destroy removes every temporary */
    for (size_t i = 0; i < s->n; i++) {
        outfile *o = &s->o[i];
        if (rename(o->tmp, o->final) != 0) {
            int e = errno;
            if (i == 0)
                rc = ikv_error(IKV_EIO, "%s: cannot rename %s into place: %s", o->path, o->tmp,
                               strerror(e));
            else
                rc = ikv_error(IKV_EIO,
                               "%s: cannot rename %s into place: %s (%zu earlier output(s), "
                               "from %s, were already replaced)",
                               o->path, o->tmp, strerror(e), i, s->o[0].path);
            for (size_t j = 0; j < i; j++) {
                ikv_free(s->o[j].tmp); /* renamed: nothing left to remove */
                s->o[j].tmp = NULL;
            }
            return rc;
        }
        ikv_free(o->tmp);
        o->tmp = NULL;
    }
    s->committed = 1;
    return 0;
}

size_t ikv_outset_count(const ikv_outset *s) {
    return s ? s->n : 0;
}

void ikv_outset_destroy(ikv_outset *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        outfile *o = &s->o[i];
        if (o->f) fclose(o->f);
        if (o->tmp) unlink(o->tmp);
        outfile_free(o);
    }
    ikv_free(s);
}

int ikv_output_check(const char *path) {
    ikv_outset *s = NULL;
    int rc = ikv_outset_create(&s);
    if (rc) return rc;
    rc = ikv_outset_add(s, path, NULL, NULL);
    ikv_outset_destroy(s);
    return rc;
}
