/* narrowmm: weights' layouts, made once at load: GGUF's 4-bit codes as narrowmm's
 * (nm_nibble_pairs), and weights into the packed layout that nm_matmul_packed reads
 * (nm_pack_slivers, the C side of narrowmm/_weights.py's pack_slivers). The latter is a copy
 * with no arithmetic: each item lands at nm_packed_offset, each byte XOR-ed with the
 * format's packed_xor, the columns past n the XOR of a zero. What matters is reading the
 * source well: a GGUF tensor arrives transposed (a column's items contiguous), which
 * NumPy's copy took at 0.3-0.8 GB/s. */
#include <string.h>

#include "../include/narrowmm.h"

/* Source rows a pass copies into one group: the group's stored rows for them (at most 64
 * rows of 128 four-byte items, 32 KiB) stay in L1 while each column's run is read. */
#define NM_LAYOUT_ROWS 64

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

/* `rows` items of `size` bytes from src (src_step apart) to dst (dst_step apart); sizes
 * constant in each loop, so every item is one load and one store */
static void copy_run(uint8_t *dst, int64_t dst_step, const uint8_t *src, int64_t src_step,
                     int64_t rows, int64_t size, uint8_t xor_byte) {
    if (size == 1) {
        for (int64_t r = 0; r < rows; ++r) dst[r * dst_step] = src[r * src_step] ^ xor_byte;
    } else if (size == 2) {
        for (int64_t r = 0; r < rows; ++r) memcpy(dst + r * dst_step, src + r * src_step, 2);
    } else {
        for (int64_t r = 0; r < rows; ++r) memcpy(dst + r * dst_step, src + r * src_step, 4);
    }
}

/* A square block of items transposed in 64-bit words, item j of x[i] to item i of x[j]:
 * 8 x 8 bytes, 4 x 4 two-byte or 2 x 2 four-byte items (w = 8, 4 or 2 words). Swap the
 * off-diagonal halves of 2 x 2 blocks of items, then of pairs of items, and so on: a shift,
 * XOR and mask each, portable, where an item at a time to a stride took about four cycles a
 * byte (Zen 3). */
static inline void transpose_words(uint64_t *x, int w) {
    static const uint64_t mask[3] = {0x00FF00FF00FF00FFull, 0x0000FFFF0000FFFFull,
                                     0x00000000FFFFFFFFull};
    for (int d = 1, level = w == 8 ? 0 : w == 4 ? 1 : 2; d < w; d *= 2, ++level) {
        const int shift = 8 << level; /* bits in the items (or pairs, quads) swapped */
        for (int i = 0; i < w; ++i) {
            if (i & d) continue;
            const uint64_t t = ((x[i] >> shift) ^ x[i + d]) & mask[level];
            x[i + d] ^= t;
            x[i] ^= t << shift;
        }
    }
}

/* Rows [p0, p0 + rows) of a group's `cols` columns stored column-wise (item p of column c
 * at base + c * col_stride + p * size: a transposed view) into the group's stored rows
 * `line` bytes apart: w x w blocks (w = 8 / size) through transpose_words, the edges an
 * item at a time. */
static inline void copy_columns(uint8_t *group, int64_t line, const uint8_t *base,
                                int64_t col_stride, int64_t size, int64_t p0, int64_t rows,
                                int64_t cols, uint8_t xor_byte) {
    const int w = (int)(8 / size);
    const uint64_t xor8 = 0x0101010101010101ull * xor_byte; /* 0 unless one-byte items */
    int64_t c = 0;
    for (; c + w <= cols; c += w) {
        int64_t r = 0;
        for (; r + w <= rows; r += w) {
            uint64_t x[8];
            for (int i = 0; i < w; ++i)
                memcpy(&x[i], base + (c + i) * col_stride + (p0 + r) * size, 8);
            transpose_words(x, w);
            for (int i = 0; i < w; ++i) {
                const uint64_t y = x[i] ^ xor8;
                memcpy(group + (p0 + r + i) * line + c * size, &y, 8);
            }
        }
        for (int64_t i = 0; i < w; ++i) /* the last rows % w of these columns */
            copy_run(group + (p0 + r) * line + (c + i) * size, line,
                     base + (c + i) * col_stride + (p0 + r) * size, size, rows - r, size,
                     xor_byte);
    }
    for (; c < cols; ++c) /* the last columns % w */
        copy_run(group + p0 * line + c * size, line, base + c * col_stride + p0 * size, size,
                 rows, size, xor_byte);
}

void nm_pack_slivers(int64_t k, int64_t n, int64_t itemsize, const uint8_t *src,
                     int64_t row_stride, int64_t col_stride, int64_t width, uint8_t xor_byte,
                     uint8_t *dst) {
    const int64_t groups = (n + width - 1) / width, line = width * itemsize;
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t j0 = g * width, cols = min64(width, n - j0);
        uint8_t *group = dst + nm_packed_offset(k, width, itemsize, 0, j0); /* its row 0 */
        const uint8_t *base = src + j0 * col_stride;
        if (col_stride == itemsize) { /* rows contiguous: one run of `cols` items a row */
            for (int64_t p = 0; p < k; ++p) {
                uint8_t *row = group + p * line;
                memcpy(row, base + p * row_stride, (size_t)(cols * itemsize));
                if (xor_byte)
                    for (int64_t x = 0; x < cols; ++x) row[x] ^= xor_byte;
            }
        } else {
            for (int64_t p0 = 0; p0 < k; p0 += NM_LAYOUT_ROWS) {
                const int64_t rows = min64(NM_LAYOUT_ROWS, k - p0);
                if (row_stride == itemsize) { /* transposed: a column's items contiguous */
                    /* each size its own inlined copy, w a constant: four-byte items
                     * ran 1.9x faster so than through one copy for all sizes */
                    if (itemsize == 1)
                        copy_columns(group, line, base, col_stride, 1, p0, rows, cols,
                                     xor_byte);
                    else if (itemsize == 2)
                        copy_columns(group, line, base, col_stride, 2, p0, rows, cols, 0);
                    else
                        copy_columns(group, line, base, col_stride, 4, p0, rows, cols, 0);
                } else { /* any other strides: an item at a time */
                    for (int64_t c = 0; c < cols; ++c)
                        copy_run(group + p0 * line + c * itemsize, line,
                                 base + c * col_stride + p0 * row_stride, row_stride, rows,
                                 itemsize, xor_byte);
                }
            }
        }
        /* the padding columns: a zero item each, XOR-ed like the rest (one-byte items
         * alone have a packed_xor) */
        if (cols < width)
            for (int64_t p = 0; p < k; ++p)
                memset(group + p * line + cols * itemsize, itemsize == 1 ? xor_byte : 0,
                       (size_t)((width - cols) * itemsize));
    }
}

/* One run of nm_nibble_pairs: byte i of q holds codes i (low nibble) and i + run (high);
 * byte j of dst gets codes 2j and 2j + 1 of the run's 2 * run, so the low nibbles of bytes
 * 2j and 2j + 1 pair up in the first half, their high nibbles in the second. GCC
 * vectorises the loop for Q4_K's 32-byte runs (9 GB/s of codes on a Zen 3), not for
 * Q4_0's 16 (1.7 GB/s, still 4x NumPy's); constant lengths, inlined, made Q4_K's 3x slower. */
static inline void pair_run(const uint8_t *q, uint8_t *dst, int64_t run) {
    const int64_t half = run / 2;
    for (int64_t j = 0; j < half; ++j) {
        const uint8_t even = q[2 * j], odd = q[2 * j + 1];
        dst[j] = (uint8_t)((even & 15) | (odd << 4));
        dst[half + j] = (uint8_t)((even >> 4) | (odd & 0xF0));
    }
}

void nm_nibble_pairs(int64_t blocks, int64_t block_bytes, int64_t offset, int64_t run,
                     int64_t runs, const uint8_t *src, uint8_t *dst) {
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *block = src + b * block_bytes + offset;
        for (int64_t t = 0; t < runs; ++t, dst += run) {
            pair_run(block + t * run, dst, run);
        }
    }
}
