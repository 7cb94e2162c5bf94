/* pyjson.c — see pyjson.h. */
#include "text/pyjson.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ string builder */


void ds_sb_add(ds_sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *np = realloc(b->p, c);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        if (b->track) {
            unsigned char *nm = realloc(b->mk, c);
            if (!nm) {
                b->oom = 1;
                return;
            }
            b->mk = nm;
        }
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    if (b->track && n) memset(b->mk + b->n, b->user ? 1 : 0, n);
    b->n += n;
    b->p[b->n] = 0;
}

void ds_sb_adds(ds_sb *b, const char *s) { ds_sb_add(b, s, strlen(s)); }

/* ------------------------------------------------------------------- JSON */



void ds_json_free(ds_jnode *j) {
    free(j->s);
    for (size_t i = 0; i < j->n; i++) {
        ds_json_free(&j->kids[i]);
        if (j->key) free(j->key[i]);
    }
    free(j->kids);
    free(j->key);
    free(j->klen);
    memset(j, 0, sizeof *j);
}

typedef struct {
    const char *p, *end;
    int depth;
    const char *why;
} jp;

static void jws(jp *P) {
    while (P->p < P->end && (*P->p == ' ' || *P->p == '\t' || *P->p == '\n' || *P->p == '\r')) P->p++;
}

static int put_cp(ds_sb *b, unsigned cp) {
    char o[4];
    int k;
    if (cp < 0x80) {
        o[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        k = 2;
    } else if (cp < 0x10000) { /* lone surrogates too (WTF-8), re-escaped on output */
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        k = 3;
    } else {
        o[0] = (char)(0xf0 | (cp >> 18));
        o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[3] = (char)(0x80 | (cp & 0x3f));
        k = 4;
    }
    ds_sb_add(b, o, (size_t)k);
    return 0;
}

static int hex4(const char *p, const char *end, unsigned *v) {
    if (end - p < 4) return -1;
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *v = x;
    return 0;
}

static int jstring(jp *P, char **out, size_t *out_n) {
    ds_sb b = {0};
    P->p++; /* opening quote */
    for (;;) {
        if (P->p >= P->end) {
            P->why = "unterminated string";
            goto fail;
        }
        unsigned char c = (unsigned char)*P->p;
        if (c == '"') {
            P->p++;
            break;
        }
        if (c < 0x20) {
            P->why = "control character in a string";
            goto fail;
        }
        if (c != '\\') {
            const char *q = P->p;
            while (q < P->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
            ds_sb_add(&b, P->p, (size_t)(q - P->p));
            P->p = q;
            continue;
        }
        if (P->p + 1 >= P->end) {
            P->why = "unterminated escape";
            goto fail;
        }
        char e = P->p[1];
        P->p += 2;
        switch (e) {
        case '"': ds_sb_add(&b, "\"", 1); break;
        case '\\': ds_sb_add(&b, "\\", 1); break;
        case '/': ds_sb_add(&b, "/", 1); break;
        case 'b': ds_sb_add(&b, "\b", 1); break;
        case 'f': ds_sb_add(&b, "\f", 1); break;
        case 'n': ds_sb_add(&b, "\n", 1); break;
        case 'r': ds_sb_add(&b, "\r", 1); break;
        case 't': ds_sb_add(&b, "\t", 1); break;
        case 'u': {
            unsigned v, w;
            if (hex4(P->p, P->end, &v)) {
                P->why = "bad \\u escape";
                goto fail;
            }
            P->p += 4;
            if (v >= 0xd800 && v <= 0xdbff && P->end - P->p >= 6 && P->p[0] == '\\' && P->p[1] == 'u' &&
                !hex4(P->p + 2, P->end, &w) && w >= 0xdc00 && w <= 0xdfff) {
                v = 0x10000 + ((v - 0xd800) << 10) + (w - 0xdc00);
                P->p += 6;
            }
            put_cp(&b, v);
            break;
        }
        default: P->why = "bad escape"; goto fail;
        }
    }
    if (b.oom) {
        P->why = "out of memory";
        goto fail;
    }
    if (!b.p) {
        b.p = calloc(1, 1);
        if (!b.p) {
            P->why = "out of memory";
            return -1;
        }
    }
    *out = b.p;
    *out_n = b.n;
    return 0;
fail:
    free(b.p);
    return -1;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int jnumber(jp *P, ds_jnode *out) {
    /* Python's NUMBER_RE: (-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)? */
    const char *s = P->p, *q = s;
    if (q < P->end && *q == '-') q++;
    if (q >= P->end || !is_digit(*q)) {
        P->why = "bad value";
        return -1;
    }
    if (*q == '0') q++;
    else
        while (q < P->end && is_digit(*q)) q++;
    const char *int_end = q;
    int is_float = 0;
    if (q + 1 < P->end && *q == '.' && is_digit(q[1])) {
        q++;
        while (q < P->end && is_digit(*q)) q++;
        is_float = 1;
    }
    if (q < P->end && (*q == 'e' || *q == 'E')) {
        const char *r = q + 1;
        if (r < P->end && (*r == '+' || *r == '-')) r++;
        if (r < P->end && is_digit(*r)) {
            while (r < P->end && is_digit(*r)) r++;
            q = r;
            is_float = 1;
        }
    }
    P->p = q;
    if (is_float) {
        char tmp[512];
        size_t len = (size_t)(q - s);
        char *buf = len < sizeof tmp ? tmp : malloc(len + 1);
        if (!buf) {
            P->why = "out of memory";
            return -1;
        }
        memcpy(buf, s, len);
        buf[len] = 0;
        out->t = DS_J_FLOAT;
        out->d = strtod(buf, NULL);
        if (buf != tmp) free(buf);
        return 0;
    }
    /* an int: Python keeps every digit; -0 is 0 */
    int neg = *s == '-';
    const char *digits = s + neg;
    size_t nd = (size_t)(int_end - digits);
    if (nd == 1 && digits[0] == '0') neg = 0;
    out->t = DS_J_INT;
    out->len = nd + (size_t)neg;
    out->s = malloc(out->len + 1);
    if (!out->s) {
        P->why = "out of memory";
        return -1;
    }
    if (neg) out->s[0] = '-';
    memcpy(out->s + neg, digits, nd);
    out->s[out->len] = 0;
    return 0;
}

static int jvalue(jp *P, ds_jnode *out);

static int jgrow(ds_jnode *j, int obj) {
    if (j->n < j->cap) return 0;
    size_t c = j->cap ? j->cap * 2 : 4;
    ds_jnode *nk = realloc(j->kids, c * sizeof *nk);
    if (!nk) return -1;
    j->kids = nk;
    if (obj) {
        char **nkey = realloc(j->key, c * sizeof *nkey);
        if (!nkey) return -1;
        j->key = nkey;
        size_t *nl = realloc(j->klen, c * sizeof *nl);
        if (!nl) return -1;
        j->klen = nl;
    }
    j->cap = c;
    return 0;
}

static int jvalue(jp *P, ds_jnode *out) {
    memset(out, 0, sizeof *out);
    jws(P);
    if (P->p >= P->end) {
        P->why = "unexpected end";
        return -1;
    }
    char c = *P->p;
    size_t left = (size_t)(P->end - P->p);
    if (c == '"') {
        out->t = DS_J_STR;
        return jstring(P, &out->s, &out->len);
    }
    if (c == '{' || c == '[') {
        int obj = c == '{';
        if (++P->depth > 512) {
            P->why = "nested too deep";
            return -1;
        }
        out->t = obj ? DS_J_OBJ : DS_J_ARR;
        P->p++;
        jws(P);
        if (P->p < P->end && *P->p == (obj ? '}' : ']')) {
            P->p++;
            P->depth--;
            return 0;
        }
        for (;;) {
            if (jgrow(out, obj)) {
                P->why = "out of memory";
                return -1;
            }
            if (obj) {
                jws(P);
                if (P->p >= P->end || *P->p != '"') {
                    P->why = "expected a property name";
                    return -1;
                }
                char *k;
                size_t kl;
                if (jstring(P, &k, &kl)) return -1;
                jws(P);
                if (P->p >= P->end || *P->p != ':') {
                    free(k);
                    P->why = "expected ':'";
                    return -1;
                }
                P->p++;
                out->key[out->n] = k;
                out->klen[out->n] = kl;
            }
            if (jvalue(P, &out->kids[out->n])) {
                if (obj) free(out->key[out->n]);
                ds_json_free(&out->kids[out->n]);
                return -1;
            }
            out->n++;
            jws(P);
            if (P->p < P->end && *P->p == ',') {
                P->p++;
                continue;
            }
            if (P->p < P->end && *P->p == (obj ? '}' : ']')) {
                P->p++;
                break;
            }
            P->why = obj ? "expected ',' or '}'" : "expected ',' or ']'";
            return -1;
        }
        P->depth--;
        return 0;
    }
    if (left >= 4 && !memcmp(P->p, "null", 4)) {
        P->p += 4;
        out->t = DS_J_NULL;
        return 0;
    }
    if (left >= 4 && !memcmp(P->p, "true", 4)) {
        P->p += 4;
        out->t = DS_J_TRUE;
        return 0;
    }
    if (left >= 5 && !memcmp(P->p, "false", 5)) {
        P->p += 5;
        out->t = DS_J_FALSE;
        return 0;
    }
    if (left >= 3 && !memcmp(P->p, "NaN", 3)) {
        P->p += 3;
        out->t = DS_J_FLOAT;
        out->d = (double)NAN;
        return 0;
    }
    if (left >= 8 && !memcmp(P->p, "Infinity", 8)) {
        P->p += 8;
        out->t = DS_J_FLOAT;
        out->d = HUGE_VAL;
        return 0;
    }
    if (c == '-' && !(left >= 2 && is_digit(P->p[1])) && left >= 9 && !memcmp(P->p, "-Infinity", 9)) {
        P->p += 9;
        out->t = DS_J_FLOAT;
        out->d = -HUGE_VAL;
        return 0;
    }
    return jnumber(P, out);
}

/* json.loads: one value, whitespace around it, nothing else. */
int ds_json_parse(const char *s, size_t n, ds_jnode *out, const char **why) {
    jp P = {s, s + n, 0, NULL};
    if (jvalue(&P, out)) {
        ds_json_free(out);
        *why = P.why ? P.why : "bad JSON";
        return -1;
    }
    jws(&P);
    if (P.p != P.end) {
        ds_json_free(out);
        *why = "extra data after the value";
        return -1;
    }
    return 0;
}

/* repr(float) */
void ds_py_float(ds_sb *b, double d) {
    if (isnan(d)) {
        ds_sb_adds(b, "NaN");
        return;
    }
    if (isinf(d)) {
        ds_sb_adds(b, d < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (d == 0) {
        ds_sb_adds(b, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    char buf[64];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    /* buf: [-]D[.DDD]e[+-]XX */
    char digits[32];
    int nd = 0, neg = 0;
    const char *q = buf;
    if (*q == '-') {
        neg = 1;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (decpt <= -4 || decpt > 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -decpt; i++) out[o++] = '0';
        memcpy(out + o, digits, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(out + o, digits, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++) out[o++] = '0';
        out[o++] = '.';
        out[o++] = '0';
    } else {
        memcpy(out + o, digits, (size_t)decpt);
        o += decpt;
        out[o++] = '.';
        memcpy(out + o, digits + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    ds_sb_add(b, out, (size_t)o);
}

/* json.dumps of a str, ensure_ascii=False */
void ds_py_str(ds_sb *b, const char *s, size_t n) {
    ds_sb_add(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n) {
            unsigned char c = (unsigned char)s[j];
            if (c < 0x20 || c == '"' || c == '\\') break;
            /* a lone surrogate (ED A0..BF xx) is written as \udxxx */
            if (c == 0xed && j + 2 < n && ((unsigned char)s[j + 1] & 0xe0) == 0xa0) break;
            j++;
        }
        ds_sb_add(b, s + i, j - i);
        if (j >= n) break;
        unsigned char c = (unsigned char)s[j];
        char esc[8];
        switch (c) {
        case '"': ds_sb_adds(b, "\\\""); break;
        case '\\': ds_sb_adds(b, "\\\\"); break;
        case '\n': ds_sb_adds(b, "\\n"); break;
        case '\r': ds_sb_adds(b, "\\r"); break;
        case '\t': ds_sb_adds(b, "\\t"); break;
        case '\b': ds_sb_adds(b, "\\b"); break;
        case '\f': ds_sb_adds(b, "\\f"); break;
        case 0xed: {
            unsigned cp = ((c & 0x0fu) << 12) | (((unsigned char)s[j + 1] & 0x3fu) << 6) |
                          ((unsigned char)s[j + 2] & 0x3fu);
            snprintf(esc, sizeof esc, "\\u%04x", cp);
            ds_sb_adds(b, esc);
            j += 2;
            break;
        }
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            ds_sb_adds(b, esc);
        }
        i = j + 1;
    }
    ds_sb_add(b, "\"", 1);
}

/* index of the last property with the same key as property i */
size_t ds_json_last_dup(const ds_jnode *j, size_t i) {
    size_t last = i;
    for (size_t k = i + 1; k < j->n; k++)
        if (j->klen[k] == j->klen[i] && !memcmp(j->key[k], j->key[i], j->klen[i])) last = k;
    return last;
}

int ds_json_first_dup(const ds_jnode *j, size_t i) {
    for (size_t k = 0; k < i; k++)
        if (j->klen[k] == j->klen[i] && !memcmp(j->key[k], j->key[i], j->klen[i])) return 1;
    return 0;
}

void ds_py_dump(ds_sb *b, const ds_jnode *j) {
    switch (j->t) {
    case DS_J_NULL: ds_sb_adds(b, "null"); break;
    case DS_J_TRUE: ds_sb_adds(b, "true"); break;
    case DS_J_FALSE: ds_sb_adds(b, "false"); break;
    case DS_J_INT: ds_sb_add(b, j->s, j->len); break;
    case DS_J_FLOAT: ds_py_float(b, j->d); break;
    case DS_J_STR: ds_py_str(b, j->s, j->len); break;
    case DS_J_ARR:
        ds_sb_add(b, "[", 1);
        for (size_t i = 0; i < j->n; i++) {
            if (i) ds_sb_add(b, ", ", 2);
            ds_py_dump(b, &j->kids[i]);
        }
        ds_sb_add(b, "]", 1);
        break;
    case DS_J_OBJ: {
        ds_sb_add(b, "{", 1);
        int first = 1;
        for (size_t i = 0; i < j->n; i++) {
            if (ds_json_first_dup(j, i)) continue;
            if (!first) ds_sb_add(b, ", ", 2);
            first = 0;
            ds_py_str(b, j->key[i], j->klen[i]);
            ds_sb_add(b, ": ", 2);
            ds_py_dump(b, &j->kids[ds_json_last_dup(j, i)]);
        }
        ds_sb_add(b, "}", 1);
        break;
    }
    }
}

/* Python truthiness of a JSON value */
int ds_py_truthy(const ds_jnode *j) {
    switch (j->t) {
    case DS_J_NULL:
    case DS_J_FALSE: return 0;
    case DS_J_TRUE: return 1;
    case DS_J_INT: return !(j->len == 1 && j->s[0] == '0');
    case DS_J_FLOAT: return j->d != 0;
    case DS_J_STR: return j->len > 0;
    case DS_J_ARR:
    case DS_J_OBJ: return j->n > 0;
    }
    return 1;
}

const ds_jnode *ds_json_get(const ds_jnode *obj, const char *key) {
    if (obj->t != DS_J_OBJ) return NULL;
    const ds_jnode *found = NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->n; i++)
        if (obj->klen[i] == kl && !memcmp(obj->key[i], key, kl)) found = &obj->kids[i]; /* last wins */
    return found;
}

