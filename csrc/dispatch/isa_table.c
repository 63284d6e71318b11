/* narrowmm: the ISA rows compiled into this build, best first. The binding picks the first
 * row whose required features the CPU has; NARROWMM_ISA (applied by the Python layer) can
 * name another. */
#include "../include/narrowmm.h"

const nm_isa_entry nm_isa_table[] = {
#if defined(NM_HAVE_AVX512)
    {"avx512",
     NM_CPU_AVX512F | NM_CPU_AVX512BW | NM_CPU_AVX512VL | NM_CPU_AVX512DQ | NM_CPU_AVX |
         NM_CPU_AVX2 | NM_CPU_FMA | NM_CPU_F16C,
     nm_fill_row_avx512},
#endif
#if defined(NM_HAVE_AVX2)
    {"avx2", NM_CPU_AVX | NM_CPU_AVX2 | NM_CPU_FMA | NM_CPU_F16C, nm_fill_row_avx2},
#endif
#if defined(NM_HAVE_NEON)
    {"neon", NM_CPU_NEON, nm_fill_row_neon},
#endif
    {"scalar", 0u, nm_fill_row_scalar},
};
const int nm_isa_count = (int)(sizeof nm_isa_table / sizeof nm_isa_table[0]);
