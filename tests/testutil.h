/* testutil.h — tiny test harness: CHECK macros count failures; each test
 * program ends with test_summary() which prints "N passed, N failed". */
#ifndef DS_TESTUTIL_H
#define DS_TESTUTIL_H

#include <stdio.h>

extern int test_passed, test_failed;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (cond) {                                                                       \
            test_passed++;                                                                \
        } else {                                                                          \
            test_failed++;                                                                \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);      \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
        }                                                                                 \
    } while (0)

/* Prints the totals; returns the process exit code (0 iff nothing failed and
 * at least one check ran). */
int test_summary(const char *name);
/* Path under the source tree: returns a static-free buffer owned by caller. */
void test_path(char *buf, size_t n, const char *rel);

struct ds_model;
struct ds_backend;
struct ds_err;
/* Loads the model in dir bound to a new backend (be): the CPU with `threads`,
 * or the one named by the environment variable DSV4_TEST_BACKEND (the GPU
 * script runs the model tests with DSV4_TEST_BACKEND=cuda). */
int test_load(const char *dir, int threads, struct ds_model **m, struct ds_backend *be, struct ds_err *err);
/* The same for tests/fixtures/NAME. */
int test_load_fixture(const char *name, int threads, struct ds_model **m, struct ds_backend *be, struct ds_err *err);
/* Frees both. */
void test_unload(struct ds_model *m, struct ds_backend *be);

#endif
