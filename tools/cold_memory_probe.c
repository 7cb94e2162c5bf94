/* cold_memory_probe.c — does this machine's memory stay fast when it is not
 * touched for a while? Writes N GiB of mlocked anonymous huge pages, reads
 * each 1 GiB region once, keeps only region 0 hot for S seconds, then reads
 * every region again (one thread; GB/s per region). On the 2-core dev VM
 * (docs/backend.md, "Weights in memory") the cold regions read at 1.0-2.4
 * GB/s after 60 s against 32 hot: the host reclaims guest memory the guest
 * still sees as resident.
 *   cc -O3 -march=native -o /tmp/probe tools/cold_memory_probe.c && /tmp/probe 8 90 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t sum(const uint64_t *p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n; i += 4) a ^= p[i], b ^= p[i + 1], c ^= p[i + 2], d ^= p[i + 3];
    return a ^ b ^ c ^ d;
}

int main(int argc, char **argv) {
    size_t G = (size_t)1 << 30, H = (size_t)2 << 20;
    int nreg = argc > 1 ? atoi(argv[1]) : 8, wait = argc > 2 ? atoi(argv[2]) : 90;
    if (nreg < 1) nreg = 1;
    uint8_t *raw = mmap(NULL, nreg * G + H, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return perror("mmap"), 1;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + H - 1) / H * H);
    madvise(p, nreg * G, MADV_HUGEPAGE);
    double t = now();
    memset(p, 1, nreg * G);
    printf("write %d GiB: %.2f GB/s\n", nreg, (double)(nreg * G) / (now() - t) / 1e9);
    if (mlock(p, nreg * G)) perror("mlock");
    uint64_t s = 0;
    for (int r = 0; r < nreg; r++) {
        t = now();
        s ^= sum((const uint64_t *)(p + r * G), G / 8);
        printf("region %d, first read: %.2f GB/s\n", r, (double)G / (now() - t) / 1e9);
    }
    for (double t0 = now(); now() - t0 < wait;) s ^= sum((const uint64_t *)p, G / 8);
    for (int r = 0; r < nreg; r++) {
        t = now();
        s ^= sum((const uint64_t *)(p + r * G), G / 8);
        printf("region %d after %d s (%s): %.2f GB/s\n", r, wait, r ? "cold" : "kept hot", (double)G / (now() - t) / 1e9);
    }
    return s == 42;
}
