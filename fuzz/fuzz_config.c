/* fuzz_config.c — libFuzzer target: config.json text -> ds_config_parse. Any
 * input must give 0 or -1 with a message; an accepted config must pass
 * ds_config_validate and keep every derived size within the named limits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    ds_config c;
    ds_err err = {{0}};
    if (ds_config_parse(text, "fuzz.json", &c, &err) == 0) {
        if (ds_config_validate(&c, "fuzz.json", &err) != 0) abort();
        if ((int64_t)c.n_heads * c.head_dim > DS_LIMIT_DERIVED || (int64_t)c.hc_mult * c.dim > DS_LIMIT_DERIVED ||
            c.hc_sinkhorn_iters > DS_LIMIT_SINKHORN_ITERS || c.n_layers > DS_MAX_LAYERS)
            abort();
    } else if (!err.msg[0]) {
        abort(); /* an error always has a message */
    }
    free(text);
    return 0;
}
