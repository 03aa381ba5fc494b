/* nsactl.c - placeholder until the CLI lands (this session). */
#include <stdio.h>
int main(void) { fprintf(stderr, "nsactl: not built yet\n"); return 1; }
