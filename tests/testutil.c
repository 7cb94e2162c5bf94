#include "testutil.h"

#include "backend/cpu/cpu.h"
#include "model/model.h"
#include "runtime/backend_select.h"

#include <stdlib.h>
#include <string.h>

int test_passed = 0, test_failed = 0;

int test_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
    return (test_failed == 0 && test_passed > 0) ? 0 : 1;
}

/* The source tree compiled in, or $DSV4_SOURCE_DIR (a build run on another machine). */
void test_path(char *buf, size_t n, const char *rel) {
    const char *root = getenv("DSV4_SOURCE_DIR");
    snprintf(buf, n, "%s/%s", root && *root ? root : DSV4_SOURCE_DIR, rel);
}

int test_load(const char *dir, int threads, ds_model **m, ds_backend *be, ds_err *err) {
    if (ds_model_load(dir, m, err)) return -1;
    ds_backend_opts o = {.name = getenv("DSV4_TEST_BACKEND"), .threads = threads};
    if (ds_backend_open(&o, be, err)) {
        ds_model_free(*m);
        return -1;
    }
    if (ds_model_bind(*m, be, err)) {
        ds_model_free(*m);
        be->close(be);
        return -1;
    }
    return 0;
}

int test_load_fixture(const char *name, int threads, ds_model **m, ds_backend *be, ds_err *err) {
    char dir[1024];
    test_path(dir, sizeof dir, "tests/fixtures/");
    strncat(dir, name, sizeof dir - strlen(dir) - 1);
    return test_load(dir, threads, m, be, err);
}

void test_unload(ds_model *m, ds_backend *be) {
    ds_model_free(m);
    if (be->close) be->close(be);
}
