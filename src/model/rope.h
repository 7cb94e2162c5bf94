/* rope.h — interleaved partial RoPE on the last rope_dim channels of a head
 * (doc §3.2): plain on sliding-only layers, YaRN-scaled on CSA/HCA layers. */
#ifndef DS_ROPE_H
#define DS_ROPE_H

#include <stdint.h>

#include "format/config.h"

/* inv_freq[rope_dim/2]; compress = 1 for the compress rope (YaRN). malloc'd. */
float *ds_rope_inv_freq(const ds_config *cfg, int compress);

/* Rotates the last 2*half channels of x[0..dim) by position pos:
 * (a, b) -> (a cos - b sin, b cos + a sin) per pair; inverse = 1 uses -sin. */
void ds_rope_apply(float *x, int dim, const float *inv_freq, int half, int64_t pos, int inverse);

#endif
