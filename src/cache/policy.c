/*
 * The eviction policy registry: one line per policy. A policy is one file under policy/ that
 * exports a const ikv_policy_ops; adding one is that file plus one line here.
 */
#include "internal.h"

#include <string.h>

extern const ikv_policy_ops ikv_policy_lru;
extern const ikv_policy_ops ikv_policy_opt;
extern const ikv_policy_ops ikv_policy_value;
extern const ikv_policy_ops ikv_policy_fifo;
extern const ikv_policy_ops ikv_policy_lfu;
extern const ikv_policy_ops ikv_policy_s3fifo;
extern const ikv_policy_ops ikv_policy_sieve;
extern const ikv_policy_ops ikv_policy_arc;
extern const ikv_policy_ops ikv_policy_gdsf;
extern const ikv_policy_ops ikv_policy_lhd;
extern const ikv_policy_ops ikv_policy_lrb;
extern const ikv_policy_ops ikv_policy_hazard;
extern const ikv_policy_ops ikv_policy_auto;

static const ikv_policy_ops *const registry[] = {
    &ikv_policy_lru,    &ikv_policy_value, &ikv_policy_opt, &ikv_policy_fifo, &ikv_policy_lfu,
    &ikv_policy_s3fifo, &ikv_policy_sieve, &ikv_policy_arc, &ikv_policy_gdsf, &ikv_policy_lhd,
    &ikv_policy_lrb,    &ikv_policy_hazard, &ikv_policy_auto,
};

#define N_POLICIES (sizeof registry / sizeof registry[0])

const ikv_policy_ops *ikv__policy_find(const char *name, size_t len) {
    for (size_t i = 0; i < N_POLICIES; i++)
        if (strlen(registry[i]->name) == len && !memcmp(registry[i]->name, name, len))
            return registry[i];
    return NULL;
}

size_t ikv_policy_count(void) {
    return N_POLICIES;
}

const char *ikv_policy_name(size_t i) {
    return i < N_POLICIES ? registry[i]->name : NULL;
}

const char *ikv_policy_doc(size_t i) {
    return i < N_POLICIES ? registry[i]->doc : NULL;
}

int ikv_policy_offline(const char *spec) {
    if (!spec) return 0;
    const char *colon = strchr(spec, ':');
    const ikv_policy_ops *ops =
        ikv__policy_find(spec, colon ? (size_t)(colon - spec) : strlen(spec));
    return ops && ops->offline && ops->offline(colon ? colon + 1 : "");
}
