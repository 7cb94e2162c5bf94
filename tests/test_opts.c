/* test_opts.c — the CLI option parser (src/cli/opts.c): every value kind,
 * aliases and --name=value, bounds, every error class with its message
 * ("dsv4 <cmd>: <option>: <why>", exit status 2), repeats, the shared groups,
 * and the --help page generated from the tables. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/opts.h"
#include "runtime/backend_select.h"
#include "runtime/sampler.h"
#include "testutil.h"

typedef struct {
    int flag, i, choice;
    long long l;
    uint64_t u;
    double d;
    const char *s;
    cli_ids ids;
    cli_strs strs;
    cli_ids_list lists;
} args;

static const char *const COLORS[] = {"red", "green", "blue", NULL};

static const cli_opt opts[] = {
    CLI_FLAG_OPT("--flag", "-F", args, flag, "a flag"),
    CLI_INT_OPT("--int", "-i", args, i, -5, 10, "N", "an int in [-5, 10]"),
    CLI_LONG_OPT("--long", NULL, args, l, 0, 1LL << 40, "L", "a long long in [0, 2^40]"),
    CLI_U64_OPT("--u64", NULL, args, u, 0, INT64_MAX, "U", "a seed;  two spaces kept"),
    CLI_DOUBLE_OPT("--double", "-d", args, d, "X", "a double"),
    CLI_STRING_OPT("--str", "-s", args, s, "TEXT", "a string"),
    CLI_CHOICE_OPT("--color", NULL, args, choice, COLORS, "a choice"),
    CLI_IDS_OPT("--ids", NULL, args, ids, 1, 4096, "A,B", "sizes in [1, 4096]"),
    CLI_STRINGS_OPT("--name", NULL, args, strs, "NAME", "names"),
    CLI_IDS_LIST_OPT("--tokens", NULL, args, lists, 0, INT32_MAX, "5,17", "token lists"),
    CLI_END,
};

static args A;
static ds_sampling SP;
static ds_backend_opts BO;
static cli_model_arg MA;
static const cli_group GROUPS[] = {{NULL, opts, &A},
                                   {"sampling", cli_sampling_opts, &SP},
                                   {"backend", cli_threads_opts, &BO},
                                   {"backend", cli_backend_opts, &BO},
                                   {"model", cli_model_opts, &MA}};
static const cli_cmd CMD = {"test", "[options]", "About the test command.\n", "Notes at the end.\n", GROUPS, 5};

static char out_text[65536], err_text[65536];

static void slurp(FILE *f, char *buf, size_t cap) {
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
}

/* Parses argv (NULL-terminated, argv[0] = "test") from fresh destinations;
 * returns cli_parse's result, *rc its exit status, stdout / stderr in
 * out_text / err_text. */
static int parse(int *rc, const char **argv) {
    cli_free(&CMD);
    memset(&A, 0, sizeof A);
    ds_sampling_init(&SP);
    memset(&BO, 0, sizeof BO);
    memset(&MA, 0, sizeof MA);
    int argc = 0;
    while (argv[argc]) argc++;
    char *copy[64];
    for (int k = 0; k < argc; k++) copy[k] = (char *)(uintptr_t)argv[k];
    copy[argc] = NULL;
    FILE *fo = tmpfile(), *fe = tmpfile();
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    *rc = -1;
    int r = cli_parse(&CMD, argc, copy, rc);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    slurp(fo, out_text, sizeof out_text);
    slurp(fe, err_text, sizeof err_text);
    fclose(fo);
    fclose(fe);
    return r;
}

#define ARGV(...) ((const char *[]){"test", __VA_ARGS__, NULL})

/* An error: cli_parse returns 1 with status 2, nothing on stdout, and
 * stderr starts with "dsv4 test: <opt>: " and holds `why`. */
static void expect_error(const char *what, const char **argv, const char *opt, const char *why) {
    int rc;
    int r = parse(&rc, argv);
    char head[128];
    snprintf(head, sizeof head, "dsv4 test: %s: ", opt);
    CHECK(r == 1 && rc == 2, "%s: cli_parse %d, rc %d", what, r, rc);
    CHECK(!strncmp(err_text, head, strlen(head)), "%s: stderr '%s' does not start with '%s'", what, err_text, head);
    CHECK(strstr(err_text, why) != NULL, "%s: stderr '%s' lacks '%s'", what, err_text, why);
    CHECK(strstr(err_text, "usage: dsv4 test [options]") != NULL, "%s: no synopsis: '%s'", what, err_text);
    CHECK(out_text[0] == 0, "%s: stdout '%s'", what, out_text);
    /* what was parsed before the error is freed */
    CHECK(A.ids.v == NULL && A.strs.v == NULL && A.lists.v == NULL, "%s: allocations left", what);
}

static void test_kinds(void) {
    int rc;
    int r = parse(&rc, ARGV("--flag", "-i", "-5", "--long=1099511627776", "--u64", "9223372036854775807", "-d",
                            "-2.5e-3", "--str", "-h", "--color", "blue", "--ids", "1, 2,3 4096", "--name", "a",
                            "--name=b", "--tokens", "5,17,42", "--tokens", "0", "--temperature", "0.7", "--top-k", "40",
                            "--seed", "7", "--threads", "3", "--backend", "cuda", "--gpu", "1"));
    CHECK(r == 0, "all kinds: cli_parse %d: %s", r, err_text);
    CHECK(A.flag == 1 && A.i == -5 && A.l == 1LL << 40 && A.u == (uint64_t)INT64_MAX, "flag/int/long/u64: %d %d %lld",
          A.flag, A.i, A.l);
    CHECK(A.d == -2.5e-3, "a double starting with '-' is a value: %g", A.d);
    CHECK(A.s && !strcmp(A.s, "-h"), "'-h' as a value is a value, not --help");
    CHECK(A.choice == 2, "choice index %d", A.choice);
    CHECK(A.ids.n == 4 && A.ids.v[0] == 1 && A.ids.v[1] == 2 && A.ids.v[2] == 3 && A.ids.v[3] == 4096, "ids %d",
          A.ids.n);
    CHECK(A.strs.n == 2 && !strcmp(A.strs.v[0], "a") && !strcmp(A.strs.v[1], "b"), "repeated strings %d", A.strs.n);
    CHECK(A.lists.n == 2 && A.lists.v[0].n == 3 && A.lists.v[0].v[2] == 42 && A.lists.v[1].n == 1 &&
              A.lists.v[1].v[0] == 0,
          "repeated token lists %d", A.lists.n);
    CHECK(SP.temperature == 0.7 && SP.top_k == 40 && SP.seed == 7, "the sampling group");
    CHECK(SP.top_p == 1.0, "an option not given keeps its default (top_p %g)", SP.top_p);
    CHECK(BO.threads == 3 && BO.gpu == 1 && BO.name && !strcmp(BO.name, "cuda"), "two groups over one struct");
    CHECK(err_text[0] == 0 && out_text[0] == 0, "nothing printed: '%s' '%s'", err_text, out_text);

    /* aliases and the bounds themselves */
    r = parse(&rc, ARGV("-F", "-i", "10", "--long", "0", "-s", "", "--ids", "4096"));
    CHECK(r == 0 && A.flag && A.i == 10 && A.l == 0 && A.s && !A.s[0] && A.ids.n == 1, "aliases / upper bound: %s",
          err_text);
    r = parse(&rc, ARGV("--int=-5", "--double=1e300", "--str=x=y"));
    CHECK(r == 0 && A.i == -5 && A.d == 1e300 && !strcmp(A.s, "x=y"), "--name=value: %s", err_text);
    /* nothing given: the defaults stay */
    r = parse(&rc, (const char *[]){"test", NULL});
    CHECK(r == 0 && A.ids.v == NULL && A.ids.n == 0 && SP.temperature == 1.0, "no options");
    cli_free(&CMD);
    CHECK(A.ids.v == NULL && A.lists.v == NULL && A.strs.v == NULL, "cli_free zeroes");
}

/* --synth NAME[:LAYERS] is -m synth:NAME[:LAYERS]; not with -m */
static void test_synth(void) {
    int rc;
    int r = parse(&rc, ARGV("--synth", "flash:4"));
    CHECK(r == 0 && MA.dir && !strcmp(MA.dir, "synth:flash:4"), "--synth flash:4 -> '%s'", MA.dir ? MA.dir : "(null)");
    r = parse(&rc, ARGV("--synth=tiny"));
    CHECK(r == 0 && MA.dir && !strcmp(MA.dir, "synth:tiny"), "--synth=tiny -> '%s'", MA.dir ? MA.dir : "(null)");
    r = parse(&rc, ARGV("-m", "some/dir"));
    CHECK(r == 0 && MA.dir && !strcmp(MA.dir, "some/dir") && !MA.synth, "-m alone");
    expect_error("-m and --synth", ARGV("-m", "d", "--synth", "tiny"), "--synth", "not both");
    char big[200];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    expect_error("a long --synth", ARGV("--synth", big), "--synth", "too long");
}

static void test_errors(void) {
    expect_error("unknown option", ARGV("--bogus"), "--bogus", "unknown option");
    expect_error("unknown short option", ARGV("-x", "1"), "-x", "unknown option");
    expect_error("unknown --name=value", ARGV("--bogus=3"), "--bogus", "unknown option");
    expect_error("a positional argument", ARGV("file.txt"), "file.txt", "unknown option");
    expect_error("missing value", ARGV("--int"), "--int", "missing value (N)");
    expect_error("missing value of an alias", ARGV("--flag", "-s"), "-s", "missing value (TEXT)");
    expect_error("not an integer", ARGV("--int", "abc"), "--int", "'abc' is not an integer");
    expect_error("trailing junk", ARGV("--int", "3x"), "--int", "'3x' is not an integer");
    expect_error("empty integer", ARGV("--int="), "--int", "'' is not an integer");
    expect_error("a fraction is not an integer", ARGV("-i", "1.5"), "-i", "is not an integer");
    expect_error("below the range", ARGV("--int", "-6"), "--int", "'-6' is out of range [-5, 10]");
    expect_error("above the range", ARGV("-i", "11"), "-i", "'11' is out of range [-5, 10]");
    expect_error("beyond long long", ARGV("--long", "99999999999999999999"), "--long", "out of range");
    expect_error("negative u64", ARGV("--u64", "-1"), "--u64", "out of range [0, 9223372036854775807]");
    expect_error("not a number", ARGV("--double", "abc"), "--double", "'abc' is not a number");
    expect_error("NaN", ARGV("-d", "nan"), "-d", "'nan' is not a number");
    expect_error("double overflow", ARGV("-d", "1e999"), "-d", "out of the range of a double");
    expect_error("sampling double", ARGV("--temperature", "hot"), "--temperature", "not a number");
    expect_error("top-k range", ARGV("--top-k", "-1"), "--top-k", "out of range");
    expect_error("threads range", ARGV("--threads", "1025"), "--threads", "'1025' is out of range [0, 1024]");
    expect_error("gpu not an integer", ARGV("--gpu", "x"), "--gpu", "not an integer");
    expect_error("bad choice", ARGV("--color", "pink"), "--color", "'pink' is not one of red, green, blue");
    expect_error("not a list", ARGV("--ids", "1,x,3"), "--ids", "'1,x,3' is not a list of integers");
    expect_error("list element out of range", ARGV("--ids", "1,5000"), "--ids", "'5000' is out of range [1, 4096]");
    expect_error("list element below the range", ARGV("--ids", "0"), "--ids", "'0' is out of range [1, 4096]");
    expect_error("empty list", ARGV("--ids", " , "), "--ids", "empty list");
    expect_error("bad list among good ones", ARGV("--tokens", "1,2", "--name", "n", "--tokens", "3,-4"), "--tokens",
                 "out of range");
    expect_error("given twice", ARGV("--int", "1", "--int", "2"), "--int", "given twice");
    expect_error("given twice, alias then name", ARGV("-s", "a", "--str", "b"), "--str", "given twice");
    expect_error("flag twice", ARGV("--flag", "-F"), "-F", "given twice");
    expect_error("ids twice", ARGV("--ids", "1", "--ids", "2"), "--ids", "given twice");
    expect_error("shared option twice", ARGV("--seed", "1", "--seed", "2"), "--seed", "given twice");
    expect_error("flag with a value", ARGV("--flag=1"), "--flag", "takes no value");
    /* the first error ends the parse */
    expect_error("first error wins", ARGV("--int", "99", "--bogus"), "--int", "out of range");

    int rc;
    fflush(stderr);
    FILE *fe = tmpfile();
    int se = dup(2);
    dup2(fileno(fe), 2);
    rc = cli_usage_error(&CMD, "--%s and --%s do not go together", "a", "b");
    fflush(stderr);
    dup2(se, 2);
    close(se);
    slurp(fe, err_text, sizeof err_text);
    fclose(fe);
    CHECK(rc == 2, "cli_usage_error returns 2");
    const char *want = "dsv4 test: --a and --b do not go together\nusage: dsv4 test [options]";
    CHECK(!strncmp(err_text, want, strlen(want)), "cli_usage_error text: '%s'", err_text);
}

static void test_help(void) {
    const char *forms[] = {"--help", "-h"};
    for (int f = 0; f < 2; f++) {
        int rc;
        int r = parse(&rc, ARGV("--int", "3", forms[f], "--bogus"));
        CHECK(r == 1 && rc == 0, "%s: cli_parse %d, rc %d", forms[f], r, rc);
        CHECK(err_text[0] == 0, "%s: nothing on stderr: '%s'", forms[f], err_text);
        CHECK(!strncmp(out_text, "usage: dsv4 test [options]\n", 27), "%s: usage line", forms[f]);
    }
    /* every option of every group, with its alias and metavar, and the texts */
    for (int g = 0; g < CMD.n_groups; g++)
        for (const cli_opt *o = CMD.groups[g].opts; o->name; o++) {
            char line[160];
            if (o->alias && o->alias[1] != '-')
                snprintf(line, sizeof line, "  %s, %s%s%s", o->alias, o->name, o->metavar ? " " : "",
                         o->metavar ? o->metavar : "");
            else
                snprintf(line, sizeof line, "  %s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
            CHECK(strstr(out_text, line) != NULL, "--help lacks '%s'", line);
            char h[40];
            snprintf(h, sizeof h, "%.30s", o->help);
            CHECK(strstr(out_text, h) != NULL, "--help lacks the help of %s ('%s')", o->name, h);
        }
    const char *must[] = {"  -h, --help", "--color red|green|blue",  "(may be repeated)", "\nsampling:\n",
                          "\nbackend:\n", "About the test command.", "Notes at the end.", "\noptions:\n"};
    for (size_t k = 0; k < sizeof must / sizeof must[0]; k++)
        CHECK(strstr(out_text, must[k]) != NULL, "--help lacks '%s'", must[k]);
    const char *b = strstr(out_text, "\nbackend:\n");
    CHECK(b && !strstr(b + 1, "\nbackend:\n"), "two groups with one title share one heading");
    /* lines wrap at 100 columns */
    size_t longest = 0;
    for (const char *p = out_text; *p;) {
        size_t n = strcspn(p, "\n");
        if (n > longest) longest = n;
        p += n + (p[n] == '\n');
    }
    CHECK(longest <= 100, "a --help line of %zu bytes", longest);
}

int main(void) {
    test_kinds();
    test_synth();
    test_errors();
    test_help();
    cli_free(&CMD);
    return test_summary("test_opts");
}
