/* narrowmm: what this CPU (and its OS) can run. */
#include "../include/narrowmm.h"

#include <stdlib.h>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define NM_X86 1
#if defined(_MSC_VER)
#include <intrin.h>
static void cpuid(int leaf, int sub, unsigned r[4]) {
    int v[4];
    __cpuidex(v, leaf, sub);
    for (int i = 0; i < 4; ++i) r[i] = (unsigned)v[i];
}
static unsigned long long xgetbv0(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void cpuid(int leaf, int sub, unsigned r[4]) {
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif
#endif

const nm_feature_name nm_feature_names[] = {
    {NM_CPU_SSE2, "sse2"},         {NM_CPU_AVX, "avx"},
    {NM_CPU_AVX2, "avx2"},         {NM_CPU_FMA, "fma"},
    {NM_CPU_F16C, "f16c"},         {NM_CPU_AVX512F, "avx512f"},
    {NM_CPU_AVX512BW, "avx512bw"}, {NM_CPU_AVX512VL, "avx512vl"},
    {NM_CPU_AVX512DQ, "avx512dq"}, {NM_CPU_AVX512BF16, "avx512_bf16"},
    {NM_CPU_NEON, "neon"},
};
const int nm_feature_count = (int)(sizeof nm_feature_names / sizeof nm_feature_names[0]);

unsigned nm_cpu_features(void) {
    unsigned f = 0;
#if defined(NM_X86)
    unsigned r[4];
    cpuid(0, 0, r);
    const unsigned max_leaf = r[0];
    cpuid(1, 0, r);
    const unsigned ecx1 = r[2], edx1 = r[3];
    if (edx1 & (1u << 26)) f |= NM_CPU_SSE2;
    const int osxsave = (ecx1 >> 27) & 1;
    const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    const int ymm_ok = (xcr0 & 0x6) == 0x6;          /* XMM and YMM state */
    const int zmm_ok = ymm_ok && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (ymm_ok) {
        if (ecx1 & (1u << 28)) f |= NM_CPU_AVX;
        if (ecx1 & (1u << 12)) f |= NM_CPU_FMA;
        if (ecx1 & (1u << 29)) f |= NM_CPU_F16C;
    }
    if (max_leaf >= 7) {
        cpuid(7, 0, r);
        const unsigned ebx7 = r[1];
        if (ymm_ok && (ebx7 & (1u << 5))) f |= NM_CPU_AVX2;
        if (zmm_ok) {
            if (ebx7 & (1u << 16)) f |= NM_CPU_AVX512F;
            if (ebx7 & (1u << 17)) f |= NM_CPU_AVX512DQ;
            if (ebx7 & (1u << 30)) f |= NM_CPU_AVX512BW;
            if (ebx7 & (1u << 31)) f |= NM_CPU_AVX512VL;
            cpuid(7, 1, r);
            if (r[0] & (1u << 5)) f |= NM_CPU_AVX512BF16;
        }
    }
#elif defined(__aarch64__) && defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMD) f |= NM_CPU_NEON;
#elif defined(__aarch64__) || defined(_M_ARM64)
    f |= NM_CPU_NEON; /* Advanced SIMD is mandatory on AArch64 */
#endif
    return f;
}

#if defined(__linux__)
#include <stdio.h>
#include <string.h>

/* The first line of a sysfs file, "" if it cannot be read. */
static void read_line(const char *path, char *out, size_t size) {
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)size, f)) out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}
#endif

int64_t nm_l2_cache_bytes(void) {
#if defined(__linux__)
    /* The kernel lists CPU 0's caches as index0..indexN (a hybrid CPU's other cores may
     * differ: CPU 0 stands for all). */
    for (int i = 0; i < 16; ++i) {
        char path[96], level[16], type[32], size[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        read_line(path, level, sizeof level);
        if (!level[0]) break;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        read_line(path, type, sizeof type);
        if (strcmp(level, "2") != 0 || strcmp(type, "Instruction") == 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        read_line(path, size, sizeof size);
        char *end = NULL;
        long long value = strtoll(size, &end, 10);
        if (end == size || value <= 0 || value > (1LL << 30)) return 0;
        if (*end == 'K') value <<= 10;
        else if (*end == 'M') value <<= 20;
        else if (*end != '\0') return 0;
        return (int64_t)value;
    }
#endif
    return 0;
}
