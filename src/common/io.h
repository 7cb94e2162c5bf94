/* io.h — reading a whole file; a field of a /proc file. */
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
/* The "KEY: N kB" line of a /proc text file (meminfo, smaps_rollup) in bytes;
 * 0 when the file or the key is missing. */
unsigned long long ds_proc_kb_bytes(const char *path, const char *key);

#endif
