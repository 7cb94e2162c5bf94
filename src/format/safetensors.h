/* safetensors.h — zero-copy reader (mmap) for safetensors files and sharded
 * checkpoints (model.safetensors.index.json), and a streaming writer.
 *
 * Every header is validated on open: JSON well-formed, known dtype, shape
 * entries non-negative, data_offsets within the file, byte size equal to
 * shape x dtype size, no two tensors overlapping. Errors name the file and
 * the tensor. */
#ifndef DS_SAFETENSORS_H
#define DS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef enum ds_dtype {
    DS_F32 = 0,
    DS_F16,
    DS_BF16,
    DS_F64,
    DS_I64,
    DS_I32,
    DS_I16,
    DS_I8,
    DS_U8,
    DS_BOOL,
    DS_F8_E4M3,
    DS_F8_E8M0,
    DS_DTYPE_COUNT
} ds_dtype;

size_t ds_dtype_size(ds_dtype dt);
const char *ds_dtype_name(ds_dtype dt);          /* "F32", "F8_E4M3", ... */
int ds_dtype_parse(const char *name, ds_dtype *out); /* 0 ok, -1 unknown */

#define DS_MAX_DIMS 8

typedef struct ds_tensor {
    const char *name;
    ds_dtype dtype;
    int ndim;
    int64_t shape[DS_MAX_DIMS];
    const uint8_t *data; /* points into the mmap'd file (or its copy: ds_checkpoint_copy_in); read-only */
    uint64_t nbytes;
    int file;            /* index into the checkpoint's file list */
} ds_tensor;

typedef struct ds_checkpoint ds_checkpoint;

/* Opens a checkpoint: `path` is a directory holding either
 * model.safetensors.index.json (+ the shards it names) or exactly one
 * *.safetensors file, or a path to a single .safetensors file. */
int ds_checkpoint_open(const char *path, ds_checkpoint **out, ds_err *err);
void ds_checkpoint_close(ds_checkpoint *ck);

const ds_tensor *ds_checkpoint_find(const ds_checkpoint *ck, const char *name); /* NULL if absent */
/* Tensors are numbered 0..count-1 in name order (strcmp), across all files. */
int ds_checkpoint_count(const ds_checkpoint *ck);
const ds_tensor *ds_checkpoint_at(const ds_checkpoint *ck, int i);
const char *ds_checkpoint_file_path(const ds_checkpoint *ck, int file);
int ds_checkpoint_file_count(const ds_checkpoint *ck);

/* Copy-in: every file's bytes move from the file mapping into anonymous
 * memory, 2 MiB aligned and advised for transparent huge pages
 * (madvise(MADV_HUGEPAGE)), read with pread and dropped from the page cache
 * behind the read (posix_fadvise DONTNEED), so the page cache and the copy
 * never both hold the model. Tensors' data pointers move with their file;
 * the bytes are the same. On a machine whose file mappings use 4 KiB page
 * table entries this is what lets the weights stream at DRAM speed (see
 * docs/backend.md). Fails, naming the first file that would not fit, when
 * the files + `reserve` bytes exceed MemAvailable (checked before any copy);
 * a file that fails to copy stays mapped. pr may be NULL. */
typedef struct ds_copy_progress {
    void (*fn)(void *ctx, uint64_t done, uint64_t total); /* after each chunk (64 MiB) */
    void *ctx;
} ds_copy_progress;
int ds_checkpoint_copy_in(ds_checkpoint *ck, uint64_t reserve, const ds_copy_progress *pr, ds_err *err);
/* Pins every file's memory (mlock of each whole mapping or copy: locking
 * tensor by tensor would split a copy's huge-page mappings into 4 KiB ones);
 * 0, or the errno of mlock. */
int ds_checkpoint_mlock(const ds_checkpoint *ck);
/* 1 when every file was copied in. */
int ds_checkpoint_copied(const ds_checkpoint *ck);
/* The bytes of all files; MemAvailable and MemTotal of /proc/meminfo (0 if
 * unknown). */
uint64_t ds_checkpoint_bytes(const ds_checkpoint *ck);
uint64_t ds_mem_available(void);
uint64_t ds_mem_total(void);

/* Streaming writer. The header is written first from `specs`; then for each
 * tensor in order `fill` is called with a buffer of exactly its byte size
 * (chunked: offset/len within the tensor, len <= 64 MiB) to fill. */
typedef struct ds_tensor_spec {
    const char *name;
    ds_dtype dtype;
    int ndim;
    int64_t shape[DS_MAX_DIMS];
} ds_tensor_spec;

/* Fills len bytes of tensor `index` from byte offset: 0, or -1 (err). At
 * offset 0 it may return 1 instead: the tensor is left a hole of the file
 * (reads as zeros, takes no space on a sparse file system). */
typedef int (*ds_fill_fn)(void *ctx, int index, uint64_t offset, uint8_t *buf, uint64_t len, ds_err *err);

int ds_safetensors_write(const char *path, const ds_tensor_spec *specs, int n, ds_fill_fn fill, void *ctx,
                         ds_err *err);

/* Writes <dir>/model.safetensors.index.json mapping names[i] -> files[i]
 * (file names relative to dir). */
int ds_index_write(const char *dir, const char *const *names, const char *const *files, int n, ds_err *err);

uint64_t ds_tensor_numel(const ds_tensor *t);

#endif
