#include <stdio.h>

#include "cli/commands.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "dsv4 bench: not built yet\n");
    return 1;
}
