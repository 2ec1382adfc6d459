/*
 * doctest_impl.cpp — doctest's implementation, compiled once into test/libdoctest.a (the Makefile's
 * DOCTEST_LIB) for every doctest program. Each test's own translation unit is built with
 * -DDOCTEST_LIBRARY_IMPLEMENTATION (doctest's guard of its implementation), so it keeps its
 * `#define DOCTEST_CONFIG_IMPLEMENT[_WITH_MAIN]` but skips compiling the framework again: about 8
 * CPU-seconds of g++ -O2 per program, 34 programs.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
