/* pyjson.h — JSON as DeepSeek's official chat encoder (Python) handles it:
 * json.loads (one value, NaN / Infinity accepted, integers kept digit for
 * digit, duplicate keys kept in order) and json.dumps(ensure_ascii=False)
 * (", " / ": " separators, floats as repr(), duplicate keys collapsed: first
 * position, last value). Output goes to a string builder whose bytes can carry
 * a mark (the chat encoder marks the text that comes from messages). */
#ifndef DS_PYJSON_H
#define DS_PYJSON_H

#include <stddef.h>

/* A growing NUL-terminated string; all-zero is empty. With track, mk[i] is
 * the value of `user` when byte i was added. oom: an allocation failed (the
 * string is then incomplete). Free p and mk. */
typedef struct ds_sb {
    char *p;
    size_t n, cap;
    int oom;
    unsigned char *mk; /* with track: per byte of p, 1 = text from a message field (plain text) */
    int track, user;   /* track: keep mk; user: the bytes added now come from a message field */
} ds_sb;

typedef enum { DS_J_NULL, DS_J_FALSE, DS_J_TRUE, DS_J_INT, DS_J_FLOAT, DS_J_STR, DS_J_ARR, DS_J_OBJ } ds_jtype;

typedef struct ds_jnode ds_jnode;
struct ds_jnode {
    ds_jtype t;
    char *s; /* DS_J_STR: decoded bytes; DS_J_INT: the digits */
    size_t len;
    double d;
    ds_jnode *kids;
    char **key; /* DS_J_OBJ */
    size_t *klen;
    size_t n, cap;
};

void ds_sb_add(ds_sb *b, const char *s, size_t n);
void ds_sb_adds(ds_sb *b, const char *s);

/* json.loads of s[0..n): 0, or -1 with *why (a static string). Free with ds_json_free. */
int ds_json_parse(const char *s, size_t n, ds_jnode *out, const char **why);
void ds_json_free(ds_jnode *j);
/* The member `key` of an object (the last one of duplicates), NULL if none. */
const ds_jnode *ds_json_get(const ds_jnode *obj, const char *key);
/* Duplicate keys of an object: the index of the last property with the key
 * of property i; 1 if an earlier property has the key of property i. */
size_t ds_json_last_dup(const ds_jnode *j, size_t i);
int ds_json_first_dup(const ds_jnode *j, size_t i);

/* json.dumps(value, ensure_ascii=False) appended to b. */
void ds_py_dump(ds_sb *b, const ds_jnode *j);
/* A JSON string literal as json.dumps writes it; a float as repr(). */
void ds_py_str(ds_sb *b, const char *s, size_t n);
void ds_py_float(ds_sb *b, double d);
/* Python truthiness of the value. */
int ds_py_truthy(const ds_jnode *j);

#endif
