/* rope.h — the frequencies of the interleaved partial RoPE on the last
 * rope_dim channels of a head (doc §3.2): plain on sliding-only layers,
 * YaRN-scaled on CSA/HCA layers. The rotation is a backend op (ds_rope_params). */
#ifndef DS_ROPE_H
#define DS_ROPE_H

#include <stdint.h>

#include "format/config.h"

/* inv_freq[rope_dim/2]; compress = 1 for the compress rope (YaRN). malloc'd. */
float *ds_rope_inv_freq(const ds_config *cfg, int compress);

#endif
