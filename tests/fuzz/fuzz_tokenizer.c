/*
 * Fuzz harness: a llama2.c tokenizer.bin through ikv_tokenizer_load, then encode and decode
 * (docs/fuzzing.md). The input is two bytes of vocabulary size (little-endian, taken mod 1024;
 * the file does not store it, the model does) followed by the file. When it loads, a fixed text
 * with ASCII, UTF-8 and control bytes is encoded and every token id decoded after every other
 * of a few.
 */
#include "fuzz_util.h"

#include "isokv/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint32_t vocab = ((uint32_t)data[0] | (uint32_t)data[1] << 8) % 1024;
    if (vocab & 1) {
        /* odd: use the number of whole pieces the file holds (4-byte max length, then per
         * piece a float score, an int32 length and the bytes), so mutated files still load
         * and the merge and decode paths see them */
        size_t off = 2 + 4, pieces = 0;
        while (pieces < 1024 && off + 8 <= size) {
            int32_t len;
            memcpy(&len, data + off + 4, 4);
            if (len < 0 || (size_t)len > size - off - 8) break;
            off += 8 + (size_t)len;
            pieces++;
        }
        vocab = (uint32_t)pieces;
    }
    const char *path = fuzz_write_file("tok", data + 2, size - 2);
    if (!path) return 0;
    ikv_tokenizer *t;
    if (ikv_tokenizer_load(path, vocab, &t)) return 0;
    static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 \xe2\x82\xac\x01\x7f\tend.";
    uint32_t ids[sizeof text + 3];
    size_t n = 0;
    if (ikv_tokenizer_encode(t, text, 1, 1, ids, sizeof ids / sizeof ids[0], &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= vocab) abort(); /* an id the model could not embed */
    }
    for (uint32_t a = 0; a < vocab; a++) {
        size_t len;
        const char *p = ikv_tokenizer_decode(t, a % 3, a, &len);
        if (!p && len) abort();
    }
    ikv_tokenizer_destroy(t);
    return 0;
}
