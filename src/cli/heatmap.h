/* heatmap.h — the expert load of every MoE layer as a picture: a PNG of
 * layers (rows, top to bottom) by experts (columns, left to right), each cell
 * coloured by its load against its layer's mean (dsv4 stats --heatmap). */
#ifndef DS_CLI_HEATMAP_H
#define DS_CLI_HEATMAP_H

#include <stddef.h>

/* The cell of load c in a layer of mean load `mean`, as 8-bit RGB: white at
 * the mean; towards red as log2(c / mean) rises to +3 (8x the mean and
 * above), towards blue as it falls to -3; black for an expert that took no
 * token in a layer that routed some; grey for a layer that routed none. */
void cli_heatmap_rgb(long long c, double mean, unsigned char rgb[3]);

/* Writes counts[layer * experts + e] as PNG (cells of cw x ch pixels) to
 * path; 0, or -1 with the reason (naming the file) in msg. */
int cli_heatmap_png(const char *path, const long long *counts, int layers, int experts, int cw, int ch, char *msg,
                    size_t n);

#endif
