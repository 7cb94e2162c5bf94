/* test_config.c — config.json: the official hub form and the transformers form
 * parse to the same struct, defaults are V4-Flash, write -> load round trips,
 * and every bad input fails with a message naming the file and the key. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/config.h"
#include "testutil.h"

#define WHAT "bad-config.json"

/* Appends printf output to a fixed buffer. */
typedef struct sbuf {
    char s[16384];
    size_t n;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->n, sizeof b->s - b->n, fmt, ap);
    va_end(ap);
    if (k > 0) b->n += (size_t)k;
    if (b->n >= sizeof b->s) b->n = sizeof b->s - 1;
}

/* Keys common to both forms, as the hub's V4-Flash config.json has them. */
static void common_keys(sbuf *b) {
    put(b,
        "\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\", \"torch_dtype\": "
        "\"bfloat16\","
        "\"vocab_size\": 129280, \"hidden_size\": 4096, \"num_hidden_layers\": 43, \"num_attention_heads\": 64,"
        "\"head_dim\": 512, \"num_key_value_heads\": 1, \"q_lora_rank\": 1024, \"o_groups\": 8, \"o_lora_rank\": 1024,"
        "\"n_routed_experts\": 256, \"num_experts_per_tok\": 6, \"n_shared_experts\": 1,"
        "\"moe_intermediate_size\": 2048, \"scoring_func\": \"sqrtsoftplus\", \"norm_topk_prob\": true,"
        "\"routed_scaling_factor\": 1.5, \"swiglu_limit\": 10.0, \"sliding_window\": 128, \"index_n_heads\": 64,"
        "\"index_head_dim\": 128, \"index_topk\": 512, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06,"
        "\"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 1048576, \"bos_token_id\": 0, \"eos_token_id\": 1,"
        "\"num_nextn_predict_layers\": 1, \"expert_dtype\": \"fp4\","
        "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\","
        "\"weight_block_size\": [128, 128]}");
}

static void official_json(sbuf *b) {
    put(b, "{");
    common_keys(b);
    put(b, ", \"qk_rope_head_dim\": 64, \"num_hash_layers\": 3, \"rope_theta\": 10000, \"compress_rope_theta\": 160000,"
           " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536,"
           " \"beta_fast\": 32, \"beta_slow\": 1}, \"compress_ratios\": [");
    for (int l = 0; l < 44; l++)
        put(b, "%s%d", l ? ", " : "", l < 2 || l == 43 ? 0 : (l % 2 == 0 ? 4 : 128));
    put(b, "]}");
}

static void transformers_json(sbuf *b) {
    static const char *const kinds[] = {"sliding_attention", "compressed_sparse_attention",
                                        "heavily_compressed_attention"};
    put(b, "{");
    common_keys(b);
    put(b, ", \"partial_rotary_factor\": 0.125, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
           " \"compress_rates\": {\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 128},"
           " \"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0,"
           " \"partial_rotary_factor\": 0.125}, \"compress\": {\"rope_type\": \"yarn\", \"rope_theta\": 160000.0,"
           " \"factor\": 16.0, \"original_max_position_embeddings\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
           " \"attention_factor\": 1.0, \"partial_rotary_factor\": 0.125}}, \"layer_types\": [");
    for (int l = 0; l < 43; l++)
        put(b, "%s\"%s\"", l ? ", " : "", kinds[l < 2 ? 0 : (l % 2 == 0 ? 1 : 2)]);
    put(b, "], \"mlp_layer_types\": [");
    for (int l = 0; l < 43; l++)
        put(b, "%s\"%s\"", l ? ", " : "", l < 3 ? "hash_moe" : "moe");
    put(b, "]}");
}

/* The Flash compress_ratios list for 43 layers as JSON, with entry `at` set to `value`. */
static void ratio_list(sbuf *b, int at, int value) {
    put(b, "[");
    for (int l = 0; l < 43; l++)
        put(b, "%s%d", l ? ", " : "", l == at ? value : l < 2 ? 0 : (l % 2 == 0 ? 4 : 128));
    put(b, "]");
}

/* Field-by-field comparison; names the first difference in *what. */
static int same_config(const ds_config *a, const ds_config *b, const char **what) {
    /* clang-format off */
#define F(x)                                                                                                           \
    if (a->x != b->x) {                                                                                                \
        *what = #x;                                                                                                    \
        return 0;                                                                                                      \
    }
    F(vocab_size) F(dim) F(n_layers) F(n_heads) F(head_dim) F(n_kv_heads) F(rope_dim) F(q_lora_rank) F(o_groups)
    F(o_lora_rank) F(n_routed_experts) F(n_active_experts) F(n_shared_experts) F(moe_inter_dim) F(n_hash_layers)
    F(score_func) F(norm_topk_prob) F(route_scale) F(swiglu_limit) F(window) F(index_n_heads) F(index_head_dim)
    F(index_topk) F(hc_mult) F(hc_sinkhorn_iters) F(hc_eps) F(rope_theta) F(compress_rope_theta) F(yarn)
    F(rms_eps) F(max_pos) F(bos_id) F(eos_id) F(n_mtp)
    if (a->yarn) {
        F(yarn_factor) F(yarn_beta_fast) F(yarn_beta_slow) F(yarn_orig_max_pos)
    }
    for (int l = 0; l < a->n_layers; l++) F(compress_ratio[l])
#undef F
    /* clang-format on */
    return 1;
}

#define CHECK_SAME(a, b, label)                                                                                        \
    do {                                                                                                               \
        const char *diff_ = "";                                                                                        \
        CHECK(same_config(a, b, &diff_), "%s: field %s differs", label, diff_);                                        \
    } while (0)

/* `base` with `key` replaced by the JSON `value` (removed when value is NULL). Caller frees. */
static char *with_key(const char *base, const char *key, const char *value) {
    cJSON *root = cJSON_Parse(base);
    if (!root) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (value) {
        cJSON *v = cJSON_Parse(value);
        if (v) cJSON_AddItemToObject(root, key, v);
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

/* Parsing `base` with key := value must fail with a message naming WHAT and `needle`. */
static void expect_bad(const char *base, const char *key, const char *value, const char *needle, int line) {
    char *text = with_key(base, key, value);
    ds_config c;
    ds_err err = {{0}};
    int rc = text ? ds_config_parse(text, WHAT, &c, &err) : 0;
    CHECK(rc == -1, "line %d: %s = %s should be rejected", line, key, value ? value : "(absent)");
    CHECK(strstr(err.msg, WHAT) && strstr(err.msg, needle), "line %d: message lacks '%s': %s", line, needle, err.msg);
    free(text);
}
#define BAD(base, key, value, needle) expect_bad(base, key, value, needle, __LINE__)
/* Two keys replaced at once. */
static void expect_bad2(const char *base, const char *k1, const char *v1, const char *k2, const char *v2,
                        const char *needle, int line) {
    char *once = with_key(base, k1, v1);
    if (once) expect_bad(once, k2, v2, needle, line);
    CHECK(once != NULL, "line %d: with_key", line);
    free(once);
}
#define BAD2(base, k1, v1, k2, v2, needle) expect_bad2(base, k1, v1, k2, v2, needle, __LINE__)

static void test_forms(void) {
    ds_config flash, a, b;
    ds_err err = {{0}};
    ds_config_flash(&flash);
    CHECK(ds_config_validate(&flash, "flash", &err) == 0, "flash defaults valid: %s", err.msg);
    CHECK(flash.compress_ratio[0] == 0 && flash.compress_ratio[1] == 0 && flash.compress_ratio[2] == 4 &&
              flash.compress_ratio[3] == 128 && flash.compress_ratio[42] == 4 && flash.compress_ratio[43] == 0,
          "flash ratio pattern");

    sbuf o = {.n = 0}, t = {.n = 0};
    official_json(&o);
    transformers_json(&t);
    CHECK(ds_config_parse(o.s, "official.json", &a, &err) == 0, "official form: %s", err.msg);
    CHECK_SAME(&a, &flash, "official form vs flash");
    CHECK(ds_config_parse(t.s, "transformers.json", &b, &err) == 0, "transformers form: %s", err.msg);
    CHECK_SAME(&b, &flash, "transformers form vs flash");

    /* Only the required keys (plus the YaRN block): everything else defaults to Flash. */
    const char *minimal = "{\"vocab_size\": 129280, \"hidden_size\": 4096, \"num_hidden_layers\": 43,"
                          " \"num_attention_heads\": 64, \"head_dim\": 512, \"moe_intermediate_size\": 2048,"
                          " \"n_routed_experts\": 256, \"num_experts_per_tok\": 6,"
                          " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 16,"
                          " \"original_max_position_embeddings\": 65536, \"beta_fast\": 32, \"beta_slow\": 1}}";
    CHECK(ds_config_parse(minimal, "minimal.json", &a, &err) == 0, "minimal: %s", err.msg);
    CHECK_SAME(&a, &flash, "minimal vs flash");

    /* Transformers form without top-level rope keys, flat rope_parameters, num_local_experts alias. */
    char *x = with_key(t.s, "rope_theta", NULL), *y = with_key(x, "compress_rope_theta", NULL);
    CHECK(y && ds_config_parse(y, "t2.json", &a, &err) == 0, "transformers without top-level thetas: %s", err.msg);
    CHECK_SAME(&a, &flash, "transformers without top-level thetas");
    free(x), free(y);
    x = with_key(o.s, "rope_scaling", NULL);
    y = with_key(x, "rope_parameters",
                 "{\"rope_type\": \"yarn\", \"factor\": 16, \"beta_fast\": 32, \"beta_slow\": 1,"
                 " \"original_max_position_embeddings\": 65536}");
    CHECK(y && ds_config_parse(y, "t3.json", &a, &err) == 0, "flat rope_parameters: %s", err.msg);
    CHECK_SAME(&a, &flash, "flat rope_parameters");
    free(x), free(y);
    x = with_key(o.s, "n_routed_experts", NULL);
    y = with_key(x, "num_local_experts", "256");
    CHECK(y && ds_config_parse(y, "t4.json", &a, &err) == 0 && a.n_routed_experts == 256, "num_local_experts: %s",
          err.msg);
    free(x), free(y);

    /* Variants of single keys. */
    /* A 2-layer model without num_hash_layers: the default 3 is capped at the layer count. */
    const char *tiny = "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
                       " \"head_dim\": 16, \"qk_rope_head_dim\": 8, \"moe_intermediate_size\": 8,"
                       " \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"o_groups\": 2}";
    CHECK(ds_config_parse(tiny, "tiny.json", &a, &err) == 0 && a.n_hash_layers == 2 && a.compress_ratio[1] == 0,
          "tiny: %s", err.msg);
    x = with_key(o.s, "eos_token_id", "[7, 1]");
    CHECK(x && ds_config_parse(x, "eos.json", &a, &err) == 0 && a.eos_id == 7, "eos list: %s", err.msg);
    free(x);
    x = with_key(o.s, "rope_scaling", "null");
    CHECK(x && ds_config_parse(x, "noyarn.json", &a, &err) == 0 && a.yarn == 0, "rope_scaling null: %s", err.msg);
    free(x);
    x = with_key(o.s, "scoring_func", "\"sigmoid\"");
    CHECK(x && ds_config_parse(x, "sig.json", &a, &err) == 0 && a.score_func == DS_SCORE_SIGMOID, "sigmoid: %s",
          err.msg);
    free(x);
    sbuf r = {.n = 0};
    ratio_list(&r, 5, 8);
    x = with_key(o.s, "compress_ratios", r.s);
    CHECK(x && ds_config_parse(x, "ratios.json", &a, &err) == 0 && a.compress_ratio[5] == 8, "other ratio: %s",
          err.msg);
    free(x);
}

static void test_write_round_trip(void) {
    char dir[] = "/tmp/dsv4-test-config-XXXXXX";
    if (!mkdtemp(dir)) return;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ds_config flash, a, small;
    ds_err err = {{0}};
    ds_config_flash(&flash);
    CHECK(ds_config_write(&flash, path, &err) == 0, "write flash: %s", err.msg);
    CHECK(ds_config_load(path, &a, &err) == 0, "load flash: %s", err.msg);
    CHECK_SAME(&a, &flash, "flash write -> load");

    /* A small synthetic config with odd values survives the trip bit-exactly. */
    ds_config_flash(&small);
    small.vocab_size = 300, small.dim = 64, small.n_layers = 4, small.n_heads = 4, small.head_dim = 32;
    small.rope_dim = 8, small.q_lora_rank = 16, small.o_groups = 2, small.o_lora_rank = 8;
    small.n_routed_experts = 8, small.n_active_experts = 2, small.n_shared_experts = 0, small.moe_inter_dim = 24;
    small.n_hash_layers = 1, small.score_func = DS_SCORE_SOFTMAX, small.norm_topk_prob = 0;
    small.route_scale = 2.5f, small.swiglu_limit = 0.1f, small.window = 8, small.index_n_heads = 16;
    small.index_head_dim = 16, small.index_topk = 3, small.hc_mult = 2, small.hc_sinkhorn_iters = 3;
    small.hc_eps = 3.3e-7f, small.rope_theta = 12345.678, small.compress_rope_theta = 1e5 / 3, small.yarn = 0;
    small.rms_eps = 1e-5f, small.max_pos = 5000000000LL, small.bos_id = 5, small.eos_id = 299, small.n_mtp = 2;
    int ratios[4] = {0, 4, 128, 16};
    memcpy(small.compress_ratio, ratios, sizeof ratios);
    CHECK(ds_config_write(&small, path, &err) == 0, "write small: %s", err.msg);
    CHECK(ds_config_load(path, &a, &err) == 0, "load small: %s", err.msg);
    CHECK_SAME(&a, &small, "small write -> load");
    small.yarn = 1, small.yarn_factor = 4.25, small.yarn_beta_fast = 30.5, small.yarn_beta_slow = 0.75;
    small.yarn_orig_max_pos = 4096;
    CHECK(ds_config_write(&small, path, &err) == 0, "write small yarn: %s", err.msg);
    CHECK(ds_config_load(path, &a, &err) == 0, "load small yarn: %s", err.msg);
    CHECK_SAME(&a, &small, "small yarn write -> load");
    CHECK(access(path, F_OK) == 0, "config written");

    /* compress_ratios in the file: n_layers entries followed by n_mtp zeros. */
    FILE *f = fopen(path, "rb");
    char text[8192] = {0};
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
    }
    cJSON *root = cJSON_Parse(text);
    const cJSON *cr = cJSON_GetObjectItemCaseSensitive(root, "compress_ratios");
    CHECK(cJSON_GetArraySize(cr) == 6 && cJSON_GetArrayItem(cr, 3)->valueint == 16 &&
              cJSON_GetArrayItem(cr, 5)->valueint == 0,
          "compress_ratios written with the MTP entries");
    cJSON_Delete(root);

    /* Invalid config is not written. */
    small.n_kv_heads = 2;
    CHECK(ds_config_write(&small, path, &err) == -1 && strstr(err.msg, "num_key_value_heads"), "write invalid: %s",
          err.msg);
    unlink(path);
    CHECK(ds_config_load(path, &a, &err) == -1 && strstr(err.msg, "config.json"), "load missing file: %s", err.msg);
    rmdir(dir);
}

static void test_bad(void) {
    sbuf ob = {.n = 0}, tb = {.n = 0};
    official_json(&ob);
    transformers_json(&tb);
    const char *o = ob.s, *t = tb.s;

    /* Required keys. */
    static const char *const required[] = {"vocab_size",          "hidden_size",        "num_hidden_layers",
                                           "num_attention_heads", "head_dim",           "moe_intermediate_size",
                                           "n_routed_experts",    "num_experts_per_tok"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        BAD(o, required[i], NULL, required[i]);

    /* Wrong JSON types. */
    BAD(o, "hidden_size", "\"4096\"", "hidden_size");
    BAD(o, "head_dim", "512.5", "head_dim");
    BAD(o, "vocab_size", "1e12", "vocab_size");
    BAD(o, "norm_topk_prob", "\"yes\"", "norm_topk_prob");
    BAD(o, "routed_scaling_factor", "[1.5]", "routed_scaling_factor");
    BAD(o, "compress_ratios", "5", "compress_ratios");
    BAD(o, "compress_ratios", "[0, \"4\"]", "compress_ratios");
    BAD(o, "rope_scaling", "3", "rope_scaling");
    BAD(o, "rope_scaling", "{\"type\": \"yarn\", \"factor\": \"16\"}", "rope_scaling.factor");
    BAD(o, "rope_scaling", "{\"factor\": 16}", "rope_scaling");
    BAD(o, "rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", "rope_scaling.type");
    BAD(o, "scoring_func", "1", "scoring_func");
    BAD(o, "eos_token_id", "[]", "eos_token_id");
    BAD(o, "eos_token_id", "\"</s>\"", "eos_token_id");
    BAD(o, "max_position_embeddings", "true", "max_position_embeddings");

    /* Limits per key and derived sizes (issue 14: these used to wrap or hang). */
    BAD(o, "hc_sinkhorn_iters", "2147483647", "'hc_sinkhorn_iters' = 2147483647 exceeds");
    BAD(o, "hc_mult", "100000", "'hc_mult' = 100000 exceeds");
    BAD(o, "num_attention_heads", "1000000", "'num_attention_heads' = 1000000 exceeds");
    BAD(o, "vocab_size", "2147483647", "'vocab_size' = 2147483647 exceeds");
    BAD(o, "index_topk", "2000000000", "'index_topk'");
    BAD(o, "sliding_window", "2000000000", "'sliding_window'");
    BAD(o, "max_position_embeddings", "2199023255552", "'max_position_embeddings'");
    BAD2(o, "num_attention_heads", "4096", "head_dim", "65536", "num_attention_heads x head_dim");
    BAD2(o, "o_groups", "4096", "o_lora_rank", "65536", "o_groups x o_lora_rank");
    BAD2(o, "index_n_heads", "4096", "index_head_dim", "65536", "index_n_heads x index_head_dim");
    BAD2(o, "hc_mult", "64", "hidden_size", "65537", "'hidden_size' = 65537 exceeds");
    {
        sbuf rb = {.n = 0};
        ratio_list(&rb, 5, 1 << 20);
        BAD(o, "compress_ratios", rb.s, "compress_ratios[5]");
    }

    /* Invalid values. */
    BAD(o, "hidden_size", "-1", "hidden_size");
    BAD(o, "q_lora_rank", "0", "q_lora_rank");
    BAD(o, "num_key_value_heads", "8", "num_key_value_heads");
    BAD(o, "qk_rope_head_dim", "63", "qk_rope_head_dim");
    BAD(o, "qk_rope_head_dim", "1024", "qk_rope_head_dim");
    BAD(o, "o_groups", "7", "o_groups");
    BAD(o, "num_experts_per_tok", "300", "num_experts_per_tok");
    BAD(o, "num_hash_layers", "50", "num_hash_layers");
    BAD(o, "num_hidden_layers", "300", "num_hidden_layers");
    BAD(o, "num_hidden_layers", "0", "num_hidden_layers");
    BAD(o, "compress_ratios", "[0, 0, 4, 128]", "compress_ratios");
    sbuf r1 = {.n = 0};
    ratio_list(&r1, 1, 1);
    BAD(o, "compress_ratios", r1.s, "compress_ratios[1]");
    BAD(o, "hc_mult", "0", "hc_mult");
    BAD(o, "hc_sinkhorn_iters", "0", "hc_sinkhorn_iters");
    BAD(o, "scoring_func", "\"relu\"", "scoring_func");
    BAD(o, "rms_norm_eps", "0", "rms_norm_eps");
    BAD(o, "rope_theta", "-5", "rope_theta");
    BAD(o, "eos_token_id", "129280", "eos_token_id");
    BAD(o, "n_shared_experts", "-1", "n_shared_experts");
    BAD(o, "index_head_dim", "32", "index_head_dim");
    BAD(o, "rope_scaling", "{\"type\": \"yarn\", \"factor\": 0}", "rope_scaling.factor");
    BAD(o, "rope_scaling", "{\"type\": \"yarn\", \"original_max_position_embeddings\": -1}",
        "original_max_position_embeddings");

    /* Transformers form. */
    BAD(t, "layer_types", "[\"sliding_attention\", \"full_attention\"]", "layer_types");
    BAD(t, "layer_types", "[\"sliding_attention\"]", "layer_types");
    BAD(t, "mlp_layer_types", "[\"moe\", \"hash_moe\", \"moe\"]", "mlp_layer_types");
    BAD(t, "mlp_layer_types", "[\"dense\"]", "mlp_layer_types");
    BAD(t, "compress_rates", "{\"compressed_sparse_attention\": 2}", "compress_rates.compressed_sparse_attention");
    BAD(t, "compress_rates", "{\"heavily_compressed_attention\": 4}", "compress_rates.heavily_compressed_attention");
    BAD(t, "compress_rates", "[4, 128]", "compress_rates");
    BAD(t, "partial_rotary_factor", "0.1", "partial_rotary_factor");
    BAD(t, "partial_rotary_factor", "\"1/8\"", "partial_rotary_factor");
    BAD(t, "rope_parameters", "{\"main\": {\"rope_type\": \"yarn\"}}", "rope_parameters.main.rope_type");
    BAD(t, "rope_parameters", "{\"compress\": {\"rope_type\": \"dynamic\"}}", "rope_parameters.compress.rope_type");
    BAD(t, "rope_parameters", "{\"compress\": {\"rope_theta\": \"big\"}}", "rope_parameters.compress.rope_theta");
    BAD(t, "rope_parameters", "7", "rope_parameters");
    /* Both forms present but disagreeing. */
    char *x = with_key(t, "qk_rope_head_dim", "32");
    BAD(x, "partial_rotary_factor", "0.125", "qk_rope_head_dim");
    free(x);
    x = with_key(t, "num_hash_layers", "2");
    BAD(x, "num_nextn_predict_layers", "1", "num_hash_layers");
    free(x);
    sbuf r2 = {.n = 0};
    ratio_list(&r2, 42, 128);
    char *y = with_key(t, "compress_ratios", r2.s);
    BAD(y, "num_hash_layers", NULL, "layer_types[42]");
    free(y);

    /* Not JSON / not an object. */
    ds_config c;
    ds_err err = {{0}};
    CHECK(ds_config_parse("{\"vocab_size\": ", WHAT, &c, &err) == -1 && strstr(err.msg, WHAT), "truncated: %s",
          err.msg);
    CHECK(ds_config_parse("{} trailing", WHAT, &c, &err) == -1 && strstr(err.msg, WHAT), "trailing: %s", err.msg);
    CHECK(ds_config_parse("[1]", WHAT, &c, &err) == -1 && strstr(err.msg, "object"), "array: %s", err.msg);
}

/* Random edits of a valid config: each parse succeeds with a valid struct or
 * fails with a message naming the file (ASan watches for the rest). */
static void test_mutations(void) {
    static const char json_bytes[] = "{}[],:\"0123456789.-e ntfl";
    sbuf o = {.n = 0};
    transformers_json(&o);
    size_t n = strlen(o.s);
    char *buf = malloc(n + 1);
    if (!buf) return;
    uint32_t rng = 777;
    int ok = 0, bad = 0, named = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, o.s, n + 1);
        for (int k = 0; k < 1 + it % 3; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t at = (rng >> 8) % n;
            rng = rng * 1664525u + 1013904223u;
            buf[at] = json_bytes[(rng >> 8) % (sizeof json_bytes - 1)];
        }
        if (it % 7 == 0) buf[(rng >> 3) % n] = 0;
        ds_config c;
        ds_err err = {{0}};
        if (ds_config_parse(buf, WHAT, &c, &err) == 0)
            ok += ds_config_validate(&c, WHAT, &err) == 0;
        else
            bad++, named += strstr(err.msg, WHAT) != NULL;
    }
    free(buf);
    CHECK(ok + bad == 3000 && bad > 0 && named == bad, "mutations: %d ok, %d rejected, %d named", ok, bad, named);
}

int main(void) {
    test_forms();
    test_write_round_trip();
    test_bad();
    test_mutations();
    return test_summary("test_config");
}
