/* synth.h — random-weight DeepSeek-V4 checkpoints in the official layout
 * (official names, FP8 e4m3 + 128x128 E8M0 block scales for dense weights,
 * MXFP4 routed experts, BF16 embeddings/head/gates/compressors, F32 norms and
 * mHC), sharded with model.safetensors.index.json — any V4 shape, for
 * benchmarks and tests that need real sizes without real weights. */
#ifndef DS_SYNTH_H
#define DS_SYNTH_H

#include <stdint.h>

#include "common/err.h"
#include "format/config.h"

typedef struct ds_synth_opts {
    int quantized;       /* 1: FP8 + MXFP4 as published; 0: BF16 weights */
    uint64_t seed;
    uint64_t shard_bytes; /* target shard size */
    int progress;         /* print progress to stderr */
    int mtp;              /* 1: also the MTP block (mtp.0.*) when the config has num_nextn_predict_layers */
} ds_synth_opts;

/* Fills cfg with a named shape: "flash", "pro" or "tiny". */
int ds_synth_like(const char *name, ds_config *cfg, ds_err *err);
/* Writes config.json, the shards and the index into dir (created if needed). */
int ds_synth_write(const ds_config *cfg, const ds_synth_opts *o, const char *dir, ds_err *err);
/* The same, leaving every tensor for which skip(ctx, name) is nonzero a hole
 * (zeros, no space on a sparse file system such as /dev/shm): a rank of an
 * expert-parallel job writes only the experts it serves. Every written byte
 * is the one ds_synth_write writes. */
int ds_synth_write_only(const ds_config *cfg, const ds_synth_opts *o, const char *dir,
                        int (*skip)(void *ctx, const char *name), void *ctx, ds_err *err);
/* The bytes ds_synth_write_only writes with this skip (the tensors' data; the
 * headers and the index are a few MB more); 0 when the config is invalid. */
uint64_t ds_synth_bytes(const ds_config *cfg, const ds_synth_opts *o, int (*skip)(void *ctx, const char *name),
                        void *ctx);

#endif
