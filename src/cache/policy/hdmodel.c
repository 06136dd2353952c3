/*
 * LHD's hit-density model (see hdmodel.h): evidence counts per class and age bin, decayed and
 * turned into densities every `period` events.
 */
#include "hdmodel.h"

#include <string.h>

#define NB   IKV__HD_NB
#define NCLS IKV__HD_NCLS

void ikv__hd_init(ikv__hd *m, double period, double decay, double pool) {
    memset(m, 0, sizeof *m);
    m->period = period;
    m->decay = decay;
    m->pool = pool;
    for (int c = 0; c < NCLS; c++)
        for (int a = 0; a < NB; a++) m->dens[c][a] = 1.0f / (float)(a + 1);
}

/* D[a] for one class from its hit and eviction counts per age bin (hdmodel.h). */
static void density_of(const double *hits, const double *evs, float *dens) {
    double h = 0, ev = 0, life = 0;
    for (int a = NB - 1; a >= 0; a--) {
        h += hits[a];
        ev += hits[a] + evs[a];
        life += ev;
        dens[a] = life > 1e-9 ? (float)(h / life) : 0.0f;
    }
}

/* Adapts the age coarsening: the 95th percentile of all events' ages kept between NB/8 and
 * NB/2 bins, by merging pairs of bins (the last bin holds everything older) or splitting the
 * lower half's bins in two. */
static void coarsen(ikv__hd *m) {
    double ev[NB] = {0}, tot = 0, cum = 0;
    for (int c = 0; c < NCLS; c++)
        for (int a = 0; a < NB; a++) {
            double e = m->evs[c][a] + m->hits[c][a];
            ev[a] += e, tot += e;
        }
    if (!(tot > 0)) return;
    int p95 = 0;
    while (p95 < NB - 1 && (cum += ev[p95]) < 0.95 * tot) p95++;
    if (p95 > NB / 2 && m->shift < 40) {
        for (int c = 0; c < NCLS; c++) {
            for (int a = 0; a < NB / 2; a++) {
                m->hits[c][a] = m->hits[c][2 * a] + m->hits[c][2 * a + 1];
                m->evs[c][a] = m->evs[c][2 * a] + m->evs[c][2 * a + 1];
            }
            for (int a = NB / 2; a < NB; a++) m->hits[c][a] = m->evs[c][a] = 0;
        }
        m->shift++;
    } else if (p95 < NB / 8 && m->shift > 0) {
        for (int c = 0; c < NCLS; c++)
            for (int a = NB / 2 - 1; a >= 0; a--) {
                double h = m->hits[c][a] / 2, e = m->evs[c][a] / 2;
                m->hits[c][2 * a] = m->hits[c][2 * a + 1] = h;
                m->evs[c][2 * a] = m->evs[c][2 * a + 1] = e;
            }
        m->shift--;
    }
}

/* Coarsening, densities (a class with fewer than `pool` events takes the pooled D), decay. */
static void recompute(ikv__hd *m) {
    coarsen(m);
    double ph[NB] = {0}, pe[NB] = {0}, n[NCLS] = {0};
    for (int c = 0; c < NCLS; c++)
        for (int a = 0; a < NB; a++) {
            ph[a] += m->hits[c][a], pe[a] += m->evs[c][a];
            n[c] += m->hits[c][a] + m->evs[c][a];
        }
    float pooled[NB];
    density_of(ph, pe, pooled);
    for (int c = 0; c < NCLS; c++) {
        if (n[c] < m->pool)
            memcpy(m->dens[c], pooled, sizeof pooled);
        else
            density_of(m->hits[c], m->evs[c], m->dens[c]);
        for (int a = 0; a < NB; a++) m->hits[c][a] *= m->decay, m->evs[c][a] *= m->decay;
    }
    m->events = 0;
    m->recomputes++;
}

static inline void count_event(ikv__hd *m) {
    if ((double)++m->events >= m->period) recompute(m);
}

void ikv__hd_hit(ikv__hd *m, uint32_t c, uint64_t age) {
    m->hits[c][ikv__hd_bin(m, age)] += 1;
    count_event(m);
}

void ikv__hd_evict(ikv__hd *m, uint32_t c, uint64_t age) {
    m->evs[c][ikv__hd_bin(m, age)] += 1;
    count_event(m);
}

void ikv__hd_unevict(ikv__hd *m, uint32_t c, uint64_t eage, uint64_t age) {
    uint32_t eb = ikv__hd_bin(m, eage);
    m->evs[c][eb] = m->evs[c][eb] > 1 ? m->evs[c][eb] - 1 : 0;
    m->hits[c][ikv__hd_bin(m, age)] += 1;
}

int ikv__hd_check(const ikv__hd *m) {
    if (m->shift > 40 || !(m->decay >= 0 && m->decay <= 1)) return 0;
    for (int c = 0; c < NCLS; c++)
        for (int a = 0; a < NB; a++)
            if (!(m->dens[c][a] >= 0) || !(m->hits[c][a] >= 0) || !(m->evs[c][a] >= 0)) return 0;
    return 1;
}
