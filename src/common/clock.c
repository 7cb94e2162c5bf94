/* clock.c — see clock.h. */
#include "common/clock.h"

#include <time.h>

double ds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
