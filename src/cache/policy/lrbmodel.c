/*
 * lrb's table model (see lrbmodel.h): decayed positive / total label counts per feature cell at
 * four levels of detail, read from the finest level with enough evidence.
 */
#include "lrbmodel.h"

#include <string.h>

void ikv__lrbm_init(ikv__lrbm *m, double period, double pool) {
    memset(m, 0, sizeof *m);
    m->period = period;
    m->pool = pool;
}

static void halve(ikv__lrb_cnt *c, size_t n) {
    for (size_t i = 0; i < n; i++)
        c[i].pos *= 0.5f, c[i].n *= 0.5f;
}

static inline void add(ikv__lrb_cnt *c, int pos) {
    c->n += 1.0f;
    if (pos) c->pos += 1.0f;
}

void ikv__lrbm_label(ikv__lrbm *m, uint32_t cell, int pos) {
    uint32_t i1 = cell / (IKV__LRB_ND2 * IKV__LRB_NF), i2 = i1 / IKV__LRB_NC,
             i3 = i2 / IKV__LRB_ND1;
    add(&m->l0[cell], pos);
    add(&m->l1[i1], pos);
    add(&m->l2[i2], pos);
    add(&m->l3[i3], pos);
    m->total++;
    m->total_pos += pos != 0;
    if ((double)++m->labels >= m->period) {
        IKV_ASSERT(ikv__lrbm_check(m));
        halve(m->l0, IKV__LRB_NCELL);
        halve(m->l1, IKV__LRB_NL1);
        halve(m->l2, IKV__LRB_NL2);
        halve(m->l3, IKV__LRB_NA);
        m->labels = 0;
    }
}

float ikv__lrbm_predict(const ikv__lrbm *m, uint32_t cell) {
    uint32_t i1 = cell / (IKV__LRB_ND2 * IKV__LRB_NF), i2 = i1 / IKV__LRB_NC,
             i3 = i2 / IKV__LRB_ND1;
    const ikv__lrb_cnt *c = &m->l0[cell];
    float pool = (float)m->pool;
    if (c->n < pool) c = &m->l1[i1];
    if (c->n < pool) c = &m->l2[i2];
    if (c->n < pool) c = &m->l3[i3];
    return (c->pos + 0.5f) / (c->n + 1.0f);
}

static int sane(const ikv__lrb_cnt *c, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(c[i].pos >= 0) || !(c[i].n >= c[i].pos) || !(c[i].n < 1e30f)) return 0;
    return 1;
}

int ikv__lrbm_check_coarse(const ikv__lrbm *m) {
    return m->total_pos <= m->total && (double)m->labels <= m->period &&
           sane(m->l1, IKV__LRB_NL1) && sane(m->l2, IKV__LRB_NL2) && sane(m->l3, IKV__LRB_NA);
}

int ikv__lrbm_check(const ikv__lrbm *m) {
    return ikv__lrbm_check_coarse(m) && sane(m->l0, IKV__LRB_NCELL);
}
