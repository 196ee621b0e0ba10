/* die: what every test program does when a check fails — say what and
 * errno, exit 1. A header of the tests', compiled into each. */
#ifndef DIE_H
#define DIE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define die(...)                                                                                                       \
	do {                                                                                                           \
		fprintf(stderr, __VA_ARGS__);                                                                          \
		fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));                                           \
		exit(1);                                                                                               \
	} while (0)

#endif
