/* fuzz_safetensors.c — libFuzzer target: the bytes of one .safetensors file
 * -> ds_checkpoint_open (header length, JSON header, dtypes, shapes, offsets,
 * overlap). The input is written to a private temporary file, as the reader
 * maps files. Every accepted tensor must lie inside the file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/dsv4-fuzz-st-%ld.safetensors", (long)getpid());
    }
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f) != 0) abort();
    ds_checkpoint *ck = NULL;
    ds_err err = {{0}};
    if (ds_checkpoint_open(path, &ck, &err) == 0) {
        int n = ds_checkpoint_count(ck);
        for (int i = 0; i < n; i++) {
            const ds_tensor *t = ds_checkpoint_at(ck, i);
            if (t->nbytes != ds_tensor_numel(t) * ds_dtype_size(t->dtype)) abort();
            /* touch the first and last byte: ASan / SIGSEGV if outside the map */
            if (t->nbytes) {
                volatile uint8_t x = t->data[0];
                x = t->data[t->nbytes - 1];
                (void)x;
            }
            if (ds_checkpoint_find(ck, t->name) != t) abort();
        }
        ds_checkpoint_close(ck);
    } else if (!err.msg[0]) {
        abort();
    }
    unlink(path);
    return 0;
}
