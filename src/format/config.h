/* config.h — DeepSeek-V4 config.json, in the official hub form (compress_ratios,
 * num_hash_layers, qk_rope_head_dim, rope_scaling) and the form transformers
 * saves (layer_types, mlp_layer_types, compress_rates, rope_parameters,
 * partial_rotary_factor). See docs/deepseek-v4.md section 1. */
#ifndef DS_CONFIG_H
#define DS_CONFIG_H

#include <stdint.h>

#include "common/err.h"

#define DS_MAX_LAYERS 256

/* The engine's upper limits per config key (V4-Pro uses well under each). With
 * them every size derived from the config (a product of at most two keys, or
 * a key and a limit) fits in DS_LIMIT_DERIVED, and every count that drives a
 * loop (layers, experts, Sinkhorn iterations, window, top-k) is bounded. */
#define DS_LIMIT_VOCAB (1 << 24)
#define DS_LIMIT_DIM (1 << 16)          /* hidden_size, head_dim, ranks, intermediate sizes */
#define DS_LIMIT_HEADS (1 << 12)        /* attention heads, indexer heads, o_groups */
#define DS_LIMIT_EXPERTS 4096           /* n_routed_experts */
#define DS_LIMIT_ACTIVE_EXPERTS 64      /* num_experts_per_tok, n_shared_experts */
#define DS_LIMIT_WINDOW (1 << 20)       /* sliding_window, index_topk */
#define DS_LIMIT_HC_MULT 64
#define DS_LIMIT_SINKHORN_ITERS 1000
#define DS_LIMIT_COMPRESS_RATIO 4096
#define DS_LIMIT_POSITIONS (1LL << 40)  /* max_position_embeddings */
#define DS_LIMIT_DERIVED (1 << 24)      /* any derived size: heads x head_dim, ... */

enum { DS_SCORE_SQRTSOFTPLUS = 0, DS_SCORE_SOFTMAX = 1, DS_SCORE_SIGMOID = 2 };

typedef struct ds_config {
    int vocab_size;
    int dim;            /* hidden_size */
    int n_layers;       /* num_hidden_layers */
    int n_heads;        /* num_attention_heads */
    int head_dim;
    int n_kv_heads;     /* must be 1 */
    int rope_dim;       /* qk_rope_head_dim */
    int q_lora_rank;
    int o_groups;
    int o_lora_rank;
    int n_routed_experts;
    int n_active_experts; /* num_experts_per_tok */
    int n_shared_experts;
    int moe_inter_dim;  /* moe_intermediate_size */
    int n_hash_layers;  /* first n layers route by tid2eid */
    int score_func;     /* DS_SCORE_* */
    int norm_topk_prob;
    float route_scale;  /* routed_scaling_factor */
    float swiglu_limit;
    int window;         /* sliding_window */
    int compress_ratio[DS_MAX_LAYERS]; /* 0, 4 (CSA) or 128 (HCA) per layer */
    int index_n_heads;
    int index_head_dim;
    int index_topk;
    int hc_mult;
    int hc_sinkhorn_iters;
    float hc_eps;
    double rope_theta;          /* sliding-only layers */
    double compress_rope_theta; /* CSA / HCA layers */
    int yarn;                   /* 1: YaRN on the compress rope */
    double yarn_factor;
    double yarn_beta_fast;
    double yarn_beta_slow;
    int64_t yarn_orig_max_pos;
    float rms_eps;
    int64_t max_pos;    /* max_position_embeddings */
    int bos_id;
    int eos_id;
    int n_mtp;          /* num_nextn_predict_layers (MTP tensors are ignored) */
} ds_config;

/* Parses config.json at `path`; fills defaults of V4-Flash for absent
 * optional keys; validates every value. Errors name the file and key. */
int ds_config_load(const char *path, ds_config *cfg, ds_err *err);
/* Parses from a JSON string; `what` names the source in errors. */
int ds_config_parse(const char *json, const char *what, ds_config *cfg, ds_err *err);
/* Checks internal consistency (positive sizes, divisibility, ratios). */
int ds_config_validate(const ds_config *cfg, const char *what, ds_err *err);
/* V4-Flash defaults (used by synth and as parse defaults). */
void ds_config_flash(ds_config *cfg);
/* Writes the official form of cfg as JSON to path. */
int ds_config_write(const ds_config *cfg, const char *path, ds_err *err);

#endif
