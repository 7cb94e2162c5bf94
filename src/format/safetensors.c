/* safetensors.c — safetensors reader (mmap, zero-copy, fully validated
 * headers), sharded checkpoints (model.safetensors.index.json) and a streaming
 * writer (header first, then tensor bytes in chunks, via path.tmp + rename).
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data area; offsets are relative to it. */
#include "format/safetensors.h"


#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/io.h"

#define HEADER_MAX ((uint64_t)100 << 20) /* 100 MB: the limit the safetensors spec uses */
#define INDEX_FILE_MAX ((size_t)256 << 20)
#define CHUNK_MAX ((uint64_t)64 << 20)  /* writer: at most this many bytes per fill call */
#define JSON_INT_MAX 9007199254740992.0 /* 2^53: integers above are not exact in JSON doubles */
#define INDEX_NAME "model.safetensors.index.json"

/* ---- dtypes ------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_table[DS_DTYPE_COUNT] = {
    [DS_F32] = {"F32", 4}, [DS_F16] = {"F16", 2},   [DS_BF16] = {"BF16", 2},       [DS_F64] = {"F64", 8},
    [DS_I64] = {"I64", 8}, [DS_I32] = {"I32", 4},   [DS_I16] = {"I16", 2},         [DS_I8] = {"I8", 1},
    [DS_U8] = {"U8", 1},   [DS_BOOL] = {"BOOL", 1}, [DS_F8_E4M3] = {"F8_E4M3", 1}, [DS_F8_E8M0] = {"F8_E8M0", 1},
};

size_t ds_dtype_size(ds_dtype dt) { return (unsigned)dt < DS_DTYPE_COUNT ? dtype_table[dt].size : 0; }

const char *ds_dtype_name(ds_dtype dt) { return (unsigned)dt < DS_DTYPE_COUNT ? dtype_table[dt].name : "?"; }

int ds_dtype_parse(const char *name, ds_dtype *out) {
    if (!name) return -1;
    for (int i = 0; i < DS_DTYPE_COUNT; i++)
        if (!strcmp(name, dtype_table[i].name)) {
            *out = (ds_dtype)i;
            return 0;
        }
    return -1;
}

uint64_t ds_tensor_numel(const ds_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

/* numel x dtype size with overflow checks; -1 on overflow or bad shape. */
static int byte_size(ds_dtype dt, int ndim, const int64_t *shape, uint64_t *out) {
    uint64_t n = ds_dtype_size(dt);
    if (n == 0 || ndim < 0 || ndim > DS_MAX_DIMS) return -1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return -1;
    }
    *out = n;
    return 0;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* ---- small helpers ------------------------------------------------------ */

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t at = a;
    if (a > 0 && dir[a - 1] != '/') p[at++] = '/';
    memcpy(p + at, name, b + 1);
    return p;
}

static int is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* JSON number that is a non-negative integer exactly representable. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > JSON_INT_MAX || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Writes `len` bytes to path via path.tmp + rename. */
static int write_atomic(const char *path, const char *data, size_t len, ds_err *err) {
    char *tmp = malloc(strlen(path) + 5);
    if (!tmp) return ds_fail(err, "%s: out of memory", path);
    sprintf(tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        ds_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = fwrite(data, 1, len, f) == len && fflush(f) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    if (!ok) {
        unlink(tmp);
        ds_fail(err, "%s: write failed: %s", path, strerror(e));
    }
    free(tmp);
    return ok ? 0 : -1;
}

/* ---- checkpoint --------------------------------------------------------- */

typedef struct ck_file {
    char *path;
    uint8_t *map;
    size_t size;
    size_t maplen; /* 0: map is the file's mapping (size bytes); else anonymous memory of maplen bytes (copy-in) */
    char *names; /* arena holding the names of this file's tensors */
} ck_file;

struct ds_checkpoint {
    ck_file *files;
    int nfiles, cap_files;
    ds_tensor *tensors; /* sorted by name once open */
    int ntensors, cap_tensors;
    void **own; /* [ntensors]: an aligned copy of a tensor whose bytes in the file are not aligned to its
                   element (safetensors does not align them), else NULL */
};

typedef struct range {
    uint64_t begin, end;
    int tensor;
} range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_tensor(const void *a, const void *b) {
    const ds_tensor *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

static int cmp_tensor_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const ds_tensor *)elem)->name);
}

static int push_file(ds_checkpoint *ck, const char *path, ds_err *err) {
    if (ck->nfiles == ck->cap_files) {
        int cap = ck->cap_files ? ck->cap_files * 2 : 4;
        ck_file *nf = realloc(ck->files, (size_t)cap * sizeof *nf);
        if (!nf) return ds_fail(err, "%s: out of memory", path);
        ck->files = nf;
        ck->cap_files = cap;
    }
    ck_file *f = &ck->files[ck->nfiles];
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path))) return ds_fail(err, "%s: out of memory", path);
    ck->nfiles++;
    return 0;
}

static int map_file(ck_file *f, ds_err *err) {
    int fd = open(f->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block: fstat rejects it below */
    if (fd < 0) return ds_fail(err, "%s: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ds_fail(err, "%s: %s", f->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ds_fail(err, "%s: not a regular file", f->path);
    }
    if (st.st_size < 8) {
        close(fd);
        return ds_fail(err, "%s: file is %lld bytes, too short for a safetensors header", f->path,
                       (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return ds_fail(err, "%s: mmap: %s", f->path, strerror(e));
    f->map = m;
    f->size = (size_t)st.st_size;
    return 0;
}

/* Validates one header entry and appends the tensor. */
static int parse_entry(ds_checkpoint *ck, int fi, const cJSON *e, char *name, const uint8_t *data, uint64_t data_size,
                       range *rg, ds_err *err) {
    const ck_file *f = &ck->files[fi];
    const char *p = f->path;
    if (!cJSON_IsObject(e)) return ds_fail(err, "%s: tensor '%s': entry is not a JSON object", p, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    ds_tensor t = {.name = name, .file = fi};
    if (!cJSON_IsString(dt)) return ds_fail(err, "%s: tensor '%s': 'dtype' is missing or not a string", p, name);
    if (ds_dtype_parse(dt->valuestring, &t.dtype) != 0)
        return ds_fail(err, "%s: tensor '%s': unknown dtype '%s'", p, name, dt->valuestring);
    if (!cJSON_IsArray(sh)) return ds_fail(err, "%s: tensor '%s': 'shape' is missing or not an array", p, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > DS_MAX_DIMS)
        return ds_fail(err, "%s: tensor '%s': 'shape' has %d dimensions (at most %d)", p, name, nd, DS_MAX_DIMS);
    t.ndim = nd;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (json_uint(d, &v) != 0) {
            if (cJSON_IsNumber(d))
                return ds_fail(err, "%s: tensor '%s': shape[%d] = %g is not a non-negative integer", p, name, i,
                               d->valuedouble);
            return ds_fail(err, "%s: tensor '%s': shape[%d] is not a number", p, name, i);
        }
        t.shape[i] = (int64_t)v;
    }
    char sbuf[256];
    shape_str(sbuf, sizeof sbuf, t.ndim, t.shape);
    uint64_t b, en, need;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || json_uint(off->child, &b) != 0 ||
        json_uint(off->child->next, &en) != 0)
        return ds_fail(err, "%s: tensor '%s': 'data_offsets' must be [begin, end] (non-negative integers)", p, name);
    if (b > en)
        return ds_fail(err, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", p, name,
                       b, en);
    if (en > data_size)
        return ds_fail(err,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] run past the end of the file (size %zu, data area %" PRIu64 " bytes)",
                       p, name, b, en, f->size, data_size);
    if (byte_size(t.dtype, t.ndim, t.shape, &need) != 0)
        return ds_fail(err, "%s: tensor '%s': shape %s x %s overflows 64 bits", p, name, sbuf, dt->valuestring);
    if (en - b != need)
        return ds_fail(err,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                       " bytes but shape %s x %s needs %" PRIu64,
                       p, name, b, en, en - b, sbuf, dt->valuestring, need);
    t.nbytes = need;
    t.data = data + b;
    if (ck->ntensors == ck->cap_tensors) {
        if (ck->cap_tensors > (1 << 29)) return ds_fail(err, "%s: too many tensors", p);
        int cap = ck->cap_tensors ? ck->cap_tensors * 2 : 256;
        ds_tensor *nt = realloc(ck->tensors, (size_t)cap * sizeof *nt);
        if (!nt) return ds_fail(err, "%s: out of memory", p);
        ck->tensors = nt;
        ck->cap_tensors = cap;
    }
    *rg = (range){b, en, ck->ntensors};
    ck->tensors[ck->ntensors++] = t;
    return 0;
}

/* Checks that no two non-empty byte ranges of one file overlap. */
static int check_overlap(const ds_checkpoint *ck, const char *path, range *rg, int n, ds_err *err) {
    qsort(rg, (size_t)n, sizeof *rg, cmp_range);
    int last = -1; /* the earlier non-empty range reaching furthest */
    for (int i = 0; i < n; i++) {
        if (rg[i].begin == rg[i].end) continue;
        if (last >= 0 && rg[i].begin < rg[last].end)
            return ds_fail(err,
                           "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64 ", %" PRIu64 "] overlap",
                           path, ck->tensors[rg[last].tensor].name, rg[last].begin, rg[last].end,
                           ck->tensors[rg[i].tensor].name, rg[i].begin, rg[i].end);
        if (last < 0 || rg[i].end > rg[last].end) last = i;
    }
    return 0;
}

/* Maps one .safetensors file, validates its header and appends its tensors. */
static int add_file(ds_checkpoint *ck, const char *path, ds_err *err) {
    if (push_file(ck, path, err) != 0) return -1;
    int fi = ck->nfiles - 1;
    ck_file *f = &ck->files[fi];
    if (map_file(f, err) != 0) return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | f->map[i];
    if (n > (uint64_t)f->size - 8)
        return ds_fail(err, "%s: header length %" PRIu64 " runs past the end of the file (size %zu)", path, n, f->size);
    if (n > HEADER_MAX) return ds_fail(err, "%s: header length %" PRIu64 " exceeds the 100 MB limit", path, n);
    if (n < 2) return ds_fail(err, "%s: header length %" PRIu64 " is too small", path, n);

    /* cJSON needs a NUL-terminated copy; this also keeps its reads inside our buffer. */
    char *hdr = malloc((size_t)n + 1);
    if (!hdr) return ds_fail(err, "%s: out of memory for a %" PRIu64 "-byte header", path, n);
    memcpy(hdr, f->map + 8, (size_t)n);
    hdr[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(hdr, &end, 0);
    int rc = -1;
    range *rg = NULL;
    if (!root) {
        ds_fail(err, "%s: header is not valid JSON (error near byte %td)", path, end ? end - hdr : (ptrdiff_t)0);
        goto out;
    }
    for (const char *q = end; q < hdr + n; q++)
        if (!is_json_space(*q)) {
            ds_fail(err, "%s: header has stray bytes after the JSON object at byte %td", path, q - hdr);
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        ds_fail(err, "%s: header is not a JSON object", path);
        goto out;
    }
    size_t name_bytes = 0;
    int count = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!e->string) {
            ds_fail(err, "%s: header entry without a name", path);
            goto out;
        }
        if (!strcmp(e->string, "__metadata__")) continue;
        name_bytes += strlen(e->string) + 1;
        count++;
    }
    if (!(f->names = malloc(name_bytes ? name_bytes : 1)) || !(rg = malloc((size_t)(count ? count : 1) * sizeof *rg))) {
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    uint64_t data_size = (uint64_t)f->size - 8 - n;
    char *nm = f->names;
    int k = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        size_t l = strlen(e->string) + 1;
        memcpy(nm, e->string, l);
        if (parse_entry(ck, fi, e, nm, f->map + 8 + n, data_size, &rg[k], err) != 0) goto out;
        nm += l;
        k++;
    }
    rc = check_overlap(ck, path, rg, count, err);
out:
    free(rg);
    cJSON_Delete(root);
    free(hdr);
    return rc;
}

/* Sorts the tensors by name and rejects duplicates. */
static int finish(ds_checkpoint *ck, ds_err *err) {
    if (ck->ntensors > 0) qsort(ck->tensors, (size_t)ck->ntensors, sizeof *ck->tensors, cmp_tensor);
    for (int i = 1; i < ck->ntensors; i++) {
        const ds_tensor *a = &ck->tensors[i - 1], *b = &ck->tensors[i];
        if (strcmp(a->name, b->name) != 0) continue;
        if (a->file == b->file)
            return ds_fail(err, "%s: tensor '%s' appears twice in the header", ck->files[a->file].path, a->name);
        return ds_fail(err, "tensor '%s' appears in two shards: %s and %s", a->name, ck->files[a->file].path,
                       ck->files[b->file].path);
    }
    /* every tensor's data aligned to its element: the rare one that is not
     * is read from an aligned copy */
    for (int i = 0; i < ck->ntensors; i++) {
        ds_tensor *t = &ck->tensors[i];
        size_t a = ds_dtype_size(t->dtype);
        if (a <= 1 || (uintptr_t)t->data % a == 0) continue;
        if (!ck->own && !(ck->own = calloc((size_t)ck->ntensors, sizeof *ck->own)))
            return ds_fail(err, "%s: out of memory", ck->files[t->file].path);
        void *c = aligned_alloc(64, (t->nbytes + 63) / 64 * 64);
        if (!c) return ds_fail(err, "%s: tensor '%s': out of memory for an aligned copy", ck->files[t->file].path, t->name);
        memcpy(c, t->data, t->nbytes);
        ck->own[i] = c;
        t->data = c;
    }
    return 0;
}

typedef struct wm_entry {
    const char *tensor, *file;
} wm_entry;

static int cmp_wm_file(const void *a, const void *b) {
    return strcmp(((const wm_entry *)a)->file, ((const wm_entry *)b)->file);
}

static int cmp_str_key(const void *key, const void *elem) {
    return strcmp((const char *)key, *(const char *const *)elem);
}

/* A shard name must stay inside the checkpoint directory. */
static int safe_rel_name(const char *s) {
    if (!*s || *s == '/') return 0;
    for (const char *c = s; *c;) {
        const char *slash = strchr(c, '/');
        size_t l = slash ? (size_t)(slash - c) : strlen(c);
        if (l == 0 || (l == 2 && c[0] == '.' && c[1] == '.')) return 0;
        if (!slash) break;
        c = slash + 1;
    }
    return 1;
}

static int open_index(ds_checkpoint *ck, const char *dir, const char *ipath, ds_err *err) {
    char *text = NULL;
    if (ds_read_regular_file(ipath, INDEX_FILE_MAX, &text, NULL, err) != 0) return -1;
    int rc = -1;
    wm_entry *wm = NULL, *byfile = NULL;
    const char **shards = NULL;
    char *spath = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        ds_fail(err, "%s: not valid JSON (error near byte %td)", ipath, end ? end - text : (ptrdiff_t)0);
        goto out;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        ds_fail(err, "%s: 'weight_map' is missing or not an object", ipath);
        goto out;
    }
    int n = cJSON_GetArraySize(map);
    size_t cap = (size_t)(n ? n : 1);
    wm = malloc(cap * sizeof *wm);
    byfile = malloc(cap * sizeof *byfile);
    shards = malloc(cap * sizeof *shards);
    if (!wm || !byfile || !shards) {
        ds_fail(err, "%s: out of memory", ipath);
        goto out;
    }
    int i = 0;
    for (const cJSON *e = map->child; e; e = e->next, i++) {
        const char *name = e->string ? e->string : "";
        if (!cJSON_IsString(e)) {
            ds_fail(err, "%s: weight_map['%s'] is not a string", ipath, name);
            goto out;
        }
        if (!safe_rel_name(e->valuestring)) {
            ds_fail(err, "%s: weight_map['%s'] = '%s' is not a file name inside the checkpoint directory", ipath, name,
                    e->valuestring);
            goto out;
        }
        wm[i] = byfile[i] = (wm_entry){name, e->valuestring};
    }
    /* Open each distinct shard once, in name order (file index = rank in `shards`). */
    qsort(byfile, (size_t)n, sizeof *byfile, cmp_wm_file);
    int ns = 0;
    for (i = 0; i < n; i++) {
        if (ns > 0 && !strcmp(shards[ns - 1], byfile[i].file)) continue;
        shards[ns++] = byfile[i].file;
        free(spath);
        if (!(spath = join_path(dir, byfile[i].file))) {
            ds_fail(err, "%s: out of memory", ipath);
            goto out;
        }
        struct stat st;
        if (stat(spath, &st) != 0) {
            ds_fail(err, "%s: shard '%s' (holding tensor '%s') is missing: %s: %s", ipath, byfile[i].file,
                    byfile[i].tensor, spath, strerror(errno));
            goto out;
        }
        if (add_file(ck, spath, err) != 0) goto out;
    }
    if (finish(ck, err) != 0) goto out;
    /* Every tensor the index lists is in the shard it names. */
    for (i = 0; i < n; i++) {
        const ds_tensor *t = ds_checkpoint_find(ck, wm[i].tensor);
        const char **s = bsearch(wm[i].file, shards, (size_t)ns, sizeof *shards, cmp_str_key);
        if (!t) {
            ds_fail(err, "%s: tensor '%s' is not in shard '%s'", ipath, wm[i].tensor, wm[i].file);
            goto out;
        }
        if (!s || t->file != (int)(s - shards)) {
            ds_fail(err, "%s: tensor '%s' is listed in shard '%s' but is in %s", ipath, wm[i].tensor, wm[i].file,
                    ck->files[t->file].path);
            goto out;
        }
    }
    rc = 0;
out:
    free(spath);
    free(shards);
    free(byfile);
    free(wm);
    cJSON_Delete(root);
    free(text);
    return rc;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a > b && !strcmp(s + a - b, suf);
}

/* A directory without an index: exactly one *.safetensors file. */
static int open_single_in_dir(ds_checkpoint *ck, const char *dir, ds_err *err) {
    DIR *d = opendir(dir);
    if (!d) return ds_fail(err, "%s: %s", dir, strerror(errno));
    char *found = NULL, *second = NULL;
    int count = 0, rc = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!has_suffix(de->d_name, ".safetensors")) continue;
        char *p = join_path(dir, de->d_name);
        struct stat st;
        if (!p) {
            ds_fail(err, "%s: out of memory", dir);
            goto out;
        }
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(p);
            continue;
        }
        if (count == 0)
            found = p;
        else if (count == 1)
            second = p;
        else
            free(p);
        count++;
    }
    if (count == 0)
        ds_fail(err, "%s: no " INDEX_NAME " and no *.safetensors file", dir);
    else if (count > 1)
        ds_fail(err, "%s: %d *.safetensors files (%s, %s, ...) but no " INDEX_NAME, dir, count, found, second);
    else if (add_file(ck, found, err) == 0)
        rc = finish(ck, err);
out:
    closedir(d);
    free(found);
    free(second);
    return rc;
}

int ds_checkpoint_open(const char *path, ds_checkpoint **out, ds_err *err) {
    *out = NULL;
    struct stat st;
    if (!path || stat(path, &st) != 0) return ds_fail(err, "%s: %s", path ? path : "(null)", strerror(errno));
    ds_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return ds_fail(err, "%s: out of memory", path);
    int rc;
    if (S_ISDIR(st.st_mode)) {
        char *ipath = join_path(path, INDEX_NAME);
        struct stat ist;
        if (!ipath)
            rc = ds_fail(err, "%s: out of memory", path);
        else if (stat(ipath, &ist) == 0)
            rc = open_index(ck, path, ipath, err);
        else {
            /* the single-file convention: model.safetensors, else the only *.safetensors */
            char *mpath = join_path(path, "model.safetensors");
            if (!mpath)
                rc = ds_fail(err, "%s: out of memory", path);
            else if (stat(mpath, &ist) == 0 && S_ISREG(ist.st_mode) && (rc = add_file(ck, mpath, err)) == 0)
                rc = finish(ck, err);
            else if (stat(mpath, &ist) != 0)
                rc = open_single_in_dir(ck, path, err);
            free(mpath);
        }
        free(ipath);
    } else {
        rc = add_file(ck, path, err);
        if (rc == 0) rc = finish(ck, err);
    }
    if (rc != 0) {
        ds_checkpoint_close(ck);
        return -1;
    }
    *out = ck;
    return 0;
}

void ds_checkpoint_close(ds_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->nfiles; i++) {
        if (ck->files[i].map) munmap(ck->files[i].map, ck->files[i].maplen ? ck->files[i].maplen : ck->files[i].size);
        free(ck->files[i].names);
        free(ck->files[i].path);
    }
    for (int i = 0; ck->own && i < ck->ntensors; i++) free(ck->own[i]);
    free(ck->own);
    free(ck->files);
    free(ck->tensors);
    free(ck);
}

const ds_tensor *ds_checkpoint_find(const ds_checkpoint *ck, const char *name) {
    if (!ck || !name || ck->ntensors == 0) return NULL;
    return bsearch(name, ck->tensors, (size_t)ck->ntensors, sizeof *ck->tensors, cmp_tensor_key);
}

int ds_checkpoint_count(const ds_checkpoint *ck) { return ck ? ck->ntensors : 0; }

const ds_tensor *ds_checkpoint_at(const ds_checkpoint *ck, int i) {
    return ck && i >= 0 && i < ck->ntensors ? &ck->tensors[i] : NULL;
}

const char *ds_checkpoint_file_path(const ds_checkpoint *ck, int file) {
    return ck && file >= 0 && file < ck->nfiles ? ck->files[file].path : NULL;
}

int ds_checkpoint_file_count(const ds_checkpoint *ck) { return ck ? ck->nfiles : 0; }

/* ---- copy-in: the files' bytes in anonymous huge-page memory ------------ */

#define COPY_ALIGN ((size_t)2 << 20) /* the huge-page size of x86-64 */
#define COPY_CHUNK ((size_t)64 << 20)

uint64_t ds_checkpoint_bytes(const ds_checkpoint *ck) {
    uint64_t n = 0;
    for (int i = 0; ck && i < ck->nfiles; i++) n += ck->files[i].size;
    return n;
}

uint64_t ds_mem_available(void) { return ds_proc_kb_bytes("/proc/meminfo", "MemAvailable"); }

uint64_t ds_mem_total(void) { return ds_proc_kb_bytes("/proc/meminfo", "MemTotal"); }

/* File i's bytes into a fresh 2 MiB-aligned anonymous block; its tensors
 * point there afterwards and the file's mapping is gone. */
static int copy_file(ds_checkpoint *ck, int fi, uint64_t *done, uint64_t total, const ds_copy_progress *pr,
                     ds_err *err) {
    ck_file *f = &ck->files[fi];
    if (f->maplen) return 0; /* copied before */
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ds_fail(err, "%s: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != (uint64_t)f->size) {
        close(fd);
        return ds_fail(err, "%s: the file changed size since it was opened", f->path);
    }
    size_t len = (f->size + COPY_ALIGN - 1) / COPY_ALIGN * COPY_ALIGN;
    uint8_t *raw = mmap(NULL, len + COPY_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        int e = errno;
        close(fd);
        return ds_fail(err, "%s: no memory for a copy of %zu bytes: %s", f->path, f->size, strerror(e));
    }
    uint8_t *mem = (uint8_t *)(((uintptr_t)raw + COPY_ALIGN - 1) / COPY_ALIGN * COPY_ALIGN);
    if (mem > raw) munmap(raw, (size_t)(mem - raw));
    if (mem < raw + COPY_ALIGN) munmap(mem + len, (size_t)(raw + COPY_ALIGN - mem));
    madvise(mem, len, MADV_HUGEPAGE); /* advisory: without THP the copy still works, on 4 KiB pages */
    for (size_t off = 0; off < f->size;) {
        size_t n = f->size - off < COPY_CHUNK ? f->size - off : COPY_CHUNK;
        ssize_t r = pread(fd, mem + off, n, (off_t)off);
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            if (r < 0 && e == EINTR) continue;
            munmap(mem, len);
            close(fd);
            return ds_fail(err, "%s: read at byte %zu: %s", f->path, off, r < 0 ? strerror(e) : "unexpected end of file");
        }
        /* drop the file's cached pages behind the read: page cache and copy
         * never both hold the model */
        posix_fadvise(fd, (off_t)off, (off_t)r, POSIX_FADV_DONTNEED);
        off += (size_t)r;
        *done += (uint64_t)r;
        if (pr && pr->fn) pr->fn(pr->ctx, *done, total);
    }
    close(fd);
    mprotect(mem, len, PROT_READ); /* read-only, as the mapping was */
    for (int t = 0; t < ck->ntensors; t++)
        if (ck->tensors[t].file == fi && !(ck->own && ck->own[t]))
            ck->tensors[t].data = mem + (ck->tensors[t].data - f->map);
    munmap(f->map, f->size);
    f->map = mem;
    f->maplen = len;
    return 0;
}

int ds_checkpoint_copy_in(ds_checkpoint *ck, uint64_t reserve, const ds_copy_progress *pr, ds_err *err) {
    uint64_t total = ds_checkpoint_bytes(ck), avail = ds_mem_available(), need = 0, done = 0;
    for (int i = 0; i < ck->nfiles; i++) {
        if (ck->files[i].maplen) continue;
        need += ck->files[i].size;
        if (avail && need + reserve > avail)
            return ds_fail(err,
                           "%s: not enough memory to copy the checkpoint in: it needs %.2f GB up to this file "
                           "(%.2f GB in all, + %.2f GB kept free) but %.2f GB is available (MemAvailable); "
                           "--load mmap reads the weights in place",
                           ck->files[i].path, need / 1e9, total / 1e9, reserve / 1e9, avail / 1e9);
    }
    for (int i = 0; i < ck->nfiles; i++)
        if (copy_file(ck, i, &done, total, pr, err)) return -1;
    return 0;
}

int ds_checkpoint_mlock(const ds_checkpoint *ck) {
    for (int i = 0; ck && i < ck->nfiles; i++) {
        const ck_file *f = &ck->files[i];
        if (f->map && mlock(f->map, f->maplen ? f->maplen : f->size)) return errno;
    }
    return 0;
}

int ds_checkpoint_copied(const ds_checkpoint *ck) {
    for (int i = 0; ck && i < ck->nfiles; i++)
        if (!ck->files[i].maplen) return 0;
    return ck && ck->nfiles > 0;
}

/* ---- writer ------------------------------------------------------------- */

static int cmp_spec_name(const void *a, const void *b) {
    return strcmp((*(const ds_tensor_spec *const *)a)->name, (*(const ds_tensor_spec *const *)b)->name);
}

/* Validates the specs and builds the padded header text (without the length prefix). */
static int build_header(const char *path, const ds_tensor_spec *specs, int n, char **out, size_t *out_len,
                        uint64_t *max_bytes, ds_err *err) {
    const ds_tensor_spec **sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    char *text = NULL;
    int rc = -1;
    if (!sorted || !root || !meta) {
        cJSON_Delete(meta);
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    cJSON_AddItemToObject(root, "__metadata__", meta);
    if (!cJSON_AddStringToObject(meta, "format", "pt")) {
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    uint64_t at = 0;
    *max_bytes = 0;
    for (int i = 0; i < n; i++) {
        const ds_tensor_spec *s = &specs[i];
        uint64_t nb;
        if (!s->name || !*s->name || !strcmp(s->name, "__metadata__")) {
            ds_fail(err, "%s: tensor %d has an empty or reserved name", path, i);
            goto out;
        }
        if ((unsigned)s->dtype >= DS_DTYPE_COUNT || s->ndim < 0 || s->ndim > DS_MAX_DIMS ||
            byte_size(s->dtype, s->ndim, s->shape, &nb) != 0 || __builtin_add_overflow(at, nb, &at)) {
            ds_fail(err, "%s: tensor '%s': invalid dtype, dimension count or shape", path, s->name);
            goto out;
        }
        if (nb > *max_bytes) *max_bytes = nb;
        char shp[DS_MAX_DIMS * 22 + 4], offs[48];
        size_t k = (size_t)snprintf(shp, sizeof shp, "[");
        for (int d = 0; d < s->ndim; d++)
            k += (size_t)snprintf(shp + k, sizeof shp - k, "%s%" PRId64, d ? "," : "", s->shape[d]);
        snprintf(shp + k, sizeof shp - k, "]");
        snprintf(offs, sizeof offs, "[%" PRIu64 ",%" PRIu64 "]", at - nb, at);
        cJSON *e = cJSON_CreateObject();
        if (!e) {
            ds_fail(err, "%s: out of memory", path);
            goto out;
        }
        cJSON_AddItemToObject(root, s->name, e);
        if (!cJSON_AddStringToObject(e, "dtype", ds_dtype_name(s->dtype)) || !cJSON_AddRawToObject(e, "shape", shp) ||
            !cJSON_AddRawToObject(e, "data_offsets", offs)) {
            ds_fail(err, "%s: out of memory", path);
            goto out;
        }
        sorted[i] = s;
    }
    if (n > 0) qsort(sorted, (size_t)n, sizeof *sorted, cmp_spec_name);
    for (int i = 1; i < n; i++)
        if (!strcmp(sorted[i - 1]->name, sorted[i]->name)) {
            ds_fail(err, "%s: tensor '%s' is given twice", path, sorted[i]->name);
            goto out;
        }
    char *json = cJSON_PrintUnformatted(root);
    if (!json) {
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    size_t len = strlen(json), padded = (len + 7) & ~(size_t)7;
    if (padded > HEADER_MAX) {
        free(json);
        ds_fail(err, "%s: header would be %zu bytes (over the 100 MB limit)", path, padded);
        goto out;
    }
    if (!(text = malloc(padded + 1))) {
        free(json);
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    memcpy(text, json, len);
    memset(text + len, ' ', padded - len);
    text[padded] = 0;
    free(json);
    *out = text;
    *out_len = padded;
    rc = 0;
out:
    cJSON_Delete(root);
    free(sorted);
    return rc;
}

int ds_safetensors_write(const char *path, const ds_tensor_spec *specs, int n, ds_fill_fn fill, void *ctx,
                         ds_err *err) {
    if (n < 0 || (n > 0 && (!specs || !fill))) return ds_fail(err, "%s: invalid tensor list", path);
    char *hdr = NULL, *tmp = NULL;
    uint8_t *buf = NULL;
    size_t hlen = 0;
    uint64_t max_bytes = 0;
    FILE *f = NULL;
    int rc = -1;
    if (build_header(path, specs, n, &hdr, &hlen, &max_bytes, err) != 0) return -1;
    size_t cap = (size_t)(max_bytes < CHUNK_MAX ? max_bytes : CHUNK_MAX);
    if (!(tmp = malloc(strlen(path) + 5)) || (cap && !(buf = malloc(cap)))) {
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    sprintf(tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "wb"))) {
        ds_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    uint64_t end = 8 + (uint64_t)hlen; /* the file's size (holes included) */
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(hdr, 1, hlen, f) != hlen) {
        ds_fail(err, "%s: write failed: %s", tmp, strerror(errno));
        goto out;
    }
    for (int i = 0; i < n; i++) {
        uint64_t nb = 0;
        byte_size(specs[i].dtype, specs[i].ndim, specs[i].shape, &nb);
        end += nb;
        for (uint64_t off = 0; off < nb;) {
            uint64_t len = nb - off < cap ? nb - off : cap;
            int frc = fill(ctx, i, off, buf, len, err);
            if (frc == 1 && off == 0) { /* a hole */
                if (fseeko(f, (off_t)nb, SEEK_CUR) != 0) {
                    ds_fail(err, "%s: seek failed in tensor '%s': %s", tmp, specs[i].name, strerror(errno));
                    goto out;
                }
                break;
            }
            if (frc != 0) {
                ds_fail_prefix(err, "%s: tensor '%s'", path, specs[i].name);
                goto out;
            }
            if (fwrite(buf, 1, (size_t)len, f) != (size_t)len) {
                ds_fail(err, "%s: write failed in tensor '%s': %s", tmp, specs[i].name, strerror(errno));
                goto out;
            }
            off += len;
        }
    }
    if (fflush(f) != 0 || ftruncate(fileno(f), (off_t)end) != 0 || fsync(fileno(f)) != 0) {
        ds_fail(err, "%s: write failed: %s", tmp, strerror(errno));
        goto out;
    }
    FILE *g = f;
    f = NULL;
    if (fclose(g) != 0) {
        ds_fail(err, "%s: write failed: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        ds_fail(err, "%s: cannot rename %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (f) fclose(f);
    if (rc != 0 && tmp) unlink(tmp);
    free(buf);
    free(tmp);
    free(hdr);
    return rc;
}

int ds_index_write(const char *dir, const char *const *names, const char *const *files, int n, ds_err *err) {
    char *path = join_path(dir, INDEX_NAME), *text = NULL;
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *map = cJSON_CreateObject();
    int rc = -1;
    if (!path || !root || !meta || !map) {
        cJSON_Delete(meta);
        cJSON_Delete(map);
        ds_fail(err, "%s: out of memory", dir);
        goto out;
    }
    cJSON_AddItemToObject(root, "metadata", meta);
    cJSON_AddItemToObject(root, "weight_map", map);
    for (int i = 0; i < n; i++) {
        if (!names[i] || !files[i] || !safe_rel_name(files[i])) {
            ds_fail(err, "%s: entry %d has no tensor name or an invalid file name", path, i);
            goto out;
        }
        if (!cJSON_AddStringToObject(map, names[i], files[i])) {
            ds_fail(err, "%s: out of memory", path);
            goto out;
        }
    }
    if (!(text = cJSON_Print(root))) {
        ds_fail(err, "%s: out of memory", path);
        goto out;
    }
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the terminator; length passed explicitly */
    rc = write_atomic(path, text, len + 1, err);
out:
    free(text);
    cJSON_Delete(root);
    free(path);
    return rc;
}
