/* bochscpu-python 0.4.0 (pinned in pyproject.toml) has a Linux wheel that calls glibc 2.38's
 * C23 aliases of strtoull and sscanf while its tag admits older glibc (Debian 12 has 2.36).
 * Preloaded into the emulator's process only, when the plain import fails; the aliases
 * behave as the classic functions for the inputs bochscpu gives them (no "0b" prefixes). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

unsigned long long __isoc23_strtoull(const char *s, char **end, int base) {
    return strtoull(s, end, base);
}

int __isoc23_sscanf(const char *s, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    int n = vsscanf(s, format, ap);
    va_end(ap);
    return n;
}
