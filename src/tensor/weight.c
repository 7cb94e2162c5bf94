/* weight.c — storage kinds: element decoders, row views, sizes (see weight.h). */
#include "tensor/weight.h"

#include <math.h>
#include <string.h>

const float ds_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float ds_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ds_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    uint32_t u;
    if (exp == 31)
        u = sign | 0x7f800000u | (mant << 13);
    else
        u = sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13);
    memcpy(&f, &u, 4);
    return f;
}

float ds_e8m0_to_f32(uint8_t e) {
    if (e == 255) return NAN;
    return ldexpf(1.0f, (int)e - 127);
}

float ds_fp8_e4m3_to_f32(uint8_t b) {
    int sign = b >> 7, exp = (b >> 3) & 0xf, mant = b & 7;
    float v;
    if (exp == 15 && mant == 7) return NAN;
    if (exp == 0)
        v = ldexpf((float)mant, -9);
    else
        v = ldexpf(1.0f + mant / 8.0f, exp - 7);
    return sign ? -v : v;
}

ds_weight ds_weight_rows(const ds_weight *w, int r0, int n) {
    ds_weight v = *w;
    size_t rb = w->kind == DS_W_F32 ? 4 * (size_t)w->cols
                : w->kind == DS_W_FP8 ? (size_t)w->cols
                : w->kind == DS_W_FP4 ? (size_t)w->cols / 2
                                      : 2 * (size_t)w->cols;
    v.data = w->data + (size_t)r0 * rb;
    v.rows = n;
    v.packed = NULL;
    v.packed_bytes = 0;
    if (w->kind == DS_W_FP8)
        v.srow0 = w->srow0 + r0;
    else if (w->kind == DS_W_FP4)
        v.scale = w->scale + (size_t)r0 * (size_t)w->scale_cols * (w->scale_f32 ? 4 : 1);
    return v;
}

uint64_t ds_weight_bytes(const ds_weight *w) {
    uint64_t n = (uint64_t)w->rows * (uint64_t)w->cols;
    uint64_t ss = w->scale_f32 ? 4 : 1;
    switch (w->kind) {
    case DS_W_F32: return n * 4;
    case DS_W_BF16:
    case DS_W_F16: return n * 2;
    case DS_W_FP8:
        return n + ss * (uint64_t)((w->rows + DS_FP8_BLOCK - 1) / DS_FP8_BLOCK) * (uint64_t)w->scale_cols;
    case DS_W_FP4: return n / 2 + ss * (uint64_t)w->rows * (uint64_t)w->scale_cols;
    }
    return 0;
}

uint64_t ds_weight_scale_bytes(const ds_weight *w) {
    uint64_t ss = w->scale_f32 ? 4 : 1;
    if (w->kind == DS_W_FP8)
        return ss * (uint64_t)((w->rows + DS_FP8_BLOCK - 1) / DS_FP8_BLOCK) * (uint64_t)w->scale_cols;
    if (w->kind == DS_W_FP4) return ss * (uint64_t)w->rows * (uint64_t)w->scale_cols;
    return 0;
}

uint64_t ds_weight_read_bytes(const ds_weight *w) { return w->packed ? w->packed_bytes : ds_weight_bytes(w); }

static float scale_at(const ds_weight *w, int r, int c) {
    size_t i = (size_t)r * (size_t)w->scale_cols + (size_t)c;
    if (w->scale_f32) {
        float f;
        memcpy(&f, w->scale + 4 * i, 4);
        return f;
    }
    return ds_e8m0_to_f32(w->scale[i]);
}

void ds_weight_row_f32(const ds_weight *w, int r, float *out) {
    size_t base = (size_t)r * (size_t)w->cols;
    for (int c = 0; c < w->cols; c++) {
        uint16_t h;
        switch (w->kind) {
        case DS_W_F32: memcpy(&out[c], w->data + 4 * (base + c), 4); break;
        case DS_W_BF16:
            memcpy(&h, w->data + 2 * (base + c), 2);
            out[c] = ds_bf16_to_f32(h);
            break;
        case DS_W_F16:
            memcpy(&h, w->data + 2 * (base + c), 2);
            out[c] = ds_f16_to_f32(h);
            break;
        case DS_W_FP8:
            out[c] = ds_fp8_e4m3_to_f32(w->data[base + c]) * scale_at(w, (w->srow0 + r) / DS_FP8_BLOCK, c / DS_FP8_BLOCK);
            break;
        case DS_W_FP4: {
            uint8_t b = w->data[base / 2 + c / 2];
            int code = (c & 1) ? (b >> 4) : (b & 15);
            out[c] = ds_e2m1_values[code] * scale_at(w, r, c / DS_FP4_GROUP);
            break;
        }
        }
    }
}
