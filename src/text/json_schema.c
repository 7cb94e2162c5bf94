/* json_schema.c — see json_schema.h. */
#include "text/json_schema.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REFS 256

typedef struct {
    ds_grammar *g;
    const cJSON *root;
    const cJSON *ref_at[MAX_REFS];
    int ref_node[MAX_REFS];
    int n_ref;
    int depth;
} ctx;

static const char *const KEYWORDS[] = {
    "minLength", "maxLength", "type",     "properties",  "required", "additionalProperties",
    "items",     "minItems",  "maxItems", "enum",        "const",    "anyOf",
    "oneOf",     "$ref",      "$defs",    "definitions", "title",    "description",
    "default",   "examples",  "$schema",  "$id",         "$comment", "strict",
    NULL};

static const char *const ANNOTATIONS[] = {"title",    "description", "default", "examples",    "$schema", "$id",
                                          "$comment", "strict",      "$defs",   "definitions", NULL};

static int in_list(const char *k, const char *const *l) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(k, l[i])) return 1;
    return 0;
}

static int node_of(ctx *c, const cJSON *s, const char *path, int dsml, ds_err *err);

static int oom(ds_err *err) { return ds_fail(err, "schema: out of memory (or over 65535 grammar nodes)"); }

/* the JSON-escaped bytes of a name, without the quotes (malloc'ed) */
static char *escaped(const char *name, size_t *n) {
    cJSON *j = cJSON_CreateString(name);
    char *p = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!p) return NULL;
    size_t l = strlen(p);
    memmove(p, p + 1, l - 2);
    p[l - 2] = 0;
    *n = l - 2;
    return p;
}

static int lit_node(ctx *c, const cJSON *vals, int one, const char *path, ds_err *err) {
    int lit = ds_grammar_node(c->g, DS_G_LIT);
    if (lit < 0) return oom(err);
    const cJSON *v;
    int k = 0;
    cJSON_ArrayForEach(v, vals) {
        char *t = cJSON_PrintUnformatted(v);
        if (!t) return oom(err);
        int rc = ds_grammar_add_text(c->g, lit, t, strlen(t), err);
        free(t);
        if (rc) return -1;
        k++;
        if (one) break;
    }
    if (!k) return ds_fail(err, "schema: 'enum' at %s is empty", path);
    return lit;
}

static int get_count(const cJSON *s, const char *k, const char *path, int *v, ds_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 1e6 || j->valuedouble != (int)j->valuedouble)
        return ds_fail(err, "schema: '%s' at %s must be a non-negative integer", k, path);
    *v = (int)j->valuedouble;
    return 0;
}

static int object_node(ctx *c, const cJSON *s, const char *path, int dsml, ds_err *err) {
    int obj = ds_grammar_node(c->g, DS_G_OBJ);
    if (obj < 0) return oom(err);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return ds_fail(err, "schema: 'properties' at %s must be an object", path);
    if (req && !cJSON_IsArray(req)) return ds_fail(err, "schema: 'required' at %s must be an array", path);
    int addl = -1;
    if (!ap || cJSON_IsTrue(ap))
        addl = ds_grammar_any(c->g);
    else if (cJSON_IsFalse(ap))
        addl = -1;
    else {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/additionalProperties", path);
        if ((addl = node_of(c, ap, sub, 0, err)) < 0) return -1;
    }
    if (dsml) addl = -1; /* DSML parameters: the declared ones only */
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%.200s", path, p->string);
        int is_req = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, req) is_req |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        int v = node_of(c, p, sub, 0, err);
        if (v < 0) return -1;
        size_t n;
        char *name = dsml ? strdup(p->string) : escaped(p->string, &n);
        if (!name) return oom(err);
        if (dsml) {
            n = strlen(name);
            if (strchr(name, '"') || strchr(name, '<'))
                return free(name),
                       ds_fail(err, "schema: the parameter name '%.100s' at %s holds '\"' or '<'", p->string, path);
        }
        int rc = ds_grammar_obj_prop(c->g, obj, name, n, v, is_req, err);
        free(name);
        if (rc) return -1;
    }
    /* required names without a property: their values follow additionalProperties */
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return ds_fail(err, "schema: 'required' at %s must hold strings", path);
        if (props && cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) continue;
        int v = addl >= 0 ? addl : -1;
        if (v < 0 && !dsml)
            return ds_fail(err,
                           "schema: '%.100s' at %s is required but additionalProperties is false and it is not "
                           "in properties",
                           r->valuestring, path);
        if (v < 0) v = ds_grammar_any(c->g);
        size_t n;
        char *name = dsml ? strdup(r->valuestring) : escaped(r->valuestring, &n);
        if (!name) return oom(err);
        if (dsml) n = strlen(name);
        int rc = ds_grammar_obj_prop(c->g, obj, name, n, v, 1, err);
        free(name);
        if (rc) return -1;
    }
    ds_grammar_obj_set(c->g, obj, addl, dsml);
    return obj;
}

static int type_node(ctx *c, const cJSON *s, const char *t, const char *path, int dsml, ds_err *err) {
    int k;
    if (!strcmp(t, "object")) return object_node(c, s, path, dsml, err);
    if (!strcmp(t, "array")) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
        int items;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/items", path);
        if (it && cJSON_IsArray(it))
            return ds_fail(err, "schema: 'items' as an array (tuples) at %s is not supported", path);
        if (it)
            items = node_of(c, it, sub, 0, err);
        else
            items = ds_grammar_any(c->g);
        if (items < 0) return items;
        int mn = 0, mx = -1;
        if (get_count(s, "minItems", path, &mn, err) || get_count(s, "maxItems", path, &mx, err)) return -1;
        if (mx >= 0 && mn > mx) return ds_fail(err, "schema: minItems > maxItems at %s", path);
        if ((k = ds_grammar_node(c->g, DS_G_ARR)) < 0) return oom(err);
        ds_grammar_arr_set(c->g, k, items, mn, mx);
        return k;
    }
    if (!strcmp(t, "string")) {
        int mn = 0, mx = -1;
        if (get_count(s, "minLength", path, &mn, err) || get_count(s, "maxLength", path, &mx, err)) return -1;
        if (mx >= 0 && mn > mx) return ds_fail(err, "schema: minLength > maxLength at %s", path);
        if ((k = ds_grammar_node(c->g, DS_G_STR)) < 0) return oom(err);
        ds_grammar_str_set(c->g, k, mn, mx);
        return k;
    } else if (!strcmp(t, "number"))
        k = ds_grammar_node(c->g, DS_G_NUM);
    else if (!strcmp(t, "integer"))
        k = ds_grammar_node(c->g, DS_G_INT);
    else if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        if ((k = ds_grammar_node(c->g, DS_G_LIT)) < 0) return oom(err);
        if (!strcmp(t, "null")) return ds_grammar_add_text(c->g, k, "null", 4, err) ? -1 : k;
        if (ds_grammar_add_text(c->g, k, "true", 4, err) || ds_grammar_add_text(c->g, k, "false", 5, err)) return -1;
        return k;
    } else
        return ds_fail(err, "schema: unknown type '%.40s' at %s", t, path);
    if (k < 0) return oom(err);
    return k;
}

static const cJSON *resolve(ctx *c, const char *ref, const char *path, ds_err *err) {
    if (!strcmp(ref, "#")) return c->root;
    const char *pre[] = {"#/$defs/", "#/definitions/"};
    for (int i = 0; i < 2; i++) {
        size_t l = strlen(pre[i]);
        if (!strncmp(ref, pre[i], l)) {
            const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->root, i ? "definitions" : "$defs");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(defs, ref + l);
            if (!t) break;
            return t;
        }
    }
    ds_fail(err, "schema: '$ref' '%.100s' at %s: only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported",
            ref, path);
    return NULL;
}

static int node_of(ctx *c, const cJSON *s, const char *path, int dsml, ds_err *err) {
    if (cJSON_IsTrue(s)) return ds_grammar_any(c->g);
    if (cJSON_IsFalse(s)) return ds_fail(err, "schema: the schema false at %s (no value is valid)", path);
    if (!cJSON_IsObject(s)) return ds_fail(err, "schema: the schema at %s must be an object or a boolean", path);
    if (++c->depth > 64) return ds_fail(err, "schema: nested deeper than 64 at %s", path);
    int rc = -1;
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (!in_list(k->string, KEYWORDS)) {
            ds_fail(err, "schema: unsupported keyword '%.60s' at %s", k->string, path);
            goto out;
        }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) {
            ds_fail(err, "schema: '$ref' at %s must be a string", path);
            goto out;
        }
        cJSON_ArrayForEach(k, s) {
            if (strcmp(k->string, "$ref") && !in_list(k->string, ANNOTATIONS)) {
                ds_fail(err, "schema: '$ref' with the keyword '%.60s' beside it at %s is not supported", k->string,
                        path);
                goto out;
            }
        }
        const cJSON *t = resolve(c, ref->valuestring, path, err);
        if (!t) goto out;
        for (int i = 0; i < c->n_ref; i++)
            if (c->ref_at[i] == t) {
                rc = c->ref_node[i];
                goto out;
            }
        if (c->n_ref == MAX_REFS) {
            ds_fail(err, "schema: more than %d $ref targets", MAX_REFS);
            goto out;
        }
        int r = ds_grammar_node(c->g, DS_G_REF);
        if (r < 0) {
            oom(err);
            goto out;
        }
        c->ref_at[c->n_ref] = t;
        c->ref_node[c->n_ref++] = r;
        int tn = node_of(c, t, ref->valuestring, 0, err);
        if (tn < 0) goto out;
        ds_grammar_ref_set(c->g, r, tn);
        rc = r;
        goto out;
    }
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cst) {
        cJSON *arr = cJSON_CreateArray();
        if (!arr || !cJSON_AddItemReferenceToArray(arr, (cJSON *)cst)) {
            cJSON_Delete(arr);
            oom(err);
            goto out;
        }
        rc = lit_node(c, arr, 1, path, err);
        cJSON_Delete(arr);
        goto out;
    }
    if (en) {
        if (!cJSON_IsArray(en)) {
            ds_fail(err, "schema: 'enum' at %s must be an array", path);
            goto out;
        }
        rc = lit_node(c, en, 0, path, err);
        goto out;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any) {
        const char *kw = any->string;
        if (!cJSON_IsArray(any) || !cJSON_GetArraySize(any)) {
            ds_fail(err, "schema: '%s' at %s must be a non-empty array", kw, path);
            goto out;
        }
        cJSON_ArrayForEach(k, s) {
            if (strcmp(k->string, kw) && !in_list(k->string, ANNOTATIONS)) {
                ds_fail(err, "schema: '%s' with the keyword '%.60s' beside it at %s is not supported", kw, k->string,
                        path);
                goto out;
            }
        }
        int alt = ds_grammar_node(c->g, DS_G_ALT);
        if (alt < 0) {
            oom(err);
            goto out;
        }
        int i = 0;
        const cJSON *b;
        cJSON_ArrayForEach(b, any) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%d", path, kw, i++);
            int n = node_of(c, b, sub, 0, err);
            if (n < 0 || ds_grammar_add_child(c->g, alt, n, err)) goto out;
        }
        rc = alt;
        goto out;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!ty) {
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            rc = object_node(c, s, path, dsml, err);
        else if (cJSON_GetObjectItemCaseSensitive(s, "items"))
            rc = type_node(c, s, "array", path, 0, err);
        else
            rc = ds_grammar_any(c->g);
        goto out;
    }
    if (cJSON_IsString(ty)) {
        rc = type_node(c, s, ty->valuestring, path, dsml, err);
        goto out;
    }
    if (!cJSON_IsArray(ty) || !cJSON_GetArraySize(ty)) {
        ds_fail(err, "schema: 'type' at %s must be a string or a non-empty array of strings", path);
        goto out;
    }
    int alt = ds_grammar_node(c->g, DS_G_ALT);
    if (alt < 0) {
        oom(err);
        goto out;
    }
    cJSON_ArrayForEach(k, ty) {
        if (!cJSON_IsString(k)) {
            ds_fail(err, "schema: 'type' at %s must hold strings", path);
            goto out;
        }
        int n = type_node(c, s, k->valuestring, path, 0, err);
        if (n < 0 || ds_grammar_add_child(c->g, alt, n, err)) goto out;
    }
    rc = alt;
out:
    c->depth--;
    return rc;
}

int ds_json_schema_add(ds_grammar *g, const cJSON *schema, int dsml, ds_err *err) {
    ctx *c = calloc(1, sizeof *c);
    if (!c) return oom(err);
    c->g = g;
    c->root = schema;
    int rc = node_of(c, schema, "#", dsml, err);
    free(c);
    return rc;
}

int ds_json_schema_compile(const char *text, size_t n, ds_grammar **out, ds_err *err) {
    cJSON *s = cJSON_ParseWithLength(text, n);
    if (!s) return ds_fail(err, "schema: not valid JSON");
    ds_grammar *g = ds_grammar_new();
    int rc = -1;
    if (!g) {
        oom(err);
        goto done;
    }
    int root = ds_json_schema_add(g, s, 0, err);
    if (root < 0) goto done;
    ds_grammar_set_root(g, root);
    if (ds_grammar_finish(g, err)) goto done;
    *out = g;
    g = NULL;
    rc = 0;
done:
    ds_grammar_free(g);
    cJSON_Delete(s);
    return rc;
}

#define DSML                                                                                                           \
    "\xef\xbd\x9c"                                                                                                     \
    "DSML\xef\xbd\x9c"

int ds_json_schema_tool_call(const cJSON *tools, const char *only, int parallel, ds_grammar **out, ds_err *err) {
    static const char OPEN[] = "\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"";
    static const char NEXT[] = "\n<" DSML "invoke name=\"";
    static const char CLOSE[] = "\n</" DSML "tool_calls>";
    ds_grammar *g = ds_grammar_new();
    if (!g) return oom(err);
    /* root: OPEN, then pick; pick: a tool's name and '">\n', then SEQ(its parameters, after);
     * after: CLOSE, or (parallel) ALT(CLOSE, SEQ(NEXT, pick)) -- one call or several */
    int root = ds_grammar_node(g, DS_G_SEQ), open = ds_grammar_node(g, DS_G_TEXT), pick = ds_grammar_node(g, DS_G_PICK),
        close = ds_grammar_node(g, DS_G_TEXT), after = close;
    if (root < 0 || open < 0 || pick < 0 || close < 0) goto oom;
    if (ds_grammar_add_text(g, open, OPEN, sizeof OPEN - 1, err) ||
        ds_grammar_add_text(g, close, CLOSE, sizeof CLOSE - 1, err) || ds_grammar_add_child(g, root, open, err) ||
        ds_grammar_add_child(g, root, pick, err))
        goto fail;
    if (parallel) {
        int more = ds_grammar_node(g, DS_G_ALT), again = ds_grammar_node(g, DS_G_SEQ),
            next = ds_grammar_node(g, DS_G_TEXT);
        if (more < 0 || again < 0 || next < 0) goto oom;
        if (ds_grammar_add_text(g, next, NEXT, sizeof NEXT - 1, err) || ds_grammar_add_child(g, again, next, err) ||
            ds_grammar_add_child(g, again, pick, err) || ds_grammar_add_child(g, more, close, err) ||
            ds_grammar_add_child(g, more, again, err))
            goto fail;
        after = more;
    }
    const cJSON *t;
    int i = 0, n_pick = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsString(nm)) {
            ds_fail(err, "tools[%d]: function.name must be a string", i);
            goto fail;
        }
        i++;
        if (only && strcmp(only, nm->valuestring)) continue;
        if (strchr(nm->valuestring, '"') || !nm->valuestring[0]) {
            ds_fail(err, "tools[%d]: the function name '%.100s' is empty or holds '\"'", i - 1, nm->valuestring);
            goto fail;
        }
        int k = 0;
        const cJSON *u;
        cJSON_ArrayForEach(u, tools) {
            if (k++ == i - 1) break;
            const cJSON *un = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"), "name");
            if (cJSON_IsString(un) && !strcmp(un->valuestring, nm->valuestring)) {
                ds_fail(err, "tools[%d]: the function name '%.100s' is also tools[%d]'s", i - 1, nm->valuestring,
                        k - 1);
                goto fail;
            }
        }
        int call = ds_grammar_node(g, DS_G_SEQ);
        if (call < 0) goto oom;
        int args;
        cJSON *empty = NULL;
        if (!params || cJSON_IsNull(params)) params = empty = cJSON_Parse("{\"type\":\"object\",\"properties\":{}}");
        if (!params) goto oom;
        args = ds_json_schema_add(g, params, 1, err);
        cJSON_Delete(empty);
        if (args < 0) {
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            ds_fail(err, "tools[%d].function.parameters: %s", i - 1, m);
            goto fail;
        }
        if (ds_grammar_add_child(g, call, args, err) || ds_grammar_add_child(g, call, after, err)) goto fail;
        size_t nl = strlen(nm->valuestring);
        char *h = malloc(nl + 4);
        if (!h) goto oom;
        memcpy(h, nm->valuestring, nl);
        memcpy(h + nl, "\">\n", 4);
        int rc = ds_grammar_pick_add(g, pick, h, nl + 3, call, err);
        free(h);
        if (rc) goto fail;
        n_pick++;
    }
    if (!n_pick) {
        ds_fail(err, "tools: no tool to call");
        goto fail;
    }
    ds_grammar_set_root(g, root);
    if (ds_grammar_finish(g, err)) goto fail;
    *out = g;
    return 0;
oom:
    oom(err);
fail:
    ds_grammar_free(g);
    return -1;
}
