/* compressor.h — token compression into KV entries (paper §2.3; doc 3.3, 3.4).
 *
 * HCA (no overlap): every complete window of `ratio` tokens becomes one entry,
 * a per-channel softmax (over the window, gate + ape) weighted sum of the
 * projected kv, then RMSNorm and RoPE at the window's first position.
 * CSA (overlap): projections are 2d wide, series A = first d channels, series
 * B = last d; entry w pools window w-1's series A with window w's series B
 * (2 * ratio slots; window -1 is absent, weight 0).
 *
 * The state carries what a window needs across decoding steps, so a prefill
 * in one call, in chunks or token by token builds the same entries. */
#ifndef DS_COMPRESSOR_H
#define DS_COMPRESSOR_H

#include <stdint.h>

#include "model/model.h"

typedef struct ds_comp_state {
    float *entries;            /* [cap][d]: entries so far, in window order */
    int n_entries, cap;
    float *pend_kv, *pend_gate; /* [ratio][c*d]: rows of the unfinished window (gate includes ape) */
    float *prev_kv, *prev_gate; /* [ratio][d]: series A of the last finished window (overlap) */
    int has_prev;
    float *slots;               /* [2][2 * ratio]: gates and values of one channel's slots */
} ds_comp_state;

int ds_comp_state_init(ds_comp_state *s, const ds_compressor_w *w, int64_t max_len);
void ds_comp_state_free(ds_comp_state *s);
void ds_comp_state_reset(ds_comp_state *s);

/* Feeds the projections of the token at `pos` (kv, gate: c*d floats each,
 * gate without ape). When pos closes a window, appends its entry. Returns -1
 * if the entry capacity (sized from max_len) is exceeded. */
int ds_comp_push(const ds_compressor_w *w, ds_comp_state *s, const float *kv, const float *gate, int64_t pos,
                 const float *inv_freq, int rope_half, float eps);

#endif
