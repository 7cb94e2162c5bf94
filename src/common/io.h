/* io.h — reading a whole file. */
#ifndef DS_IO_H
#define DS_IO_H

#include <stddef.h>

#include "common/err.h"

/* Reads all of `path` ("-": standard input) into a new NUL-terminated buffer
 * (*out, owned by the caller; *n its length, n may be NULL). max > 0 caps the
 * size. Errors name the path: "<path>: <reason>". */
int ds_read_file(const char *path, size_t max, char **out, size_t *n, ds_err *err);
/* The same for files of a checkpoint (config.json, the index, tokenizer.json):
 * path must name a regular file (a FIFO, device or directory is an error, and
 * opening never blocks). */
int ds_read_regular_file(const char *path, size_t max, char **out, size_t *n, ds_err *err);

#endif
