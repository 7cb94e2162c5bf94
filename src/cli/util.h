/* util.h — small helpers shared by the dsv4 commands. */
#ifndef DS_CLI_UTIL_H
#define DS_CLI_UTIL_H

#include <stdint.h>

/* Parses "5,17,42" or "5 17 42" into a malloc'd array; -1 with a message
 * on stderr naming the option when malformed. */
int cli_parse_tokens(const char *opt, const char *s, int32_t **out, int *n);
/* Parses a non-negative integer option value; -1 (message) if malformed. */
int cli_parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out);
int cli_parse_double(const char *opt, const char *s, double *out);
/* Seconds from a monotonic clock. */
double cli_now(void);

#endif
