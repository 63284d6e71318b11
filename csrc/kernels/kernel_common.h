/* narrowmm: scalar helpers every kernel row shares. Included (not linked) so each row's
 * translation unit compiles them with its own ISA flags: loads of one weight from any byte
 * address, and array codec loops over the branch-free scalar codecs, which the compiler
 * vectorises for the row's ISA. */
#ifndef NM_KERNEL_COMMON_H
#define NM_KERNEL_COMMON_H

#include <stdint.h>
#include <string.h>

#include "../codecs/codec_scalar.h"

static inline float nm_load1_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f); /* B may sit at any byte address */
    return f;
}

static inline uint16_t nm_load_u16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

static inline float nm_load1_fp16(const uint8_t *p) { return nm_fp16_to_f32(nm_load_u16(p)); }
static inline float nm_load1_bf16(const uint8_t *p) { return nm_bf16_to_f32(nm_load_u16(p)); }

/* An array codec named NAME applying the scalar codec FN element by element. */
#define NM_DEFINE_CODEC_LOOP(NAME, IN, OUT, FN)                                              \
    static void NAME(const IN *src, OUT *dst, int64_t n) {                                   \
        for (int64_t i = 0; i < n; ++i) dst[i] = FN(src[i]);                                 \
    }

#endif
