/* narrowmm: the ISA rows compiled into this build, best first, and the one rule that
 * chooses among them (nm_isa_select), used by the binding and the C test driver alike.
 * NARROWMM_ISA (applied by the Python layer) can name another row. */
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

#include <string.h>

int nm_isa_runs_on(int index, unsigned features) {
    return index >= 0 && index < nm_isa_count &&
           (nm_isa_table[index].required & ~features) == 0;
}

int nm_isa_select(const char *name, unsigned features) {
    if (!name) { /* the best row this CPU runs: the table is best first */
        for (int i = 0; i < nm_isa_count; ++i)
            if (nm_isa_runs_on(i, features)) return i;
        return NM_ISA_NONE;
    }
    for (int i = 0; i < nm_isa_count; ++i)
        if (strcmp(nm_isa_table[i].name, name) == 0)
            return nm_isa_runs_on(i, features) ? i : NM_ISA_UNSUPPORTED;
    return NM_ISA_UNKNOWN;
}
