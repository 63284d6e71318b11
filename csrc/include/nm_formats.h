/* narrowmm: the weight formats known to the C core.
 *
 * The codes are shared with the Python format table (narrowmm/_formats.py); the binding
 * exports this list and a test asserts both sides agree. Adding a format means adding a row
 * here, a codec, and kernel slots; nothing else switches on the format. */
#ifndef NM_FORMATS_H
#define NM_FORMATS_H

enum nm_format {
    NM_FMT_F32 = 0,  /* IEEE binary32, stored as is */
    NM_FMT_FP16 = 1, /* IEEE binary16 */
    NM_FMT_BF16 = 2, /* bfloat16: the high half of a binary32 */
    NM_FMT_E4M3FN = 3, /* OCP FP8 E4M3 (ml_dtypes float8_e4m3fn): no infinities */
    NM_FMT_E5M2 = 4,   /* OCP FP8 E5M2 (ml_dtypes float8_e5m2): the top byte of a binary16 */
    NM_FMT_Q8_0 = 5,   /* GGUF Q8_0's int8 codes, with float32 scales (one per 32 rows) */
    NM_FMT_Q4_0 = 6,   /* GGUF Q4_0's 4-bit codes q, two rows a byte: (q - 8) * scale */
    NM_FMT_Q4_1 = 7,   /* GGUF Q4_1's 4-bit codes q, two rows a byte: fma(q, scale, offset) */
    NM_FMT_Q5_1 = 8,   /* GGUF Q5_1's (and Q5_K's) 5-bit codes q, one a byte: fma(q, scale, offset) */
    NM_FMT_COUNT
};

typedef struct nm_format_info {
    const char *name; /* the Python-side name: "f32", "fp16", "bf16", "e4m3fn", "e5m2", ... */
    int itemsize;     /* bytes per stored element */
    int scaled;       /* weights carry float32 scales (nm_scales); the kernels apply them */
    int scale_exponent; /* r: a scaled format's kernels take the scales times 2^r (nm_scales) */
    int kpack;        /* rows of the matrix one stored row holds: 2 for the 4-bit formats,
                       * whose byte (r, j) holds rows 2r (low nibble) and 2r + 1 (high) of
                       * column j; k and the scales' blocks are then multiples of it */
    int offset;       /* the weights also carry offsets (nm_scales.o): Q4_1, Q5_1 */
    int half_scales;  /* the scales (and offsets) may come as binary16 grids (nm_scales.s16):
                       * the GGUF formats, whose d and m are binary16 in the file */
    int packed_xor;   /* packed weights (nm_matmul_packed) hold each stored byte XOR-ed with
                       * this: Q4_0's 0x88 makes each nibble q - 8 in two's complement, a
                       * code the avx2 row widens and scales in fewer operations; 0 for the
                       * others. Row-major weights hold the codes as they are. */
} nm_format_info;

extern const nm_format_info nm_format_table[NM_FMT_COUNT];

#endif
