/*
 * file: one preallocated file of fixed-size slots, the SSD tier. It survives restarts: a
 * process that opens the file finds every complete block an earlier one wrote.
 *
 *     offset 0        superblock (4096 bytes): "IKVSTORE", version, ways, slot bytes, slots,
 *                     data offset, XXH3-64 of those fields
 *     offset 4096     slot headers: nslots x 64 bytes (each the blob header, store.h)
 *     data_off        slot bodies: nslots x (slot_bytes - 64) bytes (token ids + payload)
 *
 * Headers sit together so that a lookup reads one set's W headers (W = 8 ways, 512 bytes) in a
 * single pread; the body is read only on a hit. Placement is set-associative as in mem.c: a
 * put replaces the same (key, scope) in its set, else an empty way, else the way whose header
 * has the oldest write time.
 *
 * Torn writes. A put that overwrites a valid slot first zeroes its header, then writes the
 * body, then the header. A block is readable only when its checksum (over header and body)
 * holds, so a write cut short at any point (kill -9, a full disk) leaves either the old block,
 * no block, or bytes whose checksum fails: never an invalid block that reads as valid. On
 * open every slot with a header is verified; complete ones are counted as `recovered`, the
 * rest zeroed and counted as `dropped`. Nothing is fsynced: this is a cache; after a power
 * loss blocks may be missing, but the checksums still hold every invalid one back.
 *
 * Sharing. Several processes may open one file (nothing is locked): each lookup reads the
 * headers from the file, so blocks another process wrote are found; a block overwritten while
 * being read fails its checksum and is a miss. `resident` is this process's view.
 *
 * Cost: a get is two preads (headers, body), a put three pwrites; page-cache speed when warm.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define WAYS         8
#define SUPER        4096
#define FILE_MAGIC   "IKVSTORE"
#define FILE_VERSION 1u

typedef struct fstore {
    int fd;
    char path[200];
    size_t slot_bytes, body; /* body = slot_bytes - 64 */
    uint64_t nslots, nsets, ways, data_off;
    uint64_t resident, evictions, recovered, dropped;
    uint8_t *scratch; /* one slot, for the recovery scan and check */
} fstore;

static int rd_full(int fd, void *p, size_t n, uint64_t off) {
    uint8_t *b = p;
    while (n) {
        ssize_t r = pread(fd, b, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

static int wr_full(int fd, const void *p, size_t n, uint64_t off) {
    const uint8_t *b = p;
    while (n) {
        ssize_t r = pwrite(fd, b, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

static uint64_t hdr_off(uint64_t slot) {
    return SUPER + slot * IKV_BLOB_HDR;
}
static uint64_t body_off(const fstore *f, uint64_t slot) {
    return f->data_off + slot * f->body;
}

static void super_write(uint8_t *sb, const fstore *f) {
    memset(sb, 0, SUPER);
    memcpy(sb, FILE_MAGIC, 8);
    ikv__wr32(sb + 8, FILE_VERSION);
    ikv__wr32(sb + 12, (uint32_t)f->ways);
    ikv__wr64(sb + 16, f->slot_bytes);
    ikv__wr64(sb + 24, f->nslots);
    ikv__wr64(sb + 32, f->data_off);
    ikv__wr64(sb + 40, XXH3_64bits(sb, 40));
}

/* Verifies every slot with a header: counts recovered ones, zeroes and counts the rest. */
static int recover(fstore *f) {
    uint8_t hdrs[64 * IKV_BLOB_HDR];
    static const uint8_t zero[IKV_BLOB_HDR];
    for (uint64_t s0 = 0; s0 < f->nslots; s0 += 64) {
        uint64_t k = f->nslots - s0 < 64 ? f->nslots - s0 : 64;
        if (rd_full(f->fd, hdrs, k * IKV_BLOB_HDR, hdr_off(s0))) return -1;
        for (uint64_t j = 0; j < k; j++) {
            const uint8_t *h = hdrs + j * IKV_BLOB_HDR;
            int any = 0;
            for (int b = 0; b < IKV_BLOB_HDR && !any; b++)
                any = h[b] != 0;
            if (!any) continue;
            int ok = 0;
            ikv_blob_desc d;
            ikv_key key;
            uint64_t scope;
            size_t len = ikv_blob_bytes(ikv__rd32(h + 8), ikv__rd32(h + 12));
            if (ikv__blob_ident(h, &key, &scope, NULL) && len <= f->slot_bytes &&
                ikv__store_set(key, scope, f->nsets) == (s0 + j) / f->ways) {
                memcpy(f->scratch, h, IKV_BLOB_HDR);
                if (!rd_full(f->fd, f->scratch + IKV_BLOB_HDR, len - IKV_BLOB_HDR,
                             body_off(f, s0 + j)))
                    ok = ikv_blob_parse(f->scratch, len, &d, NULL) == 0 &&
                         ikv_blob_check(f->scratch, len) == 0;
            }
            if (ok) {
                f->recovered++;
            } else {
                if (wr_full(f->fd, zero, IKV_BLOB_HDR, hdr_off(s0 + j))) return -1;
                f->dropped++;
            }
        }
    }
    f->resident = f->recovered;
    return 0;
}

static void file_close(void *impl) {
    fstore *f = impl;
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    ikv_free(f->scratch);
    ikv_free(f);
}

static int file_open(const char *rest, const ikv_store_params *p, void **impl, uint64_t *cap) {
    const char *colon = strrchr(rest, ':');
    if (!colon || colon == rest)
        return ikv_error(IKV_EPARAM, "tier file:%s: expected file:PATH:SIZE", rest);
    uint64_t size;
    if (ikv_parse_size(colon + 1, &size) || size == 0)
        return ikv_error(IKV_EPARAM, "tier file:%s: size '%s' is not a size > 0 (k/M/G)", rest,
                         colon + 1);
    size_t plen = (size_t)(colon - rest);
    fstore *f = ikv_calloc(1, sizeof *f);
    if (!f) return ikv_error(IKV_ENOMEM, "file store");
    f->fd = -1;
    if (plen >= sizeof f->path) {
        file_close(f);
        return ikv_error(IKV_EPARAM, "tier file:%s: path too long", rest);
    }
    memcpy(f->path, rest, plen);
    f->slot_bytes = p->slot_bytes;
    f->body = p->slot_bytes - IKV_BLOB_HDR;
    f->scratch = ikv_malloc(p->slot_bytes);
    if (!f->scratch) {
        file_close(f);
        return ikv_error(IKV_ENOMEM, "file store");
    }
    f->fd = open(f->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        int en = errno;
        file_close(f);
        return ikv_error(IKV_EIO, "tier file:%s: cannot open '%.*s': %s", rest, (int)plen, rest,
                         strerror(en));
    }
    struct stat stt;
    if (fstat(f->fd, &stt)) {
        file_close(f);
        return ikv_error(IKV_EIO, "tier file:%s: cannot stat the file", rest);
    }
    uint8_t sb[SUPER];
    if (stt.st_size == 0) {
        /* a new store: geometry from SIZE */
        uint64_t per = (uint64_t)p->slot_bytes; /* header + body per slot */
        uint64_t nslots = size > 2 * SUPER ? (size - 2 * SUPER) / per : 0;
        if (nslots == 0) {
            file_close(f);
            unlink(f->path);
            return ikv_error(IKV_EPARAM, "tier file:%s: %llu bytes hold no slot of %zu bytes", rest,
                             (unsigned long long)size, p->slot_bytes);
        }
        f->ways = nslots < WAYS ? nslots : WAYS;
        f->nsets = nslots / f->ways;
        f->nslots = f->nsets * f->ways;
        f->data_off = (SUPER + f->nslots * IKV_BLOB_HDR + SUPER - 1) / SUPER * SUPER;
        uint64_t total = f->data_off + f->nslots * f->body;
        int er = posix_fallocate(f->fd, 0, (off_t)total);
        super_write(sb, f);
        if (er || wr_full(f->fd, sb, SUPER, 0)) {
            char path[200];
            memcpy(path, f->path, sizeof path);
            file_close(f);
            unlink(path);
            return ikv_error(IKV_EIO, "tier file:%s: cannot preallocate %llu bytes in '%s': %s",
                             rest, (unsigned long long)total, path, strerror(er ? er : errno));
        }
    } else {
        if ((uint64_t)stt.st_size < SUPER || rd_full(f->fd, sb, SUPER, 0) ||
            memcmp(sb, FILE_MAGIC, 8)) {
            file_close(f);
            return ikv_error(IKV_EIO,
                             "tier file:%s: '%.*s' exists and is not an isokv store "
                             "(no IKVSTORE superblock): refusing to overwrite it",
                             rest, (int)plen, rest);
        }
        if (ikv__rd64(sb + 40) != XXH3_64bits(sb, 40) || ikv__rd32(sb + 8) != FILE_VERSION) {
            file_close(f);
            return ikv_error(IKV_EIO,
                             "tier file:%s: superblock of '%.*s' is corrupt or of "
                             "another version",
                             rest, (int)plen, rest);
        }
        f->ways = ikv__rd32(sb + 12);
        uint64_t sbytes = ikv__rd64(sb + 16);
        f->nslots = ikv__rd64(sb + 24);
        f->data_off = ikv__rd64(sb + 32);
        if (sbytes != p->slot_bytes) {
            file_close(f);
            return ikv_error(IKV_EIO,
                             "tier file:%s: '%.*s' holds slots of %llu bytes; this "
                             "engine needs %zu (another model or block size): use another path",
                             rest, (int)plen, rest, (unsigned long long)sbytes, p->slot_bytes);
        }
        if (f->ways == 0 || f->ways > 64 || f->nslots % f->ways ||
            f->data_off < SUPER + f->nslots * IKV_BLOB_HDR ||
            (uint64_t)stt.st_size < f->data_off + f->nslots * f->body) {
            file_close(f);
            return ikv_error(IKV_EIO,
                             "tier file:%s: '%.*s' is shorter than its superblock says "
                             "(%llu slots)",
                             rest, (int)plen, rest, (unsigned long long)f->nslots);
        }
        f->nsets = f->nslots / f->ways;
        if (recover(f)) {
            file_close(f);
            return ikv_error(IKV_EIO, "tier file:%s: read error while recovering", rest);
        }
    }
    *impl = f;
    *cap = f->nslots;
    return 0;
}

/* Reads the set of (key, scope) into hdrs; returns the way holding it or -1; *s0 = set's
 * first slot. -2 on a read error. */
static int find(const fstore *f, ikv_key key, uint64_t scope, uint8_t *hdrs, uint64_t *s0) {
    *s0 = ikv__store_set(key, scope, f->nsets) * f->ways;
    if (rd_full(f->fd, hdrs, f->ways * IKV_BLOB_HDR, hdr_off(*s0))) return -2;
    for (uint64_t w = 0; w < f->ways; w++) {
        ikv_key k;
        uint64_t sc;
        if (ikv__blob_ident(hdrs + w * IKV_BLOB_HDR, &k, &sc, NULL) && ikv_key_eq(k, key) &&
            sc == scope)
            return (int)w;
    }
    return -1;
}

static void file_put(void *impl, const ikv_key *keys, const uint64_t *scopes,
                     const void *const *blobs, const size_t *lens, size_t n, int *rcs) {
    fstore *f = impl;
    static const uint8_t zero[IKV_BLOB_HDR];
    uint8_t hdrs[64 * IKV_BLOB_HDR];
    for (size_t i = 0; i < n; i++) {
        uint64_t s0;
        int w = find(f, keys[i], scopes[i], hdrs, &s0), fresh = 0;
        rcs[i] = IKV_EIO;
        if (w == -2) continue;
        if (w < 0) {
            uint64_t oldest = UINT64_MAX;
            for (uint64_t j = 0; j < f->ways; j++) {
                ikv_key k;
                uint64_t sc, t;
                if (!ikv__blob_ident(hdrs + j * IKV_BLOB_HDR, &k, &sc, &t)) t = 0;
                if (t < oldest) oldest = t, w = (int)j;
            }
            if (oldest)
                f->evictions++;
            else
                fresh = 1;
        }
        uint64_t slot = s0 + (uint64_t)w;
        const uint8_t *b = blobs[i];
        if (!fresh && wr_full(f->fd, zero, IKV_BLOB_HDR, hdr_off(slot))) continue;
        if (wr_full(f->fd, b + IKV_BLOB_HDR, lens[i] - IKV_BLOB_HDR, body_off(f, slot)) ||
            wr_full(f->fd, b, IKV_BLOB_HDR, hdr_off(slot)))
            continue;
        if (fresh) f->resident++;
        rcs[i] = 0;
    }
}

static void file_get(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                     void *const *bufs, size_t cap, size_t *lens, int *rcs) {
    fstore *f = impl;
    uint8_t hdrs[64 * IKV_BLOB_HDR];
    for (size_t i = 0; i < n; i++) {
        uint64_t s0;
        int w = find(f, keys[i], scopes[i], hdrs, &s0);
        if (w < 0) {
            rcs[i] = w == -1 ? IKV_ENOENT : IKV_EIO;
            continue;
        }
        const uint8_t *h = hdrs + (size_t)w * IKV_BLOB_HDR;
        size_t len = ikv_blob_bytes(ikv__rd32(h + 8), ikv__rd32(h + 12));
        if (len > cap || len > f->slot_bytes) {
            rcs[i] = IKV_ECORRUPT;
            continue;
        }
        uint8_t *b = bufs[i];
        memcpy(b, h, IKV_BLOB_HDR);
        if (rd_full(f->fd, b + IKV_BLOB_HDR, len - IKV_BLOB_HDR, body_off(f, s0 + (uint64_t)w))) {
            rcs[i] = IKV_EIO;
            continue;
        }
        lens[i] = len;
        rcs[i] = 0;
    }
}

static int file_exists(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                       uint8_t *found) {
    fstore *f = impl;
    uint8_t hdrs[64 * IKV_BLOB_HDR];
    for (size_t i = 0; i < n; i++) {
        uint64_t s0;
        int w = find(f, keys[i], scopes[i], hdrs, &s0);
        if (w == -2) return IKV_EIO;
        found[i] = w >= 0;
    }
    return 0;
}

static int file_del(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n) {
    fstore *f = impl;
    static const uint8_t zero[IKV_BLOB_HDR];
    uint8_t hdrs[64 * IKV_BLOB_HDR];
    for (size_t i = 0; i < n; i++) {
        uint64_t s0;
        int w = find(f, keys[i], scopes[i], hdrs, &s0);
        if (w == -2) return IKV_EIO;
        if (w < 0) continue;
        if (wr_full(f->fd, zero, IKV_BLOB_HDR, hdr_off(s0 + (uint64_t)w))) return IKV_EIO;
        if (f->resident) f->resident--;
    }
    return 0;
}

static void file_stats(void *impl, ikv_store_stats *st) {
    const fstore *f = impl;
    st->resident = f->resident;
    st->evictions = f->evictions;
    st->recovered = f->recovered;
    st->dropped = f->dropped;
}

/* Every header in the file is in its set, and each fully verifies; their count is resident. */
static int file_check(void *impl) {
    fstore *f = impl;
    uint8_t h[IKV_BLOB_HDR];
    uint64_t used = 0;
    for (uint64_t s = 0; s < f->nslots; s++) {
        if (rd_full(f->fd, h, IKV_BLOB_HDR, hdr_off(s)))
            return ikv_error(IKV_EIO, "file store: cannot read header %llu", (unsigned long long)s);
        ikv_key k;
        uint64_t sc;
        if (!ikv__blob_ident(h, &k, &sc, NULL)) continue;
        used++;
        size_t len = ikv_blob_bytes(ikv__rd32(h + 8), ikv__rd32(h + 12));
        if (ikv__store_set(k, sc, f->nsets) != s / f->ways || len > f->slot_bytes)
            return ikv_error(IKV_EINVAL, "file store: slot %llu is outside its set or too long",
                             (unsigned long long)s);
        memcpy(f->scratch, h, IKV_BLOB_HDR);
        if (rd_full(f->fd, f->scratch + IKV_BLOB_HDR, len - IKV_BLOB_HDR, body_off(f, s)) ||
            ikv_blob_check(f->scratch, len))
            return ikv_error(IKV_EINVAL,
                             "file store: slot %llu has a header but fails its checksum",
                             (unsigned long long)s);
    }
    if (used != f->resident)
        return ikv_error(IKV_EINVAL, "file store: %llu slots hold blocks, resident says %llu",
                         (unsigned long long)used, (unsigned long long)f->resident);
    return 1;
}

const ikv__store_ops ikv__store_file = {
    .scheme = "file",
    .doc = "file:PATH:SIZE  preallocated file of checksummed slots; survives restarts",
    .shared = 1,
    .open = file_open,
    .close = file_close,
    .put = file_put,
    .get = file_get,
    .exists = file_exists,
    .del = file_del,
    .stats = file_stats,
    .check = file_check,
};
