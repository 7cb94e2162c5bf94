#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens path for reading. regular_only: the file must be a regular file; it is
 * opened without blocking (a FIFO would otherwise block in open) and checked
 * with fstat before anything is read. */
static FILE *open_read(const char *path, int regular_only, ds_err *err) {
    if (!strcmp(path, "-")) {
        if (regular_only) {
            ds_fail(err, "%s: standard input is not accepted here (a regular file is needed)", path);
            return NULL;
        }
        return stdin;
    }
    if (!regular_only) {
        FILE *f = fopen(path, "rb");
        if (!f) ds_fail(err, "%s: %s", path, strerror(errno));
        return f;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        ds_fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ds_fail(err, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        ds_fail(err, "%s: not a regular file (%s)", path,
                S_ISDIR(st.st_mode)    ? "a directory"
                : S_ISFIFO(st.st_mode) ? "a FIFO"
                                       : "a device or socket");
        close(fd);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        ds_fail(err, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        ds_fail(err, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

static int read_all(const char *path, int regular_only, size_t max, char **out, size_t *n, ds_err *err) {
    *out = NULL;
    FILE *f = open_read(path, regular_only, err);
    if (!f) return -1;
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

int ds_read_file(const char *path, size_t max, char **out, size_t *n, ds_err *err) {
    return read_all(path, 0, max, out, n, err);
}

int ds_read_regular_file(const char *path, size_t max, char **out, size_t *n, ds_err *err) {
    return read_all(path, 1, max, out, n, err);
}

unsigned long long ds_proc_kb_bytes(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kl = strlen(key);
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':' && sscanf(line + kl + 1, "%llu", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
