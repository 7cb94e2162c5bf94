/* weights.c — checkpoint tensors as typed weight matrices (see weights.h). */
#include "model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *shape_str(const ds_tensor *t, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
    return buf;
}

static int check_shape2(const ds_tensor *t, int64_t r, int64_t c, ds_err *err) {
    if (t->ndim == 2 && t->shape[0] == r && t->shape[1] == c) return 0;
    char b[128];
    return ds_fail(err, "tensor '%s': shape %s, expected [%lld, %lld]", t->name, shape_str(t, b, sizeof b),
                   (long long)r, (long long)c);
}

static int get_scale(const ds_checkpoint *ck, const char *prefix, int64_t r, int64_t c, ds_weight *w, ds_err *err) {
    char name[512];
    snprintf(name, sizeof name, "%s.scale", prefix);
    const ds_tensor *s = ds_checkpoint_find(ck, name);
    if (!s) return ds_fail(err, "tensor '%s' is missing (needed by the quantized '%s.weight')", name, prefix);
    if (s->dtype != DS_F8_E8M0 && s->dtype != DS_F32)
        return ds_fail(err, "tensor '%s': dtype %s, expected F8_E8M0 or F32", name, ds_dtype_name(s->dtype));
    if (check_shape2(s, r, c, err)) return ds_fail_prefix(err, "scale grid does not match its weight");
    w->scale = s->data;
    w->scale_f32 = s->dtype == DS_F32;
    w->scale_cols = (int)c;
    return 0;
}

/* The tensor `name` as a weight of `rows` x `cols` in one of the `allow`ed
 * kinds; FP8 / FP4 take their scale grid from "<prefix>.scale". */
static int weight_from(const ds_checkpoint *ck, const char *name, const char *prefix, int rows, int cols,
                       unsigned allow, ds_weight *w, ds_err *err) {
    const ds_tensor *t = ds_checkpoint_find(ck, name);
    if (!t) return ds_fail(err, "tensor '%s' is missing", name);
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    w->name = t->name;
    switch (t->dtype) {
    case DS_F32: w->kind = DS_W_F32; break;
    case DS_BF16: w->kind = DS_W_BF16; break;
    case DS_F16: w->kind = DS_W_F16; break;
    case DS_F8_E4M3: w->kind = DS_W_FP8; break;
    case DS_I8:
    case DS_U8: w->kind = DS_W_FP4; break;
    default: return ds_fail(err, "tensor '%s': dtype %s is not a weight format", name, ds_dtype_name(t->dtype));
    }
    if (!(allow & (1u << w->kind)))
        return ds_fail(err, "tensor '%s': dtype %s is not allowed for this weight", name, ds_dtype_name(t->dtype));
    if (w->kind == DS_W_FP4) {
        if (cols % DS_FP4_GROUP)
            return ds_fail(err, "tensor '%s': FP4 weight needs in-features (%d) divisible by %d", name, cols,
                           DS_FP4_GROUP);
        if (check_shape2(t, rows, cols / 2, err)) return -1;
        return get_scale(ck, prefix, rows, cols / DS_FP4_GROUP, w, err);
    }
    if (check_shape2(t, rows, cols, err)) return -1;
    if (w->kind == DS_W_FP8)
        return get_scale(ck, prefix, (rows + DS_FP8_BLOCK - 1) / DS_FP8_BLOCK, (cols + DS_FP8_BLOCK - 1) / DS_FP8_BLOCK,
                         w, err);
    return 0;
}

int ds_weight_get(const ds_checkpoint *ck, const char *prefix, int rows, int cols, unsigned allow, ds_weight *w,
                  ds_err *err) {
    char name[512];
    snprintf(name, sizeof name, "%s.weight", prefix);
    return weight_from(ck, name, prefix, rows, cols, allow, w, err);
}

int ds_weight_get_named(const ds_checkpoint *ck, const char *name, int rows, int cols, ds_weight *w, ds_err *err) {
    return weight_from(ck, name, name, rows, cols, DS_ALLOW_DENSE, w, err);
}

int ds_tensor_to_f32(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape, float **out,
                     ds_err *err) {
    *out = NULL;
    const ds_tensor *t = ds_checkpoint_find(ck, name);
    if (!t) return ds_fail(err, "tensor '%s' is missing", name);
    int ok = t->ndim == ndim;
    uint64_t n = 1;
    for (int i = 0; ok && i < ndim; i++) {
        ok = t->shape[i] == shape[i];
        n *= (uint64_t)shape[i];
    }
    if (!ok) {
        char b[128], e[128];
        size_t off = (size_t)snprintf(e, sizeof e, "[");
        for (int i = 0; i < ndim && off < sizeof e; i++)
            off += (size_t)snprintf(e + off, sizeof e - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (off < sizeof e) snprintf(e + off, sizeof e - off, "]");
        return ds_fail(err, "tensor '%s': shape %s, expected %s", name, shape_str(t, b, sizeof b), e);
    }
    if (t->dtype != DS_F32 && t->dtype != DS_BF16 && t->dtype != DS_F16)
        return ds_fail(err, "tensor '%s': dtype %s, expected F32, BF16 or F16", name, ds_dtype_name(t->dtype));
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return ds_fail(err, "tensor '%s': out of memory", name);
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h;
        if (t->dtype == DS_F32) {
            memcpy(&v[i], t->data + 4 * i, 4);
        } else {
            memcpy(&h, t->data + 2 * i, 2);
            v[i] = t->dtype == DS_BF16 ? ds_bf16_to_f32(h) : ds_f16_to_f32(h);
        }
    }
    *out = v;
    return 0;
}
