/*
 * Prompt-lookup drafts (Saxena 2023, "prompt lookup decoding"; the n-gram drafter of
 * speculative decoding without a draft model): the draft for the next positions is what
 * followed the latest earlier occurrence of the text's last n tokens, trying n = ngram down
 * to min_ngram (a match of one token alone predicts little: on the bundled model, drafts from
 * 2-token matches or longer were accepted about twice as often). Stories repeat their names and
 * phrases, summaries and edits repeat their input, so the continuation of a match is often what the
 * model writes next; ikv_engine_verify decides how much of it is.
 *
 * Cost: O(len x ngram) token comparisons per call (a backward scan); no allocation.
 */
#include "internal.h"

#include <string.h>

size_t ikv_lookup_draft(const uint32_t *hist, size_t len, uint32_t ngram, uint32_t min_ngram,
                        size_t k, uint32_t *out) {
    if (!k || len < 2) return 0;
    const size_t lo = min_ngram ? min_ngram : 1;
    for (size_t m = ngram < len ? ngram : len - 1; m >= lo; m--) {
        const uint32_t *suf = hist + len - m;
        /* latest start i < len - m with hist[i..i+m) == suffix and at least one token after */
        for (size_t i = len - m; i-- > 0;) {
            size_t j = 0;
            while (j < m && hist[i + j] == suf[j])
                j++;
            if (j < m) continue;
            size_t from = i + m, cnt = len - from < k ? len - from : k;
            memcpy(out, hist + from, sizeof(uint32_t) * cnt);
            return cnt;
        }
    }
    return 0;
}
