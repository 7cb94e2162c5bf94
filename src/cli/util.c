#include "cli/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int cli_parse_tokens(const char *opt, const char *s, int32_t **out, int *n) {
    *out = NULL;
    *n = 0;
    int cap = 16;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\t' &&
                                                           *end != '\n')) {
            fprintf(stderr, "dsv4: %s: '%s' is not a list of token ids (non-negative integers separated by commas)\n",
                    opt, s);
            free(v);
            return -1;
        }
        if (*n == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[(*n)++] = (int32_t)x;
        p = end;
    }
    if (*n == 0) {
        fprintf(stderr, "dsv4: %s: empty token list\n", opt);
        free(v);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = s ? strtoll(s, &end, 10) : 0;
    if (!s || end == s || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "dsv4: %s: '%s' is not an integer in [%lld, %lld]\n", opt, s ? s : "", lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_parse_double(const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double x = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || errno) {
        fprintf(stderr, "dsv4: %s: '%s' is not a number\n", opt, s ? s : "");
        return -1;
    }
    *out = x;
    return 0;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
