/*
 * The aged count-min sketch of sketch.h (TinyLFU's frequency estimate). Four indices per key
 * from its 128 bits (the key is already a strong hash: XXH3-128 of the prefix), each row's
 * index a different 32-bit mix, masked to the row width.
 */
#include "sketch.h"

#include <string.h>

int ikv__sketch_init(ikv__sketch *s, uint64_t capacity) {
    memset(s, 0, sizeof *s);
    uint64_t w = 64;
    while (w < capacity)
        w <<= 1;
    s->ctr = ikv_calloc(4 * w, 1);
    if (!s->ctr) return IKV_ENOMEM;
    s->w = w;
    s->sample = 10 * w;
    return 0;
}

void ikv__sketch_free(ikv__sketch *s) {
    ikv_free(s->ctr);
    memset(s, 0, sizeof *s);
}

/* Row r's counter index of k: the four 32-bit words of the key, each mixed once. */
static inline uint64_t idx(const ikv__sketch *s, ikv_key k, int r) {
    uint64_t h = r < 2 ? k.lo : k.hi;
    h = (r & 1) ? h >> 32 | h << 32 : h;
    h *= UINT64_C(0x9e3779b97f4a7c15) + 2 * (uint64_t)r;
    return (uint64_t)r * s->w + ((h >> 32) & (s->w - 1));
}

unsigned ikv__sketch_estimate(const ikv__sketch *s, ikv_key k) {
    if (!s->w) return 0;
    unsigned m = IKV__SKETCH_MAX;
    for (int r = 0; r < 4; r++) {
        unsigned v = s->ctr[idx(s, k, r)];
        if (v < m) m = v;
    }
    return m;
}

void ikv__sketch_add(ikv__sketch *s, ikv_key k) {
    if (!s->w) return;
    if (s->ops >= s->sample) {
        for (uint64_t i = 0; i < 4 * s->w; i++)
            s->ctr[i] >>= 1;
        s->ops = 0;
        s->resets++;
    }
    for (int r = 0; r < 4; r++) {
        uint8_t *c = &s->ctr[idx(s, k, r)];
        if (*c < IKV__SKETCH_MAX) (*c)++;
    }
    s->ops++;
}

size_t ikv__sketch_bytes(const ikv__sketch *s) {
    return (size_t)(4 * s->w);
}

int ikv__sketch_check(const ikv__sketch *s) {
    if (!s->w) return s->ctr == NULL && s->ops == 0;
    if ((s->w & (s->w - 1)) || s->ops > s->sample) return 0;
    for (uint64_t i = 0; i < 4 * s->w; i++)
        if (s->ctr[i] > IKV__SKETCH_MAX) return 0;
    return 1;
}
