/* config.c — config.json in the official hub form and in the form transformers
 * saves (layer_types / compress_rates / mlp_layer_types / partial_rotary_factor /
 * rope_parameters). Absent optional keys take V4-Flash values; JSON null counts
 * as absent. When both forms of one setting are present they must agree, except
 * rope_parameters, which (as in transformers) overrides rope_theta,
 * compress_rope_theta and rope_scaling. Every error names the file and key. */
#include "format/config.h"


#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/io.h"

#define CONFIG_FILE_MAX ((size_t)16 << 20)
#define JSON_INT_MAX 9007199254740992.0 /* 2^53 */
#define CSA_RATIO 4                     /* a layer with this ratio is CSA (has an indexer) */

static const char *const score_names[] = {"sqrtsoftplus", "softmax", "sigmoid"};

static void flash_ratios(ds_config *c) {
    for (int l = 0; l < DS_MAX_LAYERS; l++)
        c->compress_ratio[l] = (l < 2 || l >= c->n_layers) ? 0 : ((l - 2) % 2 == 0 ? 4 : 128);
}

void ds_config_flash(ds_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 129280;
    c->dim = 4096;
    c->n_layers = 43;
    c->n_heads = 64;
    c->head_dim = 512;
    c->n_kv_heads = 1;
    c->rope_dim = 64;
    c->q_lora_rank = 1024;
    c->o_groups = 8;
    c->o_lora_rank = 1024;
    c->n_routed_experts = 256;
    c->n_active_experts = 6;
    c->n_shared_experts = 1;
    c->moe_inter_dim = 2048;
    c->n_hash_layers = 3;
    c->score_func = DS_SCORE_SQRTSOFTPLUS;
    c->norm_topk_prob = 1;
    c->route_scale = 1.5f;
    c->swiglu_limit = 10.0f;
    c->window = 128;
    c->index_n_heads = 64;
    c->index_head_dim = 128;
    c->index_topk = 512;
    c->hc_mult = 4;
    c->hc_sinkhorn_iters = 20;
    c->hc_eps = 1e-6f;
    c->rope_theta = 10000.0;
    c->compress_rope_theta = 160000.0;
    c->yarn = 1;
    c->yarn_factor = 16.0;
    c->yarn_beta_fast = 32.0;
    c->yarn_beta_slow = 1.0;
    c->yarn_orig_max_pos = 65536;
    c->rms_eps = 1e-6f;
    c->max_pos = 1048576;
    c->bos_id = 0;
    c->eos_id = 1;
    c->n_mtp = 1;
    flash_ratios(c);
}

/* ---- JSON accessors: each names `what` (the file) and the key ----------- */

static const char *type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsNull(v)) return "null";
    return "an unknown value";
}

/* The member `key` of obj, NULL when absent or null. */
static const cJSON *member(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    return cJSON_IsNull(v) ? NULL : v;
}

static int as_i64(const cJSON *v, const char *what, const char *key, int64_t lo, int64_t hi, int64_t *out,
                  ds_err *err) {
    if (!cJSON_IsNumber(v)) return ds_fail(err, "%s: '%s' must be an integer, not %s", what, key, type_name(v));
    double d = v->valuedouble;
    if (d != floor(d) || fabs(d) > JSON_INT_MAX)
        return ds_fail(err, "%s: '%s' must be an integer (got %g)", what, key, d);
    if (d < (double)lo || d > (double)hi)
        return ds_fail(err, "%s: '%s' = %.0f is out of range [%" PRId64 ", %" PRId64 "]", what, key, d, lo, hi);
    *out = (int64_t)d;
    return 0;
}

static int as_int(const cJSON *v, const char *what, const char *key, int *out, ds_err *err) {
    int64_t x = 0;
    if (as_i64(v, what, key, INT_MIN, INT_MAX, &x, err) != 0) return -1;
    *out = (int)x;
    return 0;
}

/* Optional integer: leaves *out alone when absent; `required` makes absence an error. */
static int get_int(const cJSON *obj, const char *key, int required, const char *what, int *out, ds_err *err) {
    const cJSON *v = member(obj, key);
    if (!v) return required ? ds_fail(err, "%s: required key '%s' is missing", what, key) : 0;
    return as_int(v, what, key, out, err);
}

static int get_i64(const cJSON *obj, const char *key, const char *what, int64_t *out, ds_err *err) {
    const cJSON *v = member(obj, key);
    return v ? as_i64(v, what, key, -(int64_t)JSON_INT_MAX, (int64_t)JSON_INT_MAX, out, err) : 0;
}

static int as_double(const cJSON *v, const char *what, const char *key, double *out, ds_err *err) {
    if (!cJSON_IsNumber(v)) return ds_fail(err, "%s: '%s' must be a number, not %s", what, key, type_name(v));
    *out = v->valuedouble;
    return 0;
}

static int get_double(const cJSON *obj, const char *key, const char *what, double *out, ds_err *err) {
    const cJSON *v = member(obj, key);
    return v ? as_double(v, what, key, out, err) : 0;
}

static int get_float(const cJSON *obj, const char *key, const char *what, float *out, ds_err *err) {
    double d = (double)*out;
    if (get_double(obj, key, what, &d, err) != 0) return -1;
    if (!(fabs(d) <= (double)FLT_MAX)) return ds_fail(err, "%s: '%s' = %g is out of float range", what, key, d);
    *out = (float)d;
    return 0;
}

static int get_bool(const cJSON *obj, const char *key, const char *what, int *out, ds_err *err) {
    const cJSON *v = member(obj, key);
    if (!v) return 0;
    if (cJSON_IsBool(v))
        *out = cJSON_IsTrue(v);
    else if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1))
        *out = v->valuedouble != 0;
    else
        return ds_fail(err, "%s: '%s' must be true or false, not %s", what, key, type_name(v));
    return 0;
}

/* Integer or non-empty list of integers (token ids): takes the first. */
static int get_token_id(const cJSON *obj, const char *key, const char *what, int *out, ds_err *err) {
    const cJSON *v = member(obj, key);
    if (!v) return 0;
    if (cJSON_IsArray(v)) {
        if (!v->child) return ds_fail(err, "%s: '%s' is an empty list", what, key);
        v = v->child;
    }
    return as_int(v, what, key, out, err);
}

/* A list of at least n entries. */
static int get_list(const cJSON *obj, const char *key, int n, const char *what, const cJSON **out, ds_err *err) {
    const cJSON *v = member(obj, key);
    *out = NULL;
    if (!v) return 0;
    if (!cJSON_IsArray(v)) return ds_fail(err, "%s: '%s' must be a list, not %s", what, key, type_name(v));
    int len = cJSON_GetArraySize(v);
    if (len < n) return ds_fail(err, "%s: '%s' has %d entries, fewer than num_hidden_layers (%d)", what, key, len, n);
    *out = v;
    return 0;
}

/* ---- the parts that have two forms -------------------------------------- */

/* YaRN parameters from a rope_scaling-like object `o` (named `name`). With
 * need_type, an object without "type"/"rope_type" is an error. */
static int parse_yarn(const cJSON *o, const char *name, int need_type, const char *what, ds_config *c, ds_err *err) {
    char key[96];
    if (!cJSON_IsObject(o)) return ds_fail(err, "%s: '%s' must be an object, not %s", what, name, type_name(o));
    const cJSON *t = member(o, "rope_type");
    snprintf(key, sizeof key, "%s.rope_type", name);
    if (!t) {
        t = member(o, "type");
        snprintf(key, sizeof key, "%s.type", name);
    }
    if (t && !cJSON_IsString(t)) return ds_fail(err, "%s: '%s' must be a string, not %s", what, key, type_name(t));
    if (!t && need_type && o->child) return ds_fail(err, "%s: '%s' has no 'type' or 'rope_type'", what, name);
    if (!t || !strcmp(t->valuestring, "default")) {
        c->yarn = 0;
        return 0;
    }
    if (strcmp(t->valuestring, "yarn") != 0)
        return ds_fail(err, "%s: '%s' = '%s' is not supported (only \"yarn\" or \"default\")", what, key,
                       t->valuestring);
    c->yarn = 1;
    static const char *const keys[] = {"factor", "beta_fast", "beta_slow"};
    double *dst[] = {&c->yarn_factor, &c->yarn_beta_fast, &c->yarn_beta_slow};
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "%s.%s", name, keys[i]);
        const cJSON *v = member(o, keys[i]);
        if (v && as_double(v, what, key, dst[i], err) != 0) return -1;
    }
    snprintf(key, sizeof key, "%s.original_max_position_embeddings", name);
    const cJSON *v = member(o, "original_max_position_embeddings");
    return v ? as_i64(v, what, key, 1, (int64_t)JSON_INT_MAX, &c->yarn_orig_max_pos, err) : 0;
}

static int parse_rope(const cJSON *root, const char *what, ds_config *c, ds_err *err) {
    if (get_double(root, "rope_theta", what, &c->rope_theta, err) != 0 ||
        get_double(root, "compress_rope_theta", what, &c->compress_rope_theta, err) != 0)
        return -1;
    c->yarn = 0; /* rope_scaling absent or null: no YaRN */
    const cJSON *rs = member(root, "rope_scaling");
    if (rs && parse_yarn(rs, "rope_scaling", 1, what, c, err) != 0) return -1;
    const cJSON *rp = member(root, "rope_parameters");
    if (!rp) return 0;
    if (!cJSON_IsObject(rp))
        return ds_fail(err, "%s: 'rope_parameters' must be an object, not %s", what, type_name(rp));
    const cJSON *m = member(rp, "main"), *k = member(rp, "compress");
    if (!m && !k) /* flat form: the (YaRN) parameters of the compress rope */
        return rs ? 0 : parse_yarn(rp, "rope_parameters", 0, what, c, err);
    if (m) {
        if (!cJSON_IsObject(m))
            return ds_fail(err, "%s: 'rope_parameters.main' must be an object, not %s", what, type_name(m));
        const cJSON *t = member(m, "rope_type");
        if (t && (!cJSON_IsString(t) || strcmp(t->valuestring, "default") != 0))
            return ds_fail(err,
                           "%s: 'rope_parameters.main.rope_type' must be \"default\" (only the compress rope "
                           "may use YaRN)",
                           what);
        const cJSON *th = member(m, "rope_theta");
        if (th && as_double(th, what, "rope_parameters.main.rope_theta", &c->rope_theta, err) != 0) return -1;
    }
    if (k) {
        if (parse_yarn(k, "rope_parameters.compress", 0, what, c, err) != 0) return -1;
        const cJSON *th = member(k, "rope_theta");
        if (th && as_double(th, what, "rope_parameters.compress.rope_theta", &c->compress_rope_theta, err) != 0)
            return -1;
    }
    return 0;
}

static int parse_rope_dim(const cJSON *root, const char *what, ds_config *c, ds_err *err) {
    const cJSON *qk = member(root, "qk_rope_head_dim"), *prf = member(root, "partial_rotary_factor");
    if (qk && as_int(qk, what, "qk_rope_head_dim", &c->rope_dim, err) != 0) return -1;
    if (!prf) return 0;
    if (!cJSON_IsNumber(prf))
        return ds_fail(err, "%s: 'partial_rotary_factor' must be a number, not %s", what, type_name(prf));
    double f = prf->valuedouble, r = f * c->head_dim;
    if (!(f > 0 && f <= 1) || fabs(r - nearbyint(r)) > 1e-6)
        return ds_fail(err, "%s: 'partial_rotary_factor' = %g times head_dim %d is not a whole number of channels",
                       what, f, c->head_dim);
    int rd = (int)nearbyint(r);
    if (qk && rd != c->rope_dim)
        return ds_fail(err, "%s: 'qk_rope_head_dim' = %d disagrees with 'partial_rotary_factor' %g x head_dim %d", what,
                       c->rope_dim, f, c->head_dim);
    c->rope_dim = rd;
    return 0;
}

static int parse_hash_layers(const cJSON *root, const char *what, ds_config *c, ds_err *err) {
    const cJSON *nh = member(root, "num_hash_layers"), *types;
    if (nh && as_int(nh, what, "num_hash_layers", &c->n_hash_layers, err) != 0) return -1;
    if (get_list(root, "mlp_layer_types", c->n_layers, what, &types, err) != 0) return -1;
    if (!nh && !types && c->n_hash_layers > c->n_layers) c->n_hash_layers = c->n_layers; /* as transformers does */
    if (!types) return 0;
    int n = 0, l = 0;
    for (const cJSON *v = types->child; v && l < c->n_layers; v = v->next, l++) {
        int hash = cJSON_IsString(v) && !strcmp(v->valuestring, "hash_moe");
        if (!hash && !(cJSON_IsString(v) && !strcmp(v->valuestring, "moe")))
            return ds_fail(err, "%s: 'mlp_layer_types[%d]' must be \"hash_moe\" or \"moe\"", what, l);
        if (hash && n != l)
            return ds_fail(err,
                           "%s: 'mlp_layer_types[%d]' is \"hash_moe\" after a \"moe\" layer (hash layers must come "
                           "first)",
                           what, l);
        n += hash;
    }
    if (nh && n != c->n_hash_layers)
        return ds_fail(err, "%s: 'num_hash_layers' = %d disagrees with 'mlp_layer_types' (%d hash_moe layers)", what,
                       c->n_hash_layers, n);
    c->n_hash_layers = n;
    return 0;
}

static int parse_ratios(const cJSON *root, const char *what, ds_config *c, ds_err *err) {
    const cJSON *ratios, *types, *rates = member(root, "compress_rates");
    int csa = CSA_RATIO, hca = 128;
    if (rates) {
        if (!cJSON_IsObject(rates))
            return ds_fail(err, "%s: 'compress_rates' must be an object, not %s", what, type_name(rates));
        const cJSON *a = member(rates, "compressed_sparse_attention"),
                    *b = member(rates, "heavily_compressed_attention");
        if ((a && as_int(a, what, "compress_rates.compressed_sparse_attention", &csa, err) != 0) ||
            (b && as_int(b, what, "compress_rates.heavily_compressed_attention", &hca, err) != 0))
            return -1;
        if (csa != CSA_RATIO)
            return ds_fail(err, "%s: 'compress_rates.compressed_sparse_attention' = %d is not supported (must be %d)",
                           what, csa, CSA_RATIO);
        if (hca < 2 || hca == CSA_RATIO)
            return ds_fail(err, "%s: 'compress_rates.heavily_compressed_attention' = %d must be >= 2 and not %d", what,
                           hca, CSA_RATIO);
    }
    if (get_list(root, "compress_ratios", c->n_layers, what, &ratios, err) != 0 ||
        get_list(root, "layer_types", c->n_layers, what, &types, err) != 0)
        return -1;
    if (!ratios && !types) {
        flash_ratios(c);
        return 0;
    }
    memset(c->compress_ratio, 0, sizeof c->compress_ratio);
    char key[48];
    int l = 0;
    for (const cJSON *v = ratios ? ratios->child : NULL; v && l < c->n_layers; v = v->next, l++) {
        snprintf(key, sizeof key, "compress_ratios[%d]", l);
        if (as_int(v, what, key, &c->compress_ratio[l], err) != 0) return -1;
        if (c->compress_ratio[l] != 0 && c->compress_ratio[l] < 2)
            return ds_fail(err, "%s: '%s' = %d must be 0 (sliding only) or >= 2", what, key, c->compress_ratio[l]);
    }
    l = 0;
    for (const cJSON *v = types ? types->child : NULL; v && l < c->n_layers; v = v->next, l++) {
        const char *s = cJSON_IsString(v) ? v->valuestring : "";
        int r = !strcmp(s, "sliding_attention")              ? 0
                : !strcmp(s, "compressed_sparse_attention")  ? csa
                : !strcmp(s, "heavily_compressed_attention") ? hca
                                                             : -1;
        if (r < 0)
            return ds_fail(err,
                           "%s: 'layer_types[%d]' must be \"sliding_attention\", \"compressed_sparse_attention\" "
                           "or \"heavily_compressed_attention\"",
                           what, l);
        if (ratios && r != c->compress_ratio[l])
            return ds_fail(err, "%s: 'layer_types[%d]' = \"%s\" disagrees with 'compress_ratios[%d]' = %d", what, l, s,
                           l, c->compress_ratio[l]);
        c->compress_ratio[l] = r;
    }
    return 0;
}

/* ---- parse -------------------------------------------------------------- */

static int parse_root(const cJSON *root, const char *what, ds_config *c, ds_err *err) {
    ds_config_flash(c);
    /* n_routed_experts may be saved under transformers' alias num_local_experts. */
    const char *experts_key = member(root, "n_routed_experts") || !member(root, "num_local_experts")
                                  ? "n_routed_experts"
                                  : "num_local_experts";
    if (get_int(root, "vocab_size", 1, what, &c->vocab_size, err) ||
        get_int(root, "hidden_size", 1, what, &c->dim, err) ||
        get_int(root, "num_hidden_layers", 1, what, &c->n_layers, err) ||
        get_int(root, "num_attention_heads", 1, what, &c->n_heads, err) ||
        get_int(root, "head_dim", 1, what, &c->head_dim, err) ||
        get_int(root, "moe_intermediate_size", 1, what, &c->moe_inter_dim, err) ||
        get_int(root, experts_key, 1, what, &c->n_routed_experts, err) ||
        get_int(root, "num_experts_per_tok", 1, what, &c->n_active_experts, err))
        return -1;
    /* The per-layer lists below are sized by the layer count: check it first. */
    if (c->n_layers < 1 || c->n_layers > DS_MAX_LAYERS)
        return ds_fail(err, "%s: 'num_hidden_layers' = %d must be in [1, %d]", what, c->n_layers, DS_MAX_LAYERS);
    static const struct {
        const char *key;
        size_t off;
    } ints[] = {
        {"num_key_value_heads", offsetof(ds_config, n_kv_heads)},
        {"q_lora_rank", offsetof(ds_config, q_lora_rank)},
        {"o_groups", offsetof(ds_config, o_groups)},
        {"o_lora_rank", offsetof(ds_config, o_lora_rank)},
        {"n_shared_experts", offsetof(ds_config, n_shared_experts)},
        {"sliding_window", offsetof(ds_config, window)},
        {"index_n_heads", offsetof(ds_config, index_n_heads)},
        {"index_head_dim", offsetof(ds_config, index_head_dim)},
        {"index_topk", offsetof(ds_config, index_topk)},
        {"hc_mult", offsetof(ds_config, hc_mult)},
        {"hc_sinkhorn_iters", offsetof(ds_config, hc_sinkhorn_iters)},
        {"num_nextn_predict_layers", offsetof(ds_config, n_mtp)},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (get_int(root, ints[i].key, 0, what, (int *)((char *)c + ints[i].off), err) != 0) return -1;
    if (get_token_id(root, "bos_token_id", what, &c->bos_id, err) ||
        get_token_id(root, "eos_token_id", what, &c->eos_id, err) ||
        get_bool(root, "norm_topk_prob", what, &c->norm_topk_prob, err) ||
        get_float(root, "routed_scaling_factor", what, &c->route_scale, err) ||
        get_float(root, "swiglu_limit", what, &c->swiglu_limit, err) ||
        get_float(root, "hc_eps", what, &c->hc_eps, err) || get_float(root, "rms_norm_eps", what, &c->rms_eps, err) ||
        get_i64(root, "max_position_embeddings", what, &c->max_pos, err))
        return -1;
    const cJSON *sf = member(root, "scoring_func");
    if (sf) {
        if (!cJSON_IsString(sf))
            return ds_fail(err, "%s: 'scoring_func' must be a string, not %s", what, type_name(sf));
        c->score_func = -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(sf->valuestring, score_names[i])) c->score_func = i;
        if (c->score_func < 0)
            return ds_fail(err, "%s: 'scoring_func' = '%s' must be sqrtsoftplus, softmax or sigmoid", what,
                           sf->valuestring);
    }
    if (parse_rope_dim(root, what, c, err) || parse_hash_layers(root, what, c, err) ||
        parse_ratios(root, what, c, err) || parse_rope(root, what, c, err))
        return -1;
    return ds_config_validate(c, what, err);
}

int ds_config_parse(const char *json, const char *what, ds_config *cfg, ds_err *err) {
    if (!what) what = "config";
    if (!json) return ds_fail(err, "%s: no JSON text", what);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) return ds_fail(err, "%s: not valid JSON (error near byte %td)", what, end ? end - json : (ptrdiff_t)0);
    int rc;
    ds_config c;
    if (!cJSON_IsObject(root))
        rc = ds_fail(err, "%s: top level is not a JSON object", what);
    else
        rc = parse_root(root, what, &c, err);
    cJSON_Delete(root);
    if (rc == 0) *cfg = c;
    return rc;
}

int ds_config_load(const char *path, ds_config *cfg, ds_err *err) {
    char *buf;
    size_t len;
    if (ds_read_regular_file(path, CONFIG_FILE_MAX, &buf, &len, err)) return -1;
    int rc = memchr(buf, 0, len) ? ds_fail(err, "%s: contains a NUL byte", path)
                                 : ds_config_parse(buf, path, cfg, err);
    free(buf);
    return rc;
}

/* ---- validate ----------------------------------------------------------- */

int ds_config_validate(const ds_config *c, const char *what, ds_err *err) {
    if (!what) what = "config";
    const struct {
        const char *key;
        int v;
    } pos[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->dim},
        {"num_hidden_layers", c->n_layers},
        {"num_attention_heads", c->n_heads},
        {"head_dim", c->head_dim},
        {"q_lora_rank", c->q_lora_rank},
        {"o_groups", c->o_groups},
        {"o_lora_rank", c->o_lora_rank},
        {"n_routed_experts", c->n_routed_experts},
        {"num_experts_per_tok", c->n_active_experts},
        {"moe_intermediate_size", c->moe_inter_dim},
        {"sliding_window", c->window},
        {"index_n_heads", c->index_n_heads},
        {"index_head_dim", c->index_head_dim},
        {"index_topk", c->index_topk},
        {"hc_mult", c->hc_mult},
        {"hc_sinkhorn_iters", c->hc_sinkhorn_iters},
        {"qk_rope_head_dim", c->rope_dim},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0) return ds_fail(err, "%s: '%s' = %d must be positive", what, pos[i].key, pos[i].v);
    const struct {
        const char *key;
        int v;
    } nonneg[] = {
        {"n_shared_experts", c->n_shared_experts},
        {"num_hash_layers", c->n_hash_layers},
        {"num_nextn_predict_layers", c->n_mtp},
        {"bos_token_id", c->bos_id},
        {"eos_token_id", c->eos_id},
    };
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; i++)
        if (nonneg[i].v < 0)
            return ds_fail(err, "%s: '%s' = %d must not be negative", what, nonneg[i].key, nonneg[i].v);
    /* Named upper limits per key: every size the engine derives from these
     * (below, checked in 64 bits) then fits an int, and every count that
     * drives a loop is bounded. */
    const struct {
        const char *key;
        int64_t v, max;
    } lim[] = {
        {"vocab_size", c->vocab_size, DS_LIMIT_VOCAB},
        {"hidden_size", c->dim, DS_LIMIT_DIM},
        {"num_hidden_layers", c->n_layers, DS_MAX_LAYERS},
        {"num_attention_heads", c->n_heads, DS_LIMIT_HEADS},
        {"head_dim", c->head_dim, DS_LIMIT_DIM},
        {"q_lora_rank", c->q_lora_rank, DS_LIMIT_DIM},
        {"o_groups", c->o_groups, DS_LIMIT_HEADS},
        {"o_lora_rank", c->o_lora_rank, DS_LIMIT_DIM},
        {"n_routed_experts", c->n_routed_experts, DS_LIMIT_EXPERTS},
        {"num_experts_per_tok", c->n_active_experts, DS_LIMIT_ACTIVE_EXPERTS},
        {"n_shared_experts", c->n_shared_experts, DS_LIMIT_ACTIVE_EXPERTS},
        {"moe_intermediate_size", c->moe_inter_dim, DS_LIMIT_DIM},
        {"sliding_window", c->window, DS_LIMIT_WINDOW},
        {"index_n_heads", c->index_n_heads, DS_LIMIT_HEADS},
        {"index_head_dim", c->index_head_dim, DS_LIMIT_DIM},
        {"index_topk", c->index_topk, DS_LIMIT_WINDOW},
        {"hc_mult", c->hc_mult, DS_LIMIT_HC_MULT},
        {"hc_sinkhorn_iters", c->hc_sinkhorn_iters, DS_LIMIT_SINKHORN_ITERS},
        {"num_hash_layers", c->n_hash_layers, DS_MAX_LAYERS},
        {"num_nextn_predict_layers", c->n_mtp, DS_MAX_LAYERS},
        {"max_position_embeddings", c->max_pos, DS_LIMIT_POSITIONS},
    };
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v > lim[i].max)
            return ds_fail(err, "%s: '%s' = %" PRId64 " exceeds the engine's limit of %" PRId64, what, lim[i].key,
                           lim[i].v, lim[i].max);
    for (int l = 0; l < c->n_layers; l++)
        if (c->compress_ratio[l] > DS_LIMIT_COMPRESS_RATIO)
            return ds_fail(err, "%s: 'compress_ratios[%d]' = %d exceeds the engine's limit of %d", what, l,
                           c->compress_ratio[l], DS_LIMIT_COMPRESS_RATIO);
    /* Derived sizes, each a row or column count of some weight or activation. */
    const struct {
        const char *expr;
        int64_t a, b;
    } prod[] = {
        {"num_attention_heads x head_dim", c->n_heads, c->head_dim},
        {"o_groups x o_lora_rank", c->o_groups, c->o_lora_rank},
        {"index_n_heads x index_head_dim", c->index_n_heads, c->index_head_dim},
        {"hc_mult x hidden_size", c->hc_mult, c->dim},
        {"(2 + hc_mult) x hc_mult", 2 + (int64_t)c->hc_mult, c->hc_mult},
        {"n_shared_experts x moe_intermediate_size", c->n_shared_experts, c->moe_inter_dim},
        {"2 x head_dim x max(compress_ratios)", 2 * (int64_t)c->head_dim, DS_LIMIT_COMPRESS_RATIO},
        {"num_experts_per_tok x hidden_size", c->n_active_experts, c->dim},
    };
    for (size_t i = 0; i < sizeof prod / sizeof prod[0]; i++)
        if (prod[i].a * prod[i].b > DS_LIMIT_DERIVED)
            return ds_fail(err, "%s: %s = %" PRId64 " x %" PRId64 " exceeds the engine's limit of %d", what,
                           prod[i].expr, prod[i].a, prod[i].b, DS_LIMIT_DERIVED);
    if (c->n_kv_heads != 1)
        return ds_fail(err, "%s: 'num_key_value_heads' = %d must be 1 (one shared K=V head)", what, c->n_kv_heads);
    if (c->rope_dim % 2 != 0 || c->rope_dim > c->head_dim)
        return ds_fail(err, "%s: 'qk_rope_head_dim' = %d must be even and at most head_dim (%d)", what, c->rope_dim,
                       c->head_dim);
    if (((int64_t)c->n_heads * c->head_dim) % c->o_groups != 0)
        return ds_fail(err, "%s: 'o_groups' = %d must divide num_attention_heads x head_dim (%d x %d)", what,
                       c->o_groups, c->n_heads, c->head_dim);
    if (c->n_active_experts > c->n_routed_experts)
        return ds_fail(err, "%s: 'num_experts_per_tok' = %d exceeds n_routed_experts (%d)", what, c->n_active_experts,
                       c->n_routed_experts);
    if (c->n_hash_layers > c->n_layers)
        return ds_fail(err, "%s: 'num_hash_layers' = %d exceeds num_hidden_layers (%d)", what, c->n_hash_layers,
                       c->n_layers);
    int any_csa = 0;
    for (int l = 0; l < c->n_layers; l++) {
        int r = c->compress_ratio[l];
        if (r < 0 || r == 1)
            return ds_fail(err, "%s: 'compress_ratios[%d]' = %d must be 0 (sliding only) or >= 2", what, l, r);
        any_csa |= r == CSA_RATIO;
    }
    if (any_csa && (c->index_head_dim < c->rope_dim || c->index_head_dim % 2 != 0))
        return ds_fail(err, "%s: 'index_head_dim' = %d must be even and at least qk_rope_head_dim (%d)", what,
                       c->index_head_dim, c->rope_dim);
    if (c->score_func < 0 || c->score_func > 2)
        return ds_fail(err, "%s: 'scoring_func' = %d is not a known scoring function", what, c->score_func);
    if (c->norm_topk_prob != 0 && c->norm_topk_prob != 1)
        return ds_fail(err, "%s: 'norm_topk_prob' = %d must be 0 or 1", what, c->norm_topk_prob);
    const struct {
        const char *key;
        double v;
        int zero_ok;
    } reals[] = {
        {"routed_scaling_factor", (double)c->route_scale, 0},
        {"swiglu_limit", (double)c->swiglu_limit, 1},
        {"hc_eps", (double)c->hc_eps, 1},
        {"rms_norm_eps", (double)c->rms_eps, 0},
        {"rope_theta", c->rope_theta, 0},
        {"compress_rope_theta", c->compress_rope_theta, 0},
        {"rope_scaling.factor", c->yarn ? c->yarn_factor : 1, 0},
        {"rope_scaling.beta_fast", c->yarn ? c->yarn_beta_fast : 1, 0},
        {"rope_scaling.beta_slow", c->yarn ? c->yarn_beta_slow : 1, 0},
    };
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        if (!isfinite(reals[i].v) || reals[i].v < 0 || (reals[i].v == 0 && !reals[i].zero_ok))
            return ds_fail(err, "%s: '%s' = %g must be a finite %s number", what, reals[i].key, reals[i].v,
                           reals[i].zero_ok ? "non-negative" : "positive");
    if (c->yarn && c->yarn_orig_max_pos <= 0)
        return ds_fail(err, "%s: 'rope_scaling.original_max_position_embeddings' = %" PRId64 " must be positive", what,
                       c->yarn_orig_max_pos);
    if (c->max_pos <= 0)
        return ds_fail(err, "%s: 'max_position_embeddings' = %" PRId64 " must be positive", what, c->max_pos);
    if (c->bos_id >= c->vocab_size || c->eos_id >= c->vocab_size)
        return ds_fail(err, "%s: '%s' = %d is not below vocab_size (%d)", what,
                       c->bos_id >= c->vocab_size ? "bos_token_id" : "eos_token_id",
                       c->bos_id >= c->vocab_size ? c->bos_id : c->eos_id, c->vocab_size);
    return 0;
}

/* ---- write -------------------------------------------------------------- */

/* Shortest text that reads back to the same value; integral values as "N.0". */
static cJSON *real_item(double v, int is_float) {
    char buf[64];
    if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, sizeof buf, "%.1f", v);
    else
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, v);
            if (is_float ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v) break;
        }
    return cJSON_CreateRaw(buf);
}

static cJSON *int_item(int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

static int add(cJSON *obj, const char *key, cJSON *item) {
    if (!item) return -1;
    cJSON_AddItemToObject(obj, key, item);
    return 0;
}

int ds_config_write(const ds_config *c, const char *path, ds_err *err) {
    if (ds_config_validate(c, path, err) != 0) return -1;
    cJSON *root = cJSON_CreateObject();
    char *text = NULL, *tmp = NULL;
    int rc = -1, bad = !root;
    if (!bad) {
        cJSON *arch = cJSON_CreateArray();
        bad |= add(root, "architectures", arch) ||
               !cJSON_AddItemToArray(arch, cJSON_CreateString("DeepseekV4ForCausalLM"));
        bad |= !cJSON_AddStringToObject(root, "model_type", "deepseek_v4");
        const struct {
            const char *key;
            int64_t v;
        } ints[] = {
            {"vocab_size", c->vocab_size},
            {"hidden_size", c->dim},
            {"num_hidden_layers", c->n_layers},
            {"num_attention_heads", c->n_heads},
            {"head_dim", c->head_dim},
            {"num_key_value_heads", c->n_kv_heads},
            {"qk_rope_head_dim", c->rope_dim},
            {"q_lora_rank", c->q_lora_rank},
            {"o_groups", c->o_groups},
            {"o_lora_rank", c->o_lora_rank},
            {"n_routed_experts", c->n_routed_experts},
            {"num_experts_per_tok", c->n_active_experts},
            {"n_shared_experts", c->n_shared_experts},
            {"moe_intermediate_size", c->moe_inter_dim},
            {"num_hash_layers", c->n_hash_layers},
            {"sliding_window", c->window},
            {"index_n_heads", c->index_n_heads},
            {"index_head_dim", c->index_head_dim},
            {"index_topk", c->index_topk},
            {"hc_mult", c->hc_mult},
            {"hc_sinkhorn_iters", c->hc_sinkhorn_iters},
            {"max_position_embeddings", c->max_pos},
            {"bos_token_id", c->bos_id},
            {"eos_token_id", c->eos_id},
            {"num_nextn_predict_layers", c->n_mtp},
        };
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            bad |= add(root, ints[i].key, int_item(ints[i].v));
        bad |= !cJSON_AddStringToObject(root, "scoring_func", score_names[c->score_func]);
        bad |= !cJSON_AddBoolToObject(root, "norm_topk_prob", c->norm_topk_prob);
        bad |= add(root, "routed_scaling_factor", real_item((double)c->route_scale, 1));
        bad |= add(root, "swiglu_limit", real_item((double)c->swiglu_limit, 1));
        bad |= add(root, "hc_eps", real_item((double)c->hc_eps, 1));
        bad |= add(root, "rms_norm_eps", real_item((double)c->rms_eps, 1));
        bad |= add(root, "rope_theta", real_item(c->rope_theta, 0));
        bad |= add(root, "compress_rope_theta", real_item(c->compress_rope_theta, 0));
        cJSON *ratios = cJSON_CreateArray();
        bad |= add(root, "compress_ratios", ratios);
        for (int l = 0; !bad && l < c->n_layers + c->n_mtp; l++)
            bad |= !cJSON_AddItemToArray(ratios, int_item(l < c->n_layers ? c->compress_ratio[l] : 0));
        if (!c->yarn)
            bad |= !cJSON_AddNullToObject(root, "rope_scaling");
        else {
            cJSON *rs = cJSON_CreateObject();
            bad |= add(root, "rope_scaling", rs);
            bad |= bad || !cJSON_AddStringToObject(rs, "type", "yarn");
            bad |= bad || add(rs, "factor", real_item(c->yarn_factor, 0));
            bad |= bad || add(rs, "original_max_position_embeddings", int_item(c->yarn_orig_max_pos));
            bad |= bad || add(rs, "beta_fast", real_item(c->yarn_beta_fast, 0));
            bad |= bad || add(rs, "beta_slow", real_item(c->yarn_beta_slow, 0));
        }
    }
    if (bad || !(text = cJSON_Print(root)) || !(tmp = malloc(strlen(path) + 5))) {
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    sprintf(tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        ds_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    size_t len = strlen(text);
    int ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF && fflush(f) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    if (!ok) {
        unlink(tmp);
        ds_fail(err, "%s: write failed: %s", path, strerror(e));
        goto out;
    }
    rc = 0;
out:
    free(tmp);
    free(text);
    cJSON_Delete(root);
    return rc;
}
