/* model_load.h — the model a command names: a checkpoint directory, or
 * "synth:NAME[:LAYERS[:R]]", the random-weight model `dsv4 synth --like NAME
 * --layers LAYERS` writes, built in memory; under expert parallelism with
 * this rank's routed experts only (ep/ep.h). */
#ifndef DS_MODEL_LOAD_H
#define DS_MODEL_LOAD_H

#include "common/err.h"
#include "model/model.h"

/* A directory: ds_model_load_with(dir, lo) (lo NULL: mmap). synth:...: its
 * files are written, mapped and removed at once (lo is not used); errors
 * name "synth:SPEC". */
int ds_load_model(const char *dir, const ds_load_opts *lo, ds_model **out, ds_err *err);
/* The config a command's model has, without its weights: DIR/config.json, or
 * for "synth:NAME[:LAYERS[:R]]" the named shape. */
int ds_load_config(const char *dir, ds_config *cfg, ds_err *err);

#endif
