/* rope.c — rotary position embedding frequencies (doc §3.2), as the
 * reference computes them in fp32 (YaRN on the compressed layers). */
#include "model/rope.h"

#include <math.h>
#include <stdlib.h>

float *ds_rope_inv_freq(const ds_config *c, int compress) {
    int r = c->rope_dim, half = r / 2;
    double base = compress ? c->compress_rope_theta : c->rope_theta;
    float *f = malloc((size_t)(half ? half : 1) * sizeof *f);
    if (!f) return NULL;
    for (int i = 0; i < half; i++) {
        /* torch: base ** (arange(0, r, 2).float() / r), in fp32 */
        float ex = (float)(2 * i) / (float)r;
        float pf = powf((float)base, ex);
        f[i] = 1.0f / pf;
    }
    if (compress && c->yarn) {
        double orig = (double)c->yarn_orig_max_pos;
        double lowd = r * log(orig / (c->yarn_beta_fast * 2 * M_PI)) / (2 * log(base));
        double highd = r * log(orig / (c->yarn_beta_slow * 2 * M_PI)) / (2 * log(base));
        double low = floor(lowd), high = ceil(highd);
        if (low < 0) low = 0;
        if (high > r - 1) high = r - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float pf = powf((float)base, (float)(2 * i) / (float)r);
            float extra = 1.0f / pf, inter = 1.0f / ((float)c->yarn_factor * pf);
            float ramp = (float)(((double)i - low) / (high - low));
            if (ramp < 0) ramp = 0;
            if (ramp > 1) ramp = 1;
            float extra_factor = 1.0f - ramp;
            f[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
        }
    }
    return f;
}
