/* json_schema.h — a JSON-schema subset compiled into a grammar (grammar.h).
 *
 * Supported: type (a name or a list of names: object, array, string,
 * number, integer, boolean, null), properties, required,
 * additionalProperties (false, true or a schema; absent = true), items,
 * minItems, maxItems, enum, const, anyOf, oneOf (as anyOf: a value may match
 * more than one branch), $ref to "#", "#/$defs/NAME" or
 * "#/definitions/NAME" (recursion allowed), $defs / definitions, and the
 * annotations title, description, default, examples, $schema, $id, $comment,
 * strict. Any other keyword is an error naming it (nothing is silently
 * ignored), as is a schema that is not an object or a boolean. */
#ifndef DS_JSON_SCHEMA_H
#define DS_JSON_SCHEMA_H

#include <stddef.h>

#include "common/err.h"
#include "text/grammar.h"

struct cJSON;

/* The grammar of the schema's values (text: the schema as JSON). */
int ds_json_schema_compile(const char *text, size_t n, ds_grammar **out, ds_err *err);

/* Adds the schema's node to g ($refs resolve within schema); returns its
 * index or -1. dsml: an object schema at the top becomes DSML parameters
 * (its string properties raw text, the others JSON) — a tool's arguments. */
int ds_json_schema_add(ds_grammar *g, const struct cJSON *schema, int dsml, ds_err *err);

/* The grammar of a DSML tool-call block of tools (an OpenAI "tools" array):
 * "\n\n<｜DSML｜tool_calls>\n", then one call, or with parallel one or more
 * separated by "\n": "<｜DSML｜invoke name=\"NAME\">\n", the parameters
 * following that tool's "parameters" schema, "\n</｜DSML｜invoke>"; then
 * "\n</｜DSML｜tool_calls>". only: the one tool allowed, or NULL for any. The
 * names are matched as one choice (no limit on the number of tools); two
 * tools of one name are an error. */
int ds_json_schema_tool_call(const struct cJSON *tools, const char *only, int parallel, ds_grammar **out, ds_err *err);

#endif
