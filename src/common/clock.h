/* clock.h — a monotonic wall clock in seconds (for progress and timings). */
#ifndef DS_CLOCK_H
#define DS_CLOCK_H

double ds_now(void);

#endif
