/* heatmap.c — the layer x expert load picture through libpng (heatmap.h) */
#include "cli/heatmap.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_heatmap_rgb(long long c, double mean, unsigned char rgb[3]) {
    if (!(mean > 0)) {
        rgb[0] = rgb[1] = rgb[2] = 128;
        return;
    }
    if (c <= 0) {
        rgb[0] = rgb[1] = rgb[2] = 0;
        return;
    }
    double t = log2((double)c / mean) / 3;
    t = t > 1 ? 1 : t < -1 ? -1 : t;
    unsigned char fade = (unsigned char)lrint(255 * (1 - fabs(t)));
    rgb[0] = t > 0 ? 255 : fade; /* hot: white -> red */
    rgb[1] = fade;
    rgb[2] = t < 0 ? 255 : fade; /* cold: white -> blue */
}

/* libpng reports errors by longjmp: the message goes to the caller's msg */
typedef struct {
    char *msg;
    size_t n;
    const char *path;
    jmp_buf jb;
} png_ctx;

static void on_error(png_structp p, png_const_charp what) {
    png_ctx *c = png_get_error_ptr(p);
    snprintf(c->msg, c->n, "%s: %s", c->path, what);
    longjmp(c->jb, 1);
}

static void on_warning(png_structp p, png_const_charp what) { (void)p, (void)what; }

int cli_heatmap_png(const char *path, const long long *counts, int layers, int experts, int cw, int ch, char *msg,
                    size_t n) {
    if (layers < 1 || experts < 1 || cw < 1 || ch < 1 || (size_t)experts * (size_t)cw > (1u << 20)) {
        snprintf(msg, n, "%s: a picture of %d x %d cells of %d x %d pixels cannot be written", path, layers, experts,
                 cw, ch);
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(msg, n, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t W = (size_t)experts * (size_t)cw;
    /* volatile: read after a longjmp out of libpng */
    unsigned char *volatile row = malloc(3 * W);
    png_ctx ctx;
    ctx.msg = msg, ctx.n = n, ctx.path = path;
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, on_error, on_warning);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    int rc = -1;
    if (!row || !p || !info) {
        snprintf(msg, n, "%s: out of memory", path);
        goto out;
    }
    if (setjmp(ctx.jb)) goto out;
    png_init_io(p, f);
    png_set_IHDR(p, info, (png_uint_32)W, (png_uint_32)((size_t)layers * (size_t)ch), 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(p, info);
    for (int L = 0; L < layers; L++) {
        const long long *cl = counts + (size_t)L * (size_t)experts;
        long long sum = 0;
        for (int e = 0; e < experts; e++) sum += cl[e];
        double mean = (double)sum / experts;
        for (int e = 0; e < experts; e++) {
            unsigned char rgb[3];
            cli_heatmap_rgb(cl[e], mean, rgb);
            for (int x = 0; x < cw; x++) memcpy(row + 3 * ((size_t)e * (size_t)cw + (size_t)x), rgb, 3);
        }
        for (int y = 0; y < ch; y++) png_write_row(p, row);
    }
    png_write_end(p, NULL);
    rc = 0;
out:
    png_destroy_write_struct(p ? &p : NULL, info ? &info : NULL);
    free(row);
    if (fclose(f) && !rc) {
        snprintf(msg, n, "%s: %s", path, strerror(errno));
        rc = -1;
    }
    if (rc) remove(path);
    return rc;
}
