#include "err.h"

#include <stdio.h>
#include <string.h>

int ds_fail(ds_err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int ds_fail_prefix(ds_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t lp = strnlen(prefix, sizeof prefix), lo = strnlen(old, sizeof old - 1), cap = sizeof err->msg - 1;
    size_t n = 0;
    for (size_t i = 0; i < lp && n < cap; i++) err->msg[n++] = prefix[i];
    for (size_t i = 0; i < 2 && n < cap; i++) err->msg[n++] = ": "[i];
    for (size_t i = 0; i < lo && n < cap; i++) err->msg[n++] = old[i];
    err->msg[n] = 0;
    return -1;
}
