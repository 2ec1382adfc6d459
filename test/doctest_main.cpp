/*
 * doctest_main.cpp — main() of the doctest programs that define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
 * (their own copy is skipped with the implementation, see doctest_impl.cpp). It is an archive member
 * of test/libdoctest.a, so the linker takes it only where the test defines no main() of its own.
 */
#include <doctest.h>

int main(int argc, char** argv) { return doctest::Context(argc, argv).run(); }
