/* grammar.c — see grammar.h: the byte automaton of a grammar. */
#include "text/grammar.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t kind;
    uint8_t dsml; /* OBJ: written as DSML parameters */
    int n;        /* properties / texts / children */
    int cap;
    char **txt; /* property names (escaped) / texts */
    uint32_t *len;
    int *kid; /* property values / children */
    uint64_t required;
    int addl;            /* OBJ: additional properties' node, -1 none */
    int items, min, max; /* ARR (max -1: none) */
    int target;          /* REF */
} gnode;

struct ds_grammar {
    _Atomic int refs;
    gnode *nodes;
    int n, cap;
    int root;
    int any; /* the any-value node, -1 until asked for */
    /* the DSML markup nodes of DSML objects, -1 until needed */
    int t_popen, t_strue, t_sfalse, t_pclose, t_end, raw;
};

/* ------------------------------------------------------------- building */

ds_grammar *ds_grammar_new(void) {
    ds_grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    atomic_init(&g->refs, 1);
    g->root = g->any = -1;
    g->t_popen = g->t_strue = g->t_sfalse = g->t_pclose = g->t_end = g->raw = -1;
    return g;
}

const ds_grammar *ds_grammar_ref(const ds_grammar *g) {
    if (g) atomic_fetch_add(&((ds_grammar *)g)->refs, 1);
    return g;
}

void ds_grammar_free(const ds_grammar *cg) {
    ds_grammar *g = (ds_grammar *)cg;
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    for (int i = 0; i < g->n; i++) {
        gnode *x = &g->nodes[i];
        for (int k = 0; k < x->n; k++)
            if (x->txt) free(x->txt[k]);
        free(x->txt);
        free(x->len);
        free(x->kid);
    }
    free(g->nodes);
    free(g);
}

int ds_grammar_node(ds_grammar *g, int kind) {
    if (g->n == 65535) return -1;
    if (g->n == g->cap) {
        int c = g->cap ? g->cap * 2 : 32;
        gnode *nn = realloc(g->nodes, (size_t)c * sizeof *nn);
        if (!nn) return -1;
        g->nodes = nn;
        g->cap = c;
    }
    gnode *x = &g->nodes[g->n];
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->addl = -1;
    x->items = -1;
    x->min = 0;
    x->max = -1;
    x->target = -1;
    return g->n++;
}

/* room for one more entry in x's lists */
static int grow(gnode *x, ds_err *err) {
    if (x->n < x->cap) return 0;
    int c = x->cap ? x->cap * 2 : 4;
    char **t = realloc(x->txt, (size_t)c * sizeof *t);
    if (t) x->txt = t;
    uint32_t *l = realloc(x->len, (size_t)c * sizeof *l);
    if (l) x->len = l;
    int *k = realloc(x->kid, (size_t)c * sizeof *k);
    if (k) x->kid = k;
    if (!t || !l || !k) return ds_fail(err, "grammar: out of memory");
    x->cap = c;
    return 0;
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

int ds_grammar_obj_prop(ds_grammar *g, int obj, const char *name, size_t n, int value, int required, ds_err *err) {
    gnode *x = &g->nodes[obj];
    if (x->n >= DS_GRAMMAR_MAX_PROPS)
        return ds_fail(err, "schema: an object with more than %d properties", DS_GRAMMAR_MAX_PROPS);
    for (int k = 0; k < x->n; k++)
        if (x->len[k] == n && !memcmp(x->txt[k], name, n))
            return ds_fail(err, "schema: property '%.*s' twice", (int)n, name);
    if (grow(x, err)) return -1;
    if (!(x->txt[x->n] = dupn(name, n))) return ds_fail(err, "grammar: out of memory");
    x->len[x->n] = (uint32_t)n;
    x->kid[x->n] = value;
    if (required) x->required |= 1ull << x->n;
    x->n++;
    return 0;
}

void ds_grammar_obj_set(ds_grammar *g, int obj, int additional, int dsml) {
    g->nodes[obj].addl = additional;
    g->nodes[obj].dsml = (uint8_t)dsml;
}

void ds_grammar_str_set(ds_grammar *g, int str, int min_len, int max_len) {
    g->nodes[str].min = min_len;
    g->nodes[str].max = max_len;
}

void ds_grammar_arr_set(ds_grammar *g, int arr, int items, int min_items, int max_items) {
    gnode *x = &g->nodes[arr];
    x->items = items;
    x->min = min_items;
    x->max = max_items;
}

int ds_grammar_add_text(ds_grammar *g, int node, const char *s, size_t n, ds_err *err) {
    gnode *x = &g->nodes[node];
    if (x->kind == DS_G_LIT && x->n >= DS_GRAMMAR_MAX_LITS)
        return ds_fail(err, "schema: an enum of more than %d values", DS_GRAMMAR_MAX_LITS);
    if (!n) return ds_fail(err, "grammar: an empty text");
    if (grow(x, err)) return -1;
    if (!(x->txt[x->n] = dupn(s, n))) return ds_fail(err, "grammar: out of memory");
    x->len[x->n] = (uint32_t)n;
    x->kid[x->n] = -1;
    x->n++;
    return 0;
}

int ds_grammar_pick_add(ds_grammar *g, int pick, const char *s, size_t n, int then, ds_err *err) {
    gnode *x = &g->nodes[pick];
    if (!n) return ds_fail(err, "grammar: an empty text");
    /* the texts stay sorted: the first at or after s */
    int at = 0;
    for (int hi = x->n; at < hi;) {
        int m = (at + hi) / 2, c = memcmp(x->txt[m], s, x->len[m] < n ? x->len[m] : n);
        if (c < 0 || (c == 0 && x->len[m] < n))
            at = m + 1;
        else
            hi = m;
    }
    /* a prefix of s sorts just before it; a text s is a prefix of, just after it */
    if (at > 0 && x->len[at - 1] <= n && !memcmp(x->txt[at - 1], s, x->len[at - 1]))
        return ds_fail(err, "grammar: the choice '%.*s' starts with the choice '%.*s'", (int)n, s, (int)x->len[at - 1],
                       x->txt[at - 1]);
    if (at < x->n && x->len[at] >= n && !memcmp(x->txt[at], s, n))
        return ds_fail(err, "grammar: the choice '%.*s' starts with the choice '%.*s'", (int)x->len[at], x->txt[at],
                       (int)n, s);
    if (grow(x, err)) return -1;
    char *t = dupn(s, n);
    if (!t) return ds_fail(err, "grammar: out of memory");
    memmove(x->txt + at + 1, x->txt + at, (size_t)(x->n - at) * sizeof *x->txt);
    memmove(x->len + at + 1, x->len + at, (size_t)(x->n - at) * sizeof *x->len);
    memmove(x->kid + at + 1, x->kid + at, (size_t)(x->n - at) * sizeof *x->kid);
    x->txt[at] = t;
    x->len[at] = (uint32_t)n;
    x->kid[at] = then;
    x->n++;
    return 0;
}

int ds_grammar_add_child(ds_grammar *g, int node, int child, ds_err *err) {
    gnode *x = &g->nodes[node];
    if (x->kind == DS_G_ALT && x->n >= 64) return ds_fail(err, "schema: more than 64 alternatives");
    if (grow(x, err)) return -1;
    x->txt[x->n] = NULL;
    x->len[x->n] = 0;
    x->kid[x->n] = child;
    x->n++;
    return 0;
}

void ds_grammar_ref_set(ds_grammar *g, int ref, int target) { g->nodes[ref].target = target; }
void ds_grammar_set_root(ds_grammar *g, int root) { g->root = root; }

int ds_grammar_any(ds_grammar *g) {
    if (g->any >= 0) return g->any;
    ds_err err;
    int alt = ds_grammar_node(g, DS_G_ALT);
    if (alt < 0) return -1;
    int obj = ds_grammar_node(g, DS_G_OBJ), arr = ds_grammar_node(g, DS_G_ARR), str = ds_grammar_node(g, DS_G_STR),
        num = ds_grammar_node(g, DS_G_NUM), lit = ds_grammar_node(g, DS_G_LIT);
    if (obj < 0 || arr < 0 || str < 0 || num < 0 || lit < 0) return -1;
    ds_grammar_obj_set(g, obj, alt, 0);
    ds_grammar_arr_set(g, arr, alt, 0, -1);
    if (ds_grammar_add_text(g, lit, "true", 4, &err) || ds_grammar_add_text(g, lit, "false", 5, &err) ||
        ds_grammar_add_text(g, lit, "null", 4, &err))
        return -1;
    int ks[5] = {obj, arr, str, num, lit};
    for (int i = 0; i < 5; i++)
        if (ds_grammar_add_child(g, alt, ks[i], &err)) return -1;
    g->any = alt;
    return alt;
}

static int text_node(ds_grammar *g, const char *s, ds_err *err) {
    int t = ds_grammar_node(g, DS_G_TEXT);
    if (t < 0 || ds_grammar_add_text(g, t, s, strlen(s), err)) return -1;
    return t;
}

#define DSML                                                                                                           \
    "\xef\xbd\x9c"                                                                                                     \
    "DSML\xef\xbd\x9c"

int ds_grammar_finish(ds_grammar *g, ds_err *err) {
    if (g->root < 0) return ds_fail(err, "grammar: no root");
    int dsml = 0;
    for (int i = 0; i < g->n; i++) {
        const gnode *x = &g->nodes[i];
        if (x->kind == DS_G_REF && x->target < 0) return ds_fail(err, "schema: a $ref without a target");
        if (x->kind == DS_G_ALT && x->n == 0) return ds_fail(err, "schema: anyOf / enum / type with no alternative");
        if (x->kind == DS_G_PICK && x->n == 0) return ds_fail(err, "grammar: a choice of no text");
        if (x->kind == DS_G_ARR && x->items < 0) return ds_fail(err, "grammar: an array without items");
        dsml |= x->kind == DS_G_OBJ && x->dsml;
    }
    if (dsml && g->t_popen < 0) {
        if ((g->t_popen = text_node(g, "<" DSML "parameter name=\"", err)) < 0 ||
            (g->t_strue = text_node(g, "\" string=\"true\">", err)) < 0 ||
            (g->t_sfalse = text_node(g, "\" string=\"false\">", err)) < 0 ||
            (g->t_pclose = text_node(g, "</" DSML "parameter>", err)) < 0 ||
            (g->t_end = text_node(g, "\n</" DSML "invoke>", err)) < 0 || (g->raw = ds_grammar_node(g, DS_G_RAW)) < 0)
            return ds_fail(err, "grammar: out of memory");
    }
    /* some byte must start a text (a $ref cycle without a byte in between, say, starts none) */
    ds_gstate *st = ds_gstate_new(g), *c = ds_gstate_new(g);
    int any = 0;
    for (unsigned b = 0; st && c && b < 256 && !any; b++) {
        ds_gstate_copy(c, st);
        any = ds_gstate_feed(c, &(unsigned char){(unsigned char)b}, 1) == 0;
    }
    int ok = st && c;
    ds_gstate_free(st);
    ds_gstate_free(c);
    if (!ok) return ds_fail(err, "grammar: out of memory");
    if (!any) return ds_fail(err, "schema: no value can start (a $ref cycle?)");
    return 0;
}

int ds_grammar_json_object(ds_grammar **out, ds_err *err) {
    ds_grammar *g = ds_grammar_new();
    if (!g) return ds_fail(err, "grammar: out of memory");
    int any = ds_grammar_any(g), obj = ds_grammar_node(g, DS_G_OBJ);
    if (any < 0 || obj < 0) {
        ds_grammar_free(g);
        return ds_fail(err, "grammar: out of memory");
    }
    ds_grammar_obj_set(g, obj, any, 0);
    ds_grammar_set_root(g, obj);
    if (ds_grammar_finish(g, err)) {
        ds_grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

/* ------------------------------------------------------------- matching */

typedef struct {
    uint16_t node;
    uint8_t st;
    uint8_t aux; /* string lexer: escape and UTF-8 state */
    uint32_t n;  /* position / count / chosen property's node */
    uint64_t seen, cand;
} gframe;

#define GT_MAX 16  /* threads (open alternatives) at most; more are dropped */
#define GF_TOT 384 /* frames of all threads at most */

struct ds_gstate {
    const ds_grammar *g;
    int nt;
    uint16_t off[GT_MAX + 1];
    gframe f[GF_TOT];
};

enum {
    ST_START,
    O_OPEN,
    O_KEYQ,
    O_KEY,
    O_COLON,
    O_VWS,
    O_VAL,
    O_AFTER,
    O_CWS,
    D_START,
    D_KEYSTART,
    D_KEY,
    D_VAL,
    D_PCLOSE,
    D_AFTER,
    D_NL,
    D_LT,
    D_DONE,
    A_OPEN,
    A_AFTER,
    A_CWS,
    A_ITEM,
    S_IN,
    N_MINUS,
    N_ZERO,
    N_INT,
    N_DOT,
    N_FRAC,
    N_E,
    N_ESIGN,
    N_EXP,
    L_IN,
    T_IN,
    R_IN,
    Q_IN,
    P_IN,
};

static void st_init(ds_gstate *s) {
    s->nt = 1;
    s->off[0] = 0;
    s->off[1] = 1;
    memset(&s->f[0], 0, sizeof s->f[0]);
    s->f[0].node = (uint16_t)s->g->root;
    s->f[0].st = ST_START;
}

ds_gstate *ds_gstate_new(const ds_grammar *g) {
    ds_gstate *s = malloc(sizeof *s);
    if (!s) return NULL;
    s->g = g;
    st_init(s);
    return s;
}

void ds_gstate_free(ds_gstate *s) { free(s); }
void ds_gstate_reset(ds_gstate *s) { st_init(s); }

static void st_copy(ds_gstate *d, const ds_gstate *s) {
    d->g = s->g;
    d->nt = s->nt;
    memcpy(d->off, s->off, (size_t)(s->nt + 1) * sizeof s->off[0]);
    memcpy(d->f, s->f, (size_t)s->off[s->nt] * sizeof s->f[0]);
}

void ds_gstate_copy(ds_gstate *dst, const ds_gstate *src) { st_copy(dst, src); }

static void emit(ds_gstate *o, const gframe *fr, int d) {
    if (o->nt == GT_MAX || o->off[o->nt] + d > GF_TOT) return;
    for (int t = 0; t < o->nt; t++)
        if (o->off[t + 1] - o->off[t] == d && !memcmp(o->f + o->off[t], fr, (size_t)d * sizeof *fr)) return;
    memcpy(o->f + o->off[o->nt], fr, (size_t)d * sizeof *fr);
    o->off[o->nt + 1] = (uint16_t)(o->off[o->nt] + d);
    o->nt++;
}

/* a JSON string's byte: 0 rejected, 1 consumed, 2 the closing quote */
static int str_byte(uint8_t *aux, unsigned c) {
    unsigned esc = *aux & 7, pend = (*aux >> 3) & 3, rng = *aux >> 5;
    if (pend) {
        static const uint8_t lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
        if (c < lo[rng] || c > hi[rng]) return 0;
        *aux = (uint8_t)((pend - 1) << 3);
        return 1;
    }
    if (esc == 1) {
        if (c == 'u')
            *aux = 5;
        else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't')
            *aux = 0;
        else
            return 0;
        return 1;
    }
    if (esc >= 2) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return 0;
        *aux = (uint8_t)(esc == 2 ? 0 : esc - 1);
        return 1;
    }
    if (c == '"') return 2;
    if (c == '\\') {
        *aux = 1;
        return 1;
    }
    if (c < 0x20) return 0;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF)
        *aux = 1 << 3;
    else if (c == 0xE0)
        *aux = (2 << 3) | (1 << 5);
    else if (c == 0xED)
        *aux = (2 << 3) | (2 << 5);
    else if (c >= 0xE1 && c <= 0xEF)
        *aux = 2 << 3;
    else if (c == 0xF0)
        *aux = (3 << 3) | (3 << 5);
    else if (c >= 0xF1 && c <= 0xF3)
        *aux = 3 << 3;
    else if (c == 0xF4)
        *aux = (3 << 3) | (4 << 5);
    else
        return 0;
    return 1;
}

/* a raw (DSML string) byte: 0 rejected, 1 consumed, 2 the end ('<') */
static int raw_byte(uint8_t *aux, unsigned c) {
    if ((*aux >> 3) & 3) return str_byte(aux, c);
    if (c == '<') return 2;
    if (c == '"' || c == '\\') return 1;
    if (c == '\n' || c == '\t') return 1;
    return str_byte(aux, c);
}

static int num_end_state(int st) { return st == N_ZERO || st == N_INT || st == N_FRAC || st == N_EXP; }

static int finishable(const ds_grammar *g, const gframe *f) {
    const gnode *x = &g->nodes[f->node];
    if (x->kind == DS_G_NUM || x->kind == DS_G_INT) return num_end_state(f->st);
    if (x->kind == DS_G_LIT && f->st == L_IN)
        for (int i = 0; i < x->n; i++)
            if ((f->cand >> i & 1) && x->len[i] == f->n) return 1;
    return 0;
}

/* the frame ends as soon as its last child did */
static int ends_now(const ds_grammar *g, const gframe *f) {
    const gnode *x = &g->nodes[f->node];
    if (x->kind == DS_G_SEQ) return f->st == Q_IN && (int)f->n == x->n;
    if (x->kind == DS_G_OBJ) return f->st == D_DONE;
    return 0;
}

static uint64_t all_props(const gnode *x) { return x->n == 64 ? ~0ull : (1ull << x->n) - 1; }

/* one thread (frames fr[0..d), a scratch copy) takes byte c: the threads it
 * becomes are emitted into o */
static void step(const ds_grammar *g, gframe *fr, int d, unsigned c, ds_gstate *o, int hops, int *budget) {
    for (;;) {
        if (d == 0) return; /* complete: nothing may follow */
        gframe *f = &fr[d - 1];
        const gnode *x = &g->nodes[f->node];
#define PUSH(node_)                                                                                                    \
    do {                                                                                                               \
        if (d == DS_GRAMMAR_MAX_DEPTH) return;                                                                         \
        memset(&fr[d], 0, sizeof fr[d]);                                                                               \
        fr[d].node = (uint16_t)(node_);                                                                                \
        fr[d].st = ST_START;                                                                                           \
        d++;                                                                                                           \
    } while (0)
#define DONE()                                                                                                         \
    do {                                                                                                               \
        d--;                                                                                                           \
        while (d > 0 && ends_now(g, &fr[d - 1])) d--;                                                                  \
        emit(o, fr, d);                                                                                                \
        return;                                                                                                        \
    } while (0)
#define KEEP()                                                                                                         \
    do {                                                                                                               \
        emit(o, fr, d);                                                                                                \
        return;                                                                                                        \
    } while (0)
#define REFEED()                                                                                                       \
    {                                                                                                                  \
        d--;                                                                                                           \
        continue;                                                                                                      \
    }
        switch (f->st) {
        case ST_START:
            switch (x->kind) {
            case DS_G_REF:
                if (hops > 16) return;
                f->node = (uint16_t)x->target;
                hops++;
                continue;
            case DS_G_ALT: {
                if (hops > 16) return;
                for (int i = 0; i < x->n; i++) {
                    if (--*budget < 0) return; /* nested alternatives: bounded work per byte */
                    gframe tmp[DS_GRAMMAR_MAX_DEPTH];
                    memcpy(tmp, fr, (size_t)d * sizeof *fr);
                    tmp[d - 1].node = (uint16_t)x->kid[i];
                    step(g, tmp, d, c, o, hops + 1, budget);
                }
                return;
            }
            case DS_G_OBJ:
                if (x->dsml) {
                    f->st = D_START;
                    continue;
                }
                if (c != '{') return;
                f->st = O_OPEN;
                f->seen = 0;
                KEEP();
            case DS_G_ARR:
                if (c != '[') return;
                f->st = A_OPEN;
                f->n = 0;
                KEEP();
            case DS_G_STR:
                f->n = 0;
                f->aux = 0;
                if (f->cand) { /* raw (a DSML string parameter): no quotes */
                    f->st = R_IN;
                    continue;
                }
                if (c != '"') return;
                f->st = S_IN;
                KEEP();
            case DS_G_NUM:
            case DS_G_INT:
                f->n = 1;
                if (c == '-')
                    f->st = N_MINUS, f->n = 0;
                else if (c == '0')
                    f->st = N_ZERO;
                else if (c >= '1' && c <= '9')
                    f->st = N_INT;
                else
                    return;
                KEEP();
            case DS_G_LIT: {
                uint64_t cand = 0;
                for (int i = 0; i < x->n; i++)
                    if ((unsigned char)x->txt[i][0] == c) cand |= 1ull << i;
                if (!cand) return;
                f->st = L_IN;
                f->cand = cand;
                f->n = 1;
                /* a one-byte literal that is complete stays until the next byte */
                KEEP();
            }
            case DS_G_TEXT:
                f->st = T_IN;
                f->n = 0;
                continue;
            case DS_G_RAW:
                f->st = R_IN;
                f->aux = 0;
                continue;
            case DS_G_SEQ:
                f->st = Q_IN;
                f->n = 0;
                continue;
            case DS_G_PICK: /* the choices [lo, hi) that match so far: cand = lo | hi << 32 */
                f->st = P_IN;
                f->n = 0;
                f->cand = (uint64_t)x->n << 32;
                continue;
            }
            return;
        /* ---- JSON objects */
        case O_OPEN:
            if (c == '}' && !x->required) DONE();
            if (c == '"' && (x->addl >= 0 || x->n > 0)) {
                f->st = O_KEY;
                f->n = 0;
                f->aux = 0;
                f->cand = x->addl >= 0 ? all_props(x) : all_props(x) & ~f->seen;
                KEEP();
            }
            return;
        case O_KEYQ:
            if (c != '"') return;
            f->st = O_KEY;
            f->n = 0;
            f->aux = 0;
            f->cand = x->addl >= 0 ? all_props(x) : all_props(x) & ~f->seen;
            KEEP();
        case O_KEY: {
            int free_key = x->addl >= 0;
            int start = f->aux == 0; /* the byte starts a character (not an escape's or UTF-8's rest) */
            int r = str_byte(&f->aux, c);
            if (!r) return;
            if (r == 2) {
                int p = -1;
                for (int i = 0; i < x->n; i++)
                    if ((f->cand >> i & 1) && x->len[i] == f->n) p = i;
                if (p >= 0 && (f->seen >> p & 1)) return; /* a property twice */
                if (p < 0) {
                    if (!free_key) return;
                    f->n = (uint32_t)x->addl;
                } else {
                    f->seen |= 1ull << p;
                    f->n = (uint32_t)x->kid[p];
                }
                f->st = O_COLON;
                KEEP();
            }
            uint64_t nc = 0;
            for (int i = 0; i < x->n; i++)
                if ((f->cand >> i & 1) && x->len[i] > f->n && (unsigned char)x->txt[i][f->n] == c) nc |= 1ull << i;
            f->cand = nc;
            if (!nc && !free_key) return;
            f->n++;
            /* keys of 256 bytes at most, counted where a character starts: the
             * rest of one begun at byte 256 is still taken (a limit inside a
             * character would leave no byte to continue with) */
            if (f->n > 256 && start) return;
            KEEP();
        }
        case O_COLON:
            if (c != ':') return;
            f->st = O_VWS;
            KEEP();
        case O_VWS:
            f->st = O_VAL;
            if (c == ' ') KEEP();
            /* fall through */
        case O_VAL: {
            int v = (int)f->n;
            f->st = O_AFTER;
            PUSH(v);
            continue;
        }
        case O_AFTER:
            if (c == '}' && !(x->required & ~f->seen)) DONE();
            if (c == ',' && (x->addl >= 0 || (all_props(x) & ~f->seen))) {
                f->st = O_CWS;
                KEEP();
            }
            return;
        case O_CWS:
            f->st = O_KEYQ;
            if (c == ' ') KEEP();
            continue;
        /* ---- DSML parameters (tool call arguments) */
        case D_START:
            if (c == '<' && (all_props(x) & ~f->seen)) {
                f->st = D_KEYSTART;
                PUSH(g->t_popen);
                continue;
            }
            if (c == '\n' && !(x->required & ~f->seen)) {
                f->st = D_DONE;
                PUSH(g->t_end);
                continue;
            }
            return;
        case D_KEYSTART:
            f->st = D_KEY;
            f->n = 0;
            f->cand = all_props(x) & ~f->seen;
            /* fall through */
        case D_KEY: {
            if (c == '"') {
                int p = -1;
                for (int i = 0; i < x->n; i++)
                    if ((f->cand >> i & 1) && x->len[i] == f->n) p = i;
                if (p < 0) return;
                f->seen |= 1ull << p;
                int v = x->kid[p];
                const gnode *vx = &g->nodes[v];
                f->n = (uint32_t)v;
                f->aux = vx->kind == DS_G_STR; /* a string: raw */
                f->st = D_VAL;
                PUSH(vx->kind == DS_G_STR ? g->t_strue : g->t_sfalse);
                continue;
            }
            uint64_t nc = 0;
            for (int i = 0; i < x->n; i++)
                if ((f->cand >> i & 1) && x->len[i] > f->n && (unsigned char)x->txt[i][f->n] == c) nc |= 1ull << i;
            if (!nc) return;
            f->cand = nc;
            f->n++;
            KEEP();
        }
        case D_VAL: {
            int v = (int)f->n, raw = f->aux;
            f->st = D_PCLOSE;
            PUSH(v);
            fr[d - 1].cand = (uint64_t)raw;
            continue;
        }
        case D_PCLOSE:
            f->st = D_AFTER;
            PUSH(g->t_pclose);
            continue;
        case D_AFTER:
            if (c != '\n') return;
            f->st = D_NL;
            KEEP();
        case D_NL:
            if (c != '<') return;
            f->st = D_LT;
            KEEP();
        case D_LT:
            if (c == '/' && !(x->required & ~f->seen)) {
                f->st = D_DONE;
                PUSH(g->t_end);
                fr[d - 1].st = T_IN;
                fr[d - 1].n = 2; /* "\n<" */
                continue;
            }
            if ((all_props(x) & ~f->seen)) {
                f->st = D_KEYSTART;
                PUSH(g->t_popen);
                fr[d - 1].st = T_IN;
                fr[d - 1].n = 1; /* "<" */
                continue;
            }
            return;
        case D_DONE: REFEED();
        /* ---- arrays */
        case A_OPEN:
            if (c == ']' && x->min <= 0) DONE();
            if (x->max == 0) return;
            /* fall through */
        case A_ITEM:
            f->n++;
            f->st = A_AFTER;
            PUSH(x->items);
            continue;
        case A_AFTER:
            if (c == ']' && (int)f->n >= x->min) DONE();
            if (c == ',' && (x->max < 0 || (int)f->n < x->max)) {
                f->st = A_CWS;
                KEEP();
            }
            return;
        case A_CWS:
            f->st = A_ITEM;
            if (c == ' ') KEEP();
            continue;
        /* ---- strings */
        case S_IN:
        case R_IN: {
            int start = f->aux == 0; /* a character starts (or ends the string) */
            int r = f->st == S_IN ? str_byte(&f->aux, c) : raw_byte(&f->aux, c);
            if (!r) return;
            if (r == 2) {
                if ((int)f->n < x->min) return;
                if (f->st == R_IN) REFEED();
                DONE();
            }
            if (start && x->max >= 0 && (int)++f->n > x->max) return;
            if (start && x->max < 0 && (int)f->n < x->min) f->n++; /* unbounded: counted up to min only */
            KEEP();
        }
        /* ---- numbers */
        case N_MINUS:
            if (c == '0')
                f->st = N_ZERO;
            else if (c >= '1' && c <= '9')
                f->st = N_INT;
            else
                return;
            f->n = 1;
            KEEP();
        case N_ZERO:
        case N_INT:
            if (c >= '0' && c <= '9' && f->st == N_INT) {
                if (++f->n > (x->kind == DS_G_INT ? 15u : 20u)) return;
                KEEP();
            }
            if (x->kind == DS_G_NUM && c == '.') {
                f->st = N_DOT;
                KEEP();
            }
            if (x->kind == DS_G_NUM && (c == 'e' || c == 'E')) {
                f->st = N_E;
                KEEP();
            }
            REFEED();
        case N_DOT:
        case N_FRAC:
            if (c >= '0' && c <= '9') {
                if (++f->n > 20) return;
                f->st = N_FRAC;
                KEEP();
            }
            if (f->st == N_DOT) return;
            if (c == 'e' || c == 'E') {
                f->st = N_E;
                KEEP();
            }
            REFEED();
        case N_E:
            if (c == '+' || c == '-') {
                f->st = N_ESIGN;
                KEEP();
            }
            /* fall through */
        case N_ESIGN:
        case N_EXP:
            if (c >= '0' && c <= '9') {
                f->st = N_EXP;
                if (++f->aux > 3) return;
                KEEP();
            }
            if (f->st != N_EXP) return;
            REFEED();
        /* ---- literals, text, sequences */
        case L_IN: {
            uint64_t nc = 0;
            int complete = 0;
            for (int i = 0; i < x->n; i++) {
                if (!(f->cand >> i & 1)) continue;
                if (x->len[i] > f->n && (unsigned char)x->txt[i][f->n] == c) nc |= 1ull << i;
                if (x->len[i] == f->n) complete = 1;
            }
            if (nc) {
                f->cand = nc;
                f->n++;
                KEEP();
            }
            if (complete) REFEED();
            return;
        }
        case T_IN:
            if ((unsigned char)x->txt[0][f->n] != c) return;
            if (++f->n == x->len[0]) DONE();
            KEEP();
        case Q_IN:
            if ((int)f->n == x->n) REFEED();
            if ((int)f->n + 1 == x->n) {
                /* the last child takes the sequence's frame: a sequence that ends by coming back
                 * to where it started (repeated tool calls) keeps its depth */
                if (hops > 16) return;
                hops++;
                int k = x->kid[f->n];
                memset(f, 0, sizeof *f);
                f->node = (uint16_t)k;
                f->st = ST_START;
                continue;
            }
            PUSH(x->kid[f->n]);
            fr[d - 2].n++;
            continue;
        case P_IN: {
            /* within [lo, hi) the texts share their first n bytes, all are longer than n
             * (none is a prefix of another) and they are sorted: byte n does not decrease */
            uint32_t lo = (uint32_t)f->cand, hi = (uint32_t)(f->cand >> 32), n = f->n, a = lo, b = hi;
            while (a < b) {
                uint32_t m = (a + b) / 2;
                if ((unsigned char)x->txt[m][n] < c)
                    a = m + 1;
                else
                    b = m;
            }
            uint32_t l2 = a;
            for (b = hi; a < b;) {
                uint32_t m = (a + b) / 2;
                if ((unsigned char)x->txt[m][n] <= c)
                    a = m + 1;
                else
                    b = m;
            }
            if (l2 == a) return;
            if (x->len[l2] == n + 1) { /* the text is complete (the only one left): its node follows */
                int k = x->kid[l2];
                memset(f, 0, sizeof *f);
                f->node = (uint16_t)k;
                f->st = ST_START;
                KEEP();
            }
            f->n = n + 1;
            f->cand = l2 | (uint64_t)a << 32;
            KEEP();
        }
        }
        return;
    }
}

/* dst = src after byte c */
static void feed_byte(const ds_gstate *src, unsigned c, ds_gstate *dst) {
    dst->g = src->g;
    dst->nt = 0;
    dst->off[0] = 0;
    int budget = 4096; /* alternatives tried per byte at most (anyOf in anyOf ... would be exponential) */
    for (int t = 0; t < src->nt; t++) {
        gframe fr[DS_GRAMMAR_MAX_DEPTH];
        int d = src->off[t + 1] - src->off[t];
        memcpy(fr, src->f + src->off[t], (size_t)d * sizeof *fr);
        step(src->g, fr, d, c, dst, 0, &budget);
    }
}

int ds_gstate_feed(ds_gstate *s, const void *bytes, size_t n) {
    ds_gstate *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    int rc = -1;
    if (!a || !b) goto done;
    st_copy(a, s);
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) {
        feed_byte(a, p[i], b);
        if (!b->nt) goto done;
        ds_gstate *t = a;
        a = b;
        b = t;
    }
    st_copy(s, a);
    rc = 0;
done:
    free(a);
    free(b);
    return rc;
}

int ds_gstate_can_end(const ds_gstate *s) {
    for (int t = 0; t < s->nt; t++) {
        int d = s->off[t + 1] - s->off[t];
        if (d == 0 || (d == 1 && finishable(s->g, &s->f[s->off[t]]))) return 1;
    }
    return 0;
}

int ds_gstate_finished(const ds_gstate *s) {
    for (int t = 0; t < s->nt; t++)
        if (s->off[t + 1] - s->off[t] != 0) return 0;
    return s->nt > 0;
}

/* ------------------------------------------------------------ the trie */

typedef struct {
    uint8_t byte;
    uint8_t depth; /* 1 + the depth of the parent (the token's byte count here) */
    uint32_t end;  /* index past this node's subtree */
    int32_t tok;   /* a token ending here, -1 none; more in dup_next */
} tnode;

typedef struct {
    tnode *n;
    uint32_t nn;
} trie;

struct ds_vocab_trie {
    const ds_tokenizer *tok;
    int vocab;
    int32_t eos;
    int max_len;
    /* every token; and the tokens that are not plain by the rest of their
     * bytes after their longest plain prefix (inside a JSON string a plain
     * prefix leaves the state as it was, so the rest decides) */
    trie all, rest;
    int32_t *rest_dup; /* [vocab]: the next token with the same rest, -1 */
    int32_t *dup_next; /* [vocab]: the next token with the same bytes, -1 */
    uint64_t
        *plain; /* [words]: tokens that stay inside a JSON string (no quote, backslash, control byte, whole UTF-8) */
};

typedef struct {
    const unsigned char *b;
    uint32_t len;
    int32_t id;
} tokb;

static int tokb_cmp(const void *pa, const void *pb) {
    const tokb *a = pa, *b = pb;
    uint32_t m = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->b, b->b, m);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int trie_build(trie *t, tokb *tk, int n, int32_t *dup_next, ds_err *err) {
    size_t cap = 0;
    for (int i = 0; i < n; i++) cap += tk[i].len;
    t->n = malloc((cap + 1) * sizeof *t->n);
    if (!t->n) return ds_fail(err, "grammar: out of memory (trie)");
    uint32_t open[256];
    int n_open = 0;
    uint32_t nn = 0;
    const tokb *prev = NULL;
    for (int i = 0; i < n; i++) {
        uint32_t l = 0;
        if (prev)
            while (l < prev->len && l < tk[i].len && prev->b[l] == tk[i].b[l]) l++;
        if (prev && l == tk[i].len && l == prev->len) { /* the same bytes: chain the id */
            int32_t id = t->n[open[n_open - 1]].tok;
            while (dup_next[id] >= 0) id = dup_next[id];
            dup_next[id] = tk[i].id;
            continue;
        }
        while (n_open > (int)l) t->n[open[--n_open]].end = nn;
        for (uint32_t k = l; k < tk[i].len; k++) {
            t->n[nn].byte = tk[i].b[k];
            t->n[nn].depth = (uint8_t)(k + 1);
            t->n[nn].tok = -1;
            open[n_open++] = nn++;
        }
        t->n[open[n_open - 1]].tok = tk[i].id;
        prev = &tk[i];
    }
    while (n_open > 0) t->n[open[--n_open]].end = nn;
    t->nn = nn;
    return 0;
}

/* every byte of s keeps a JSON string open (whole UTF-8 characters, no quote,
 * backslash or control byte) */
static int is_plain(const unsigned char *s, uint32_t n) {
    uint8_t aux = 0;
    for (uint32_t i = 0; i < n; i++)
        if (str_byte(&aux, s[i]) != 1 || (aux & 7)) return 0;
    return aux == 0;
}

/* the length of the longest prefix of s made of plain characters */
static uint32_t plain_prefix(const unsigned char *s, uint32_t n) {
    uint8_t aux = 0;
    uint32_t end = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (str_byte(&aux, s[i]) != 1 || (aux & 7)) break;
        if (!aux) end = i + 1;
    }
    return end;
}

int ds_vocab_trie_build(const ds_tokenizer *tok, ds_vocab_trie **out, ds_err *err) {
    int V = ds_tokenizer_vocab_size(tok);
    ds_vocab_trie *t = calloc(1, sizeof *t);
    tokb *tk = malloc((size_t)V * sizeof *tk), *odd = malloc((size_t)V * sizeof *odd);
    int n = 0, n_odd = 0;
    if (!t || !tk || !odd) goto oom;
    t->tok = tok;
    t->vocab = V;
    t->eos = ds_tokenizer_eos_id(tok);
    t->dup_next = malloc((size_t)V * sizeof *t->dup_next);
    t->rest_dup = malloc((size_t)V * sizeof *t->rest_dup);
    t->plain = calloc(((size_t)V + 63) / 64, sizeof *t->plain);
    if (!t->dup_next || !t->plain || !t->rest_dup) goto oom;
    for (int id = 0; id < V; id++) {
        t->dup_next[id] = t->rest_dup[id] = -1;
        size_t len;
        const char *b = ds_tokenizer_token_bytes(tok, id, &len);
        if (!b || !len || id == t->eos || len > 255) continue;
        tk[n++] = (tokb){(const unsigned char *)b, (uint32_t)len, id};
        if (is_plain((const unsigned char *)b, (uint32_t)len))
            t->plain[id >> 6] |= 1ull << (id & 63);
        else {
            uint32_t pp = plain_prefix((const unsigned char *)b, (uint32_t)len);
            odd[n_odd++] = (tokb){(const unsigned char *)b + pp, (uint32_t)len - pp, id};
        }
        if ((int)len > t->max_len) t->max_len = (int)len;
    }
    qsort(tk, (size_t)n, sizeof *tk, tokb_cmp);
    qsort(odd, (size_t)n_odd, sizeof *odd, tokb_cmp);
    if (trie_build(&t->all, tk, n, t->dup_next, err) || trie_build(&t->rest, odd, n_odd, t->rest_dup, err)) goto fail;
    free(tk);
    free(odd);
    *out = t;
    return 0;
oom:
    ds_fail(err, "grammar: out of memory (trie)");
fail:
    free(tk);
    free(odd);
    ds_vocab_trie_free(t);
    return -1;
}

void ds_vocab_trie_free(ds_vocab_trie *t) {
    if (!t) return;
    free(t->all.n);
    free(t->rest.n);
    free(t->rest_dup);
    free(t->dup_next);
    free(t->plain);
    free(t);
}

int ds_vocab_trie_vocab(const ds_vocab_trie *t) { return t->vocab; }

struct ds_mask_scratch {
    int n;
    ds_gstate *st; /* [max_len + 1] */
};

ds_mask_scratch *ds_mask_scratch_new(const ds_vocab_trie *t) {
    ds_mask_scratch *m = malloc(sizeof *m);
    if (!m) return NULL;
    m->n = t->max_len + 1;
    m->st = malloc((size_t)m->n * sizeof *m->st);
    if (!m->st) {
        free(m);
        return NULL;
    }
    return m;
}

void ds_mask_scratch_free(ds_mask_scratch *m) {
    if (!m) return;
    free(m->st);
    free(m);
}

static int walk(const trie *t, const int32_t *dup, const ds_gstate *s, ds_mask_scratch *m, uint64_t *allowed) {
    int cnt = 0;
    st_copy(&m->st[0], s);
    for (uint32_t i = 0; i < t->nn;) {
        const tnode *x = &t->n[i];
        ds_gstate *nx = &m->st[x->depth];
        feed_byte(&m->st[x->depth - 1], x->byte, nx);
        if (!nx->nt) {
            i = x->end;
            continue;
        }
        for (int32_t id = x->tok; id >= 0; id = dup[id]) {
            allowed[id >> 6] |= 1ull << (id & 63);
            cnt++;
        }
        i++;
    }
    return cnt;
}

/* Every thread is inside a plain JSON string (not escaping, no UTF-8 pending),
 * or inside a free key (additionalProperties) that no declared property name
 * can still match, with room for the longest token under the key limit: a
 * plain token then continues every thread, and leaves each as it was but for
 * the key's length, so the rest trie's walk may skip a token's plain prefix. */
static int in_plain_text(const ds_vocab_trie *tr, const ds_gstate *s) {
    if (!s->nt) return 0;
    for (int t = 0; t < s->nt; t++) {
        int d = s->off[t + 1] - s->off[t];
        if (!d) return 0;
        const gframe *f = &s->f[s->off[t + 1] - 1];
        const gnode *x = &s->g->nodes[f->node];
        if (f->st == O_KEY) {
            if (x->addl < 0 || f->cand || f->aux || (int)f->n + tr->max_len > 256) return 0;
            continue;
        }
        if (f->st != S_IN || f->aux || x->max >= 0 || (int)f->n < x->min) return 0;
    }
    return 1;
}

int ds_grammar_mask(const ds_vocab_trie *t, const ds_gstate *s, ds_mask_scratch *m, uint64_t *allowed) {
    size_t words = ((size_t)t->vocab + 63) / 64;
    int cnt;
    if (in_plain_text(t, s)) {
        memcpy(allowed, t->plain, words * sizeof *allowed);
        cnt = 0;
        for (size_t w = 0; w < words; w++) cnt += __builtin_popcountll(allowed[w]);
        cnt += walk(&t->rest, t->rest_dup, s, m, allowed);
    } else {
        memset(allowed, 0, words * sizeof *allowed);
        cnt = walk(&t->all, t->dup_next, s, m, allowed);
    }
    if (t->eos >= 0 && ds_gstate_can_end(s)) {
        allowed[t->eos >> 6] |= 1ull << (t->eos & 63);
        cnt++;
    }
    return cnt;
}

int ds_grammar_mask_logits(const ds_vocab_trie *t, const ds_gstate *s, ds_mask_scratch *m, uint64_t *allowed,
                           const float *logits, int V, float *out) {
    int n = ds_grammar_mask(t, s, m, allowed);
    for (int v = 0; n && v < V; v++) out[v] = v < t->vocab && (allowed[v >> 6] >> (v & 63) & 1) ? logits[v] : -INFINITY;
    return n;
}

int ds_grammar_accept(const ds_vocab_trie *t, ds_gstate *s, int32_t id) {
    if (id == t->eos) return ds_gstate_can_end(s) ? 0 : -1;
    size_t n;
    const char *b = id >= 0 && id < t->vocab ? ds_tokenizer_token_bytes(t->tok, id, &n) : NULL;
    if (!b || !n) return -1;
    return ds_gstate_feed(s, b, n);
}
