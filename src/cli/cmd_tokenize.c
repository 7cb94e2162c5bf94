/* cmd_tokenize.c — placeholder until the tokenizer lands (issue 4). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "dsv4 tokenize: not built yet\n");
    return 1;
}

int cmd_detokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "dsv4 detokenize: not built yet\n");
    return 1;
}
