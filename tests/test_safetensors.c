/* test_safetensors.c — writer -> reader round trips (every dtype, single file,
 * sharded with an index, chunked fill) and one test per kind of bad input: each
 * must fail with a message naming the file and the tensor. */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "testutil.h"

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

typedef struct pathbuf {
    char s[512];
} pathbuf;

/* dir/name, by value: use as path_in(dir, name).s within one expression. */
static pathbuf path_in(const char *dir, const char *name) {
    pathbuf p;
    if (snprintf(p.s, sizeof p.s, "%s/%s", dir, name) >= (int)sizeof p.s) p.s[0] = 0; /* too long: fail loudly */
    return p;
}

static uint8_t pattern(int index, uint64_t off) { return (uint8_t)(index * 131 + off * 7 + (off >> 9) + 3); }

typedef struct fill_log {
    uint64_t max_len;
    uint64_t next_off[32];
    int bad_order;
    int fail_at; /* index whose fill fails, -1 none */
} fill_log;

static int fill_pattern(void *ctx, int index, uint64_t offset, uint8_t *buf, uint64_t len, ds_err *err) {
    fill_log *log = ctx;
    if (index == log->fail_at) return ds_fail(err, "synthetic fill failure");
    if (len > log->max_len) log->max_len = len;
    if (index < 32) {
        if (offset != log->next_off[index]) log->bad_order = 1;
        log->next_off[index] = offset + len;
    }
    for (uint64_t i = 0; i < len; i++)
        buf[i] = pattern(index, offset + i);
    return 0;
}

static int check_data(const ds_tensor *t, int index) {
    for (uint64_t i = 0; i < t->nbytes; i++)
        if (t->data[i] != pattern(index, i)) return 0;
    return 1;
}

/* Writes a raw file: 8-byte length (hlen, or strlen(header)), header, `ndata` pattern bytes. */
static void write_raw(const char *path, const char *header, uint64_t hlen, size_t ndata) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (hlen == 0) hlen = strlen(header);
    uint8_t l8[8];
    for (int i = 0; i < 8; i++)
        l8[i] = (uint8_t)(hlen >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < ndata; i++)
        fputc(pattern(0, i), f);
    fclose(f);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Opening `path` must fail with a message containing every non-NULL needle. */
static void expect_fail(const char *path, const char *n1, const char *n2, const char *n3, int line) {
    ds_checkpoint *ck = (ds_checkpoint *)1;
    ds_err err = {{0}};
    int rc = ds_checkpoint_open(path, &ck, &err);
    CHECK(rc == -1 && ck == NULL, "line %d: open of %s should fail", line, path);
    if (rc == 0) ds_checkpoint_close(ck);
    const char *needles[] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i])
            CHECK(strstr(err.msg, needles[i]) != NULL, "line %d: '%s' not in message: %s", line, needles[i], err.msg);
}
#define EXPECT_FAIL(path, a, b, c) expect_fail(path, a, b, c, __LINE__)

static void test_dtypes(void) {
    static const size_t sizes[DS_DTYPE_COUNT] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1, 1, 1};
    for (int i = 0; i < DS_DTYPE_COUNT; i++) {
        ds_dtype d;
        CHECK(ds_dtype_size((ds_dtype)i) == sizes[i], "size of %s", ds_dtype_name((ds_dtype)i));
        CHECK(ds_dtype_parse(ds_dtype_name((ds_dtype)i), &d) == 0 && d == (ds_dtype)i, "parse %d", i);
    }
    ds_dtype d;
    CHECK(ds_dtype_parse("F8_E5M2", &d) == -1 && ds_dtype_parse("f32", &d) == -1, "unknown dtypes rejected");
    CHECK(ds_dtype_size(DS_DTYPE_COUNT) == 0, "size of an invalid dtype is 0");
}

static void test_round_trip(const char *dir) {
    /* One tensor of every dtype, plus a scalar and an empty tensor. */
    ds_tensor_spec specs[DS_DTYPE_COUNT + 2];
    char names[DS_DTYPE_COUNT + 2][64];
    int n = 0;
    for (int i = 0; i < DS_DTYPE_COUNT; i++, n++) {
        snprintf(names[n], sizeof names[n], "layers.%d.w_%s.weight", i, ds_dtype_name((ds_dtype)i));
        specs[n] = (ds_tensor_spec){.name = names[n], .dtype = (ds_dtype)i, .ndim = 2, .shape = {3 + i, 5}};
    }
    specs[n++] = (ds_tensor_spec){.name = "scalar", .dtype = DS_F32, .ndim = 0};
    specs[n++] = (ds_tensor_spec){.name = "empty", .dtype = DS_BF16, .ndim = 3, .shape = {4, 0, 2}};
    pathbuf file_buf = path_in(dir, "single.safetensors");
    const char *file = file_buf.s;
    fill_log log = {.fail_at = -1};
    ds_err err = {{0}};
    CHECK(ds_safetensors_write(file, specs, n, fill_pattern, &log, &err) == 0, "write: %s", err.msg);
    CHECK(access(path_in(dir, "single.safetensors.tmp").s, F_OK) != 0, "no .tmp left behind");

    /* The header is padded so that the data area is 8-byte aligned. */
    FILE *f = fopen(file, "rb");
    uint8_t l8[8] = {0};
    CHECK(f && fread(l8, 1, 8, f) == 8, "read header length");
    if (f) fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | l8[i];
    CHECK(hlen % 8 == 0, "header length %llu is a multiple of 8", (unsigned long long)hlen);

    ds_checkpoint *ck = NULL;
    CHECK(ds_checkpoint_open(file, &ck, &err) == 0, "open: %s", err.msg);
    if (!ck) return;
    CHECK(ds_checkpoint_count(ck) == n, "count %d", ds_checkpoint_count(ck));
    CHECK(ds_checkpoint_file_count(ck) == 1 && !strcmp(ds_checkpoint_file_path(ck, 0), file), "file list");
    CHECK(ds_checkpoint_file_path(ck, 1) == NULL && ds_checkpoint_at(ck, n) == NULL && ds_checkpoint_at(ck, -1) == NULL,
          "out-of-range accessors give NULL");
    for (int i = 0; i < n; i++) {
        const ds_tensor *t = ds_checkpoint_find(ck, specs[i].name);
        CHECK(t != NULL, "find %s", specs[i].name);
        if (!t) continue;
        CHECK(!strcmp(t->name, specs[i].name) && t->dtype == specs[i].dtype && t->ndim == specs[i].ndim && t->file == 0,
              "meta of %s", specs[i].name);
        CHECK(!memcmp(t->shape, specs[i].shape, sizeof(int64_t) * (size_t)t->ndim), "shape of %s", specs[i].name);
        uint64_t want = ds_dtype_size(specs[i].dtype);
        for (int d = 0; d < specs[i].ndim; d++)
            want *= (uint64_t)specs[i].shape[d];
        CHECK(t->nbytes == want && ds_tensor_numel(t) * ds_dtype_size(t->dtype) == want, "nbytes of %s", specs[i].name);
        CHECK(check_data(t, i), "bytes of %s", specs[i].name);
    }
    CHECK(ds_checkpoint_find(ck, "nope") == NULL && ds_checkpoint_find(ck, "__metadata__") == NULL, "absent name");
    for (int i = 1; i < ds_checkpoint_count(ck); i++)
        CHECK(strcmp(ds_checkpoint_at(ck, i - 1)->name, ds_checkpoint_at(ck, i)->name) < 0, "at() is sorted by name");
    ds_checkpoint_close(ck);

    /* A directory holding exactly one .safetensors file opens too. */
    char sub[512];
    snprintf(sub, sizeof sub, "%s/onefile", dir);
    mkdir(sub, 0700);
    pathbuf one_buf = path_in(sub, "model.safetensors");
    const char *one = one_buf.s;
    CHECK(ds_safetensors_write(one, specs, 3, fill_pattern, &(fill_log){.fail_at = -1}, &err) == 0, "%s", err.msg);
    CHECK(ds_checkpoint_open(sub, &ck, &err) == 0, "open dir with one file: %s", err.msg);
    if (ck) {
        CHECK(ds_checkpoint_count(ck) == 3 && check_data(ds_checkpoint_find(ck, specs[2].name), 2), "one-file dir");
        ds_checkpoint_close(ck);
    }
    /* Beside other files (reference data, say) model.safetensors is the checkpoint. */
    CHECK(ds_safetensors_write(path_in(sub, "other.safetensors").s, specs, 1, fill_pattern, &(fill_log){.fail_at = -1},
                               &err) == 0,
          "%s", err.msg);
    CHECK(ds_checkpoint_open(sub, &ck, &err) == 0, "open dir with model.safetensors + another: %s", err.msg);
    if (ck) {
        CHECK(ds_checkpoint_count(ck) == 3, "model.safetensors preferred");
        ds_checkpoint_close(ck);
    }
    /* Two files, neither model.safetensors, and no index: ambiguous. */
    CHECK(rename(one, path_in(sub, "first.safetensors").s) == 0, "rename");
    EXPECT_FAIL(sub, "model.safetensors.index.json", "2 *.safetensors", NULL);
}

static void test_big_chunked(const char *dir) {
    /* Over 64 MiB: fill must be called in chunks of at most 64 MiB, in order. */
    ds_tensor_spec s[2] = {{.name = "big", .dtype = DS_U8, .ndim = 1, .shape = {((int64_t)64 << 20) + 4099}},
                           {.name = "after", .dtype = DS_I16, .ndim = 1, .shape = {7}}};
    fill_log log = {.fail_at = -1};
    ds_err err = {{0}};
    pathbuf file_buf = path_in(dir, "big.safetensors");
    const char *file = file_buf.s;
    CHECK(ds_safetensors_write(file, s, 2, fill_pattern, &log, &err) == 0, "write big: %s", err.msg);
    CHECK(log.max_len <= ((uint64_t)64 << 20) && log.max_len > 0 && !log.bad_order, "chunks: max %llu",
          (unsigned long long)log.max_len);
    CHECK(log.next_off[0] == (uint64_t)s[0].shape[0] && log.next_off[1] == 14, "every byte filled once");
    ds_checkpoint *ck = NULL;
    CHECK(ds_checkpoint_open(file, &ck, &err) == 0, "open big: %s", err.msg);
    if (ck) {
        CHECK(check_data(ds_checkpoint_find(ck, "big"), 0) && check_data(ds_checkpoint_find(ck, "after"), 1),
              "big bytes");
        ds_checkpoint_close(ck);
    }
    remove(file);
}

static void test_writer_errors(const char *dir) {
    ds_tensor_spec s[2] = {{.name = "a", .dtype = DS_F32, .ndim = 1, .shape = {4}},
                           {.name = "b", .dtype = DS_F32, .ndim = 1, .shape = {4}}};
    ds_err err = {{0}};
    pathbuf file_buf = path_in(dir, "failing.safetensors");
    const char *file = file_buf.s;
    CHECK(ds_safetensors_write(file, s, 2, fill_pattern, &(fill_log){.fail_at = 1}, &err) == -1, "fill failure");
    CHECK(strstr(err.msg, "failing.safetensors") && strstr(err.msg, "'b'") && strstr(err.msg, "synthetic"), "msg: %s",
          err.msg);
    CHECK(access(file, F_OK) != 0 && access(path_in(dir, "failing.safetensors.tmp").s, F_OK) != 0,
          "a failed write leaves no file");
    s[1].name = "a";
    CHECK(ds_safetensors_write(file, s, 2, fill_pattern, &(fill_log){.fail_at = -1}, &err) == -1 &&
              strstr(err.msg, "'a'") && strstr(err.msg, "twice"),
          "duplicate names: %s", err.msg);
    s[1] = (ds_tensor_spec){.name = "neg", .dtype = DS_F32, .ndim = 1, .shape = {-2}};
    CHECK(ds_safetensors_write(file, s, 2, fill_pattern, &(fill_log){.fail_at = -1}, &err) == -1 &&
              strstr(err.msg, "'neg'"),
          "negative shape: %s", err.msg);
    CHECK(ds_safetensors_write(path_in(dir, "no/such/dir.safetensors").s, s, 1, fill_pattern,
                               &(fill_log){.fail_at = -1}, &err) == -1 &&
              strstr(err.msg, "no/such/dir.safetensors"),
          "unwritable path: %s", err.msg);
}

static void count_progress(void *ctx, uint64_t done, uint64_t total) {
    uint64_t *seen = ctx;
    if (done <= total) *seen = done;
}

static void test_sharded(const char *dir) {
    char root[512];
    snprintf(root, sizeof root, "%s/sharded", dir);
    mkdir(root, 0700);
    ds_tensor_spec s1[2] = {{.name = "embed.weight", .dtype = DS_BF16, .ndim = 2, .shape = {16, 8}},
                            {.name = "layers.0.attn.wkv.weight", .dtype = DS_F8_E4M3, .ndim = 2, .shape = {8, 8}}};
    ds_tensor_spec s2[2] = {{.name = "layers.0.attn.wkv.scale", .dtype = DS_F8_E8M0, .ndim = 2, .shape = {1, 1}},
                            {.name = "layers.0.ffn.gate.tid2eid", .dtype = DS_I64, .ndim = 2, .shape = {16, 2}}};
    ds_err err = {{0}};
    const char *f1 = "model-00001-of-00002.safetensors", *f2 = "model-00002-of-00002.safetensors";
    CHECK(ds_safetensors_write(path_in(root, f1).s, s1, 2, fill_pattern, &(fill_log){.fail_at = -1}, &err) == 0, "%s",
          err.msg);
    CHECK(ds_safetensors_write(path_in(root, f2).s, s2, 2, fill_pattern, &(fill_log){.fail_at = -1}, &err) == 0, "%s",
          err.msg);
    /* A stray shard not named by the index is ignored. */
    write_text(path_in(root, "stray.safetensors").s, "garbage");
    const char *names[4] = {s1[0].name, s1[1].name, s2[0].name, s2[1].name};
    const char *files[4] = {f1, f1, f2, f2};
    CHECK(ds_index_write(root, names, files, 4, &err) == 0, "index: %s", err.msg);
    ds_checkpoint *ck = NULL;
    CHECK(ds_checkpoint_open(root, &ck, &err) == 0, "open sharded: %s", err.msg);
    if (ck) {
        CHECK(ds_checkpoint_count(ck) == 4 && ds_checkpoint_file_count(ck) == 2, "counts");
        for (int i = 0; i < 4; i++) {
            const ds_tensor *t = ds_checkpoint_find(ck, names[i]);
            CHECK(t && strstr(ds_checkpoint_file_path(ck, t->file), files[i]) && check_data(t, i % 2), "tensor %s",
                  names[i]);
        }
        ds_checkpoint_close(ck);
    }
    /* Copy-in: the same bytes, now in anonymous memory; a reserve larger than
     * memory is an error naming the first shard, and the files stay mapped. */
    CHECK(ds_checkpoint_open(root, &ck, &err) == 0, "open sharded: %s", err.msg);
    if (ck) {
        CHECK(!ds_checkpoint_copied(ck), "not copied after open");
        const ds_tensor *t0 = ds_checkpoint_find(ck, names[0]);
        const uint8_t *before = t0 ? t0->data : NULL;
        int rc = ds_checkpoint_copy_in(ck, (uint64_t)1 << 62, NULL, &err);
        CHECK(rc == -1 && strstr(err.msg, f1) && strstr(err.msg, "--load mmap") && !ds_checkpoint_copied(ck),
              "copy-in beyond memory: %s", err.msg);
        uint64_t seen = 0;
        ds_copy_progress pr = {count_progress, &seen};
        CHECK(ds_checkpoint_copy_in(ck, 0, &pr, &err) == 0, "copy-in: %s", err.msg);
        CHECK(ds_checkpoint_copied(ck) && seen == ds_checkpoint_bytes(ck), "copied, progress %llu of %llu",
              (unsigned long long)seen, (unsigned long long)ds_checkpoint_bytes(ck));
        CHECK(t0 && t0->data != before, "tensor moved");
        for (int i = 0; i < 4; i++) {
            const ds_tensor *t = ds_checkpoint_find(ck, names[i]);
            CHECK(t && check_data(t, i % 2), "copied tensor %s", names[i]);
        }
        CHECK(ds_checkpoint_copy_in(ck, 0, NULL, &err) == 0, "a second copy-in is a no-op: %s", err.msg);
        ds_checkpoint_close(ck);
    }

    /* Index errors. */
    pathbuf idx_buf = path_in(root, "model.safetensors.index.json");
    const char *idx = idx_buf.s;
    write_text(idx, "{\"weight_map\": {\"embed.weight\": \"model-00001-of-00002.safetensors\","
                    " \"head.weight\": \"model-00003-of-00003.safetensors\"}}");
    EXPECT_FAIL(root, "model-00003-of-00003.safetensors", "missing", "head.weight");
    write_text(idx, "{\"weight_map\": {\"embed.weight\": \"model-00001-of-00002.safetensors\","
                    " \"norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    EXPECT_FAIL(root, "'norm.weight'", "model-00002-of-00002.safetensors", "model.safetensors.index.json");
    write_text(idx, "{\"weight_map\": {\"embed.weight\": \"model-00002-of-00002.safetensors\","
                    " \"layers.0.attn.wkv.weight\": \"model-00001-of-00002.safetensors\"}}");
    EXPECT_FAIL(root, "'embed.weight'", "listed in shard 'model-00002-of-00002.safetensors'", f1);
    write_text(idx, "{\"weight_map\": {\"embed.weight\": \"../model-00001-of-00002.safetensors\"}}");
    EXPECT_FAIL(root, "embed.weight", "../model-00001", NULL);
    write_text(idx, "{\"weight_map\": [1, 2]}");
    EXPECT_FAIL(root, "model.safetensors.index.json", "weight_map", NULL);
    write_text(idx, "{\"weight_map\": {\"embed.weight\": 3}}");
    EXPECT_FAIL(root, "model.safetensors.index.json", "embed.weight", NULL);
    write_text(idx, "{\"weight_map\": ");
    EXPECT_FAIL(root, "model.safetensors.index.json", "JSON", NULL);

    /* The same tensor in two shards. */
    ds_tensor_spec dup[1] = {{.name = "embed.weight", .dtype = DS_BF16, .ndim = 1, .shape = {2}}};
    CHECK(ds_safetensors_write(path_in(root, f2).s, dup, 1, fill_pattern, &(fill_log){.fail_at = -1}, &err) == 0, "%s",
          err.msg);
    write_text(idx, "{\"weight_map\": {\"embed.weight\": \"model-00001-of-00002.safetensors\","
                    " \"layers.0.attn.wkv.weight\": \"model-00002-of-00002.safetensors\"}}");
    EXPECT_FAIL(root, "'embed.weight'", f1, f2);

    /* A shard with a bad header is reported by its own name. */
    write_raw(path_in(root, f2).s, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 0, 8);
    EXPECT_FAIL(root, f2, "'w'", NULL);
}

static void test_bad_files(const char *dir) {
    pathbuf p_buf = path_in(dir, "bad.safetensors");
    const char *p = p_buf.s;
    const char *ok_hdr =
        "{\"__metadata__\": {\"format\": \"pt\"},"
        " \"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
        " \"layers.3.attn.wkv.weight\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [16, 24]}}";

    /* Control: the hand-written file is valid, with trailing header spaces. */
    char padded[1024];
    snprintf(padded, sizeof padded, "%s   \n", ok_hdr);
    write_raw(p, padded, 0, 24);
    ds_checkpoint *ck = NULL;
    ds_err err = {{0}};
    CHECK(ds_checkpoint_open(p, &ck, &err) == 0, "valid hand-written file: %s", err.msg);
    if (ck) {
        const ds_tensor *t = ds_checkpoint_find(ck, "layers.3.attn.wkv.weight");
        CHECK(t && t->nbytes == 8 && t->data[0] == pattern(0, 16), "data offset applied");
        ds_checkpoint_close(ck);
    }

    /* Truncated shard: the last tensor's bytes are cut short. */
    write_raw(p, ok_hdr, 0, 20);
    EXPECT_FAIL(p, "bad.safetensors", "'layers.3.attn.wkv.weight'", "past the end");
    /* data_offsets far past the end. */
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [100], \"data_offsets\": [0, 400]}}", 0, 16);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "past the end");
    /* Header length larger than the file. */
    write_raw(p, ok_hdr, 100000, 24);
    EXPECT_FAIL(p, "bad.safetensors", "header length 100000", NULL);
    /* Header length absurd (beyond 100 MB but the file is large enough is not needed: also past the end). */
    write_raw(p, ok_hdr, (uint64_t)1 << 62, 24);
    EXPECT_FAIL(p, "bad.safetensors", "header length", NULL);
    /* Header length too small. */
    write_raw(p, ok_hdr, 1, 24);
    EXPECT_FAIL(p, "bad.safetensors", "too small", NULL);
    /* File shorter than 8 bytes. */
    write_text(p, "abc");
    EXPECT_FAIL(p, "bad.safetensors", "too short", NULL);
    /* Invalid JSON. */
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], ", 0, 16);
    EXPECT_FAIL(p, "bad.safetensors", "not valid JSON", NULL);
    /* Garbage after the JSON inside the header. */
    write_raw(p, "{}  xx", 0, 0);
    EXPECT_FAIL(p, "bad.safetensors", "stray bytes", NULL);
    /* Not an object. */
    write_raw(p, "[1, 2]", 0, 0);
    EXPECT_FAIL(p, "bad.safetensors", "not a JSON object", NULL);
    /* Size does not match shape x dtype. */
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}", 0, 16);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "needs 16");
    /* Overlapping tensors. */
    write_raw(p,
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
              " \"y\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
              0, 24);
    EXPECT_FAIL(p, "bad.safetensors", "'x'", "'y'");
    /* Overlap hidden behind a small tensor that sorts in between. */
    write_raw(p,
              "{\"big\": {\"dtype\": \"U8\", \"shape\": [32], \"data_offsets\": [0, 32]},"
              " \"s1\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}",
              0, 32);
    EXPECT_FAIL(p, "bad.safetensors", "'big'", "'s1'");
    /* Unknown dtype. */
    write_raw(p, "{\"w\": {\"dtype\": \"F7\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "unknown dtype 'F7'");
    /* Negative and fractional shape entries; wrong JSON types. */
    write_raw(p, "{\"w\": {\"dtype\": \"U8\", \"shape\": [-1, 4], \"data_offsets\": [0, 4]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "shape[0]");
    write_raw(p, "{\"w\": {\"dtype\": \"U8\", \"shape\": [2.5], \"data_offsets\": [0, 4]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "shape[0]");
    write_raw(p, "{\"w\": {\"dtype\": \"U8\", \"shape\": \"4\", \"data_offsets\": [0, 4]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "'shape'");
    write_raw(p, "{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "9 dimensions");
    write_raw(p, "{\"w\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "data_offsets");
    write_raw(p, "{\"w\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 0]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "data_offsets");
    write_raw(p, "{\"w\": {\"shape\": [4], \"data_offsets\": [0, 4]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "'dtype'");
    write_raw(p, "{\"w\": 5}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", NULL);
    /* Shape whose byte size overflows 64 bits. */
    write_raw(p, "{\"w\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "overflows");
    /* The same name twice in one header. */
    write_raw(p,
              "{\"w\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]},"
              " \"w\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]}}",
              0, 4);
    EXPECT_FAIL(p, "bad.safetensors", "'w'", "twice");
    /* Missing path; empty directory. */
    EXPECT_FAIL(path_in(dir, "nothing-here.safetensors").s, "nothing-here.safetensors", NULL, NULL);
    char empty[512];
    snprintf(empty, sizeof empty, "%s/emptydir", dir);
    mkdir(empty, 0700);
    EXPECT_FAIL(empty, "emptydir", "no model.safetensors.index.json", NULL);
}

/* Random byte flips and truncations of a valid file: every open either succeeds
 * with every tensor inside the file, or fails cleanly (ASan watches for the rest). */
static void test_mutations(const char *dir) {
    ds_tensor_spec specs[3] = {{.name = "a.weight", .dtype = DS_BF16, .ndim = 2, .shape = {3, 4}},
                               {.name = "b", .dtype = DS_F8_E4M3, .ndim = 1, .shape = {5}},
                               {.name = "c.scale", .dtype = DS_F32, .ndim = 0}};
    pathbuf good_buf = path_in(dir, "good.safetensors"), mut_buf = path_in(dir, "mut.safetensors");
    ds_err err = {{0}};
    CHECK(ds_safetensors_write(good_buf.s, specs, 3, fill_pattern, &(fill_log){.fail_at = -1}, &err) == 0, "%s",
          err.msg);
    uint8_t orig[1024];
    FILE *f = fopen(good_buf.s, "rb");
    size_t n = f ? fread(orig, 1, sizeof orig, f) : 0;
    if (f) fclose(f);
    CHECK(n > 8 && n < sizeof orig, "read the good file (%zu bytes)", n);
    uint32_t rng = 12345;
    int opened = 0, failed = 0;
    for (int it = 0; it < 600; it++) {
        uint8_t buf[1024];
        memcpy(buf, orig, n);
        size_t len = n;
        int flips = 1 + it % 3;
        for (int k = 0; k < flips; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t at = (rng >> 8) % len;
            rng = rng * 1664525u + 1013904223u;
            static const char json_bytes[] = "{}[],:\"0 -e9";
            buf[at] = (it % 4 == 0) ? (uint8_t)json_bytes[(rng >> 8) % (sizeof json_bytes - 1)] : (uint8_t)(rng >> 16);
        }
        if (it % 5 == 0) len = 1 + (rng >> 4) % len;
        f = fopen(mut_buf.s, "wb");
        if (!f) break;
        fwrite(buf, 1, len, f);
        fclose(f);
        ds_checkpoint *ck = NULL;
        if (ds_checkpoint_open(mut_buf.s, &ck, &err) == 0) {
            opened++;
            unsigned sum = 0;
            for (int i = 0; i < ds_checkpoint_count(ck); i++) {
                const ds_tensor *t = ds_checkpoint_at(ck, i);
                for (uint64_t b = 0; b < t->nbytes; b++)
                    sum += t->data[b];
            }
            (void)sum;
            ds_checkpoint_close(ck);
        } else {
            failed++;
            CHECK(strstr(err.msg, "mut.safetensors") != NULL, "message names the file: %s", err.msg);
        }
    }
    CHECK(opened + failed == 600 && failed > 0, "mutations: %d opened, %d rejected", opened, failed);
}

/* safetensors does not align a tensor's bytes: one at an odd offset is read
 * from an aligned copy, with the file's bytes */
static void test_misaligned(const char *dir) {
    pathbuf p = path_in(dir, "odd.safetensors");
    write_raw(p.s,
              "{\"a\": {\"dtype\": \"I8\", \"shape\": [3], \"data_offsets\": [0, 3]}, "
              "\"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [3, 11]}, "
              "\"c\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [11, 19]}}    ",
              0, 19);
    ds_checkpoint *ck;
    ds_err err;
    int rc = ds_checkpoint_open(p.s, &ck, &err);
    CHECK(rc == 0, "odd offsets: %s", err.msg);
    if (rc) return;
    const char *names[3] = {"a", "b", "c"};
    const uint64_t off[3] = {0, 3, 11};
    for (int k = 0; k < 3; k++) {
        const ds_tensor *t = ds_checkpoint_find(ck, names[k]);
        CHECK(t != NULL, "tensor %s", names[k]);
        if (!t) continue;
        CHECK((uintptr_t)t->data % ds_dtype_size(t->dtype) == 0, "tensor %s at a misaligned address", names[k]);
        int same = 1;
        for (uint64_t i = 0; i < t->nbytes; i++) same &= t->data[i] == pattern(0, off[k] + i);
        CHECK(same, "tensor %s: bytes differ from the file's", names[k]);
    }
    ds_checkpoint_close(ck);
}

int main(void) {
    char dir[] = "/tmp/dsv4-test-safetensors-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_dtypes();
    test_round_trip(dir);
    test_big_chunked(dir);
    test_writer_errors(dir);
    test_sharded(dir);
    test_bad_files(dir);
    test_mutations(dir);
    test_misaligned(dir);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_summary("test_safetensors");
}
