#include "testutil.h"

int test_passed = 0, test_failed = 0;

int test_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
    return (test_failed == 0 && test_passed > 0) ? 0 : 1;
}

void test_path(char *buf, size_t n, const char *rel) { snprintf(buf, n, "%s/%s", DSV4_SOURCE_DIR, rel); }
