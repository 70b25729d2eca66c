#include "cachelock/cli.h"

int main(int argc, char** argv) { return dflash::CachelockMain(argc, argv); }
