/* err.h — error reporting: every fallible function returns 0 on success or -1
 * with a one-line message in a caller-owned ds_err naming the file, tensor or
 * field at fault. No global state. */
#ifndef DS_ERR_H
#define DS_ERR_H

#include <stdarg.h>

typedef struct ds_err {
    char msg[1024];
} ds_err;

/* Formats the message into err (if non-NULL) and returns -1. */
int ds_fail(ds_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes an existing message: "<prefix>: <old message>". Returns -1. */
int ds_fail_prefix(ds_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
