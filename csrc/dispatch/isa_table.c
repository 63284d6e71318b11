/* narrowmm: the ISA rows compiled into this build, best first. The binding picks the first
 * row whose required features the CPU has, unless NARROWMM_ISA names one. */
#include "../include/narrowmm.h"

const nm_isa_entry nm_isa_table[] = {
    {"scalar", 0u, nm_fill_row_scalar},
};
const int nm_isa_count = (int)(sizeof nm_isa_table / sizeof nm_isa_table[0]);
