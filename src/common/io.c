#include "common/io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ds_read_file(const char *path, size_t max, char **out, size_t *n, ds_err *err) {
    *out = NULL;
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return ds_fail(err, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            if (max && cap >= max) {
                rc = ds_fail(err, "%s: file is larger than %zu bytes", path, max);
                break;
            }
            cap = cap ? cap * 2 : 65536;
            if (max && cap > max) cap = max;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                rc = ds_fail(err, "%s: out of memory", path);
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (!rc && ferror(f)) rc = ds_fail(err, "%s: read error", path);
    if (f != stdin) fclose(f);
    if (rc) {
        free(buf);
        return -1;
    }
    buf[len] = 0;
    *out = buf;
    if (n) *n = len;
    return 0;
}
