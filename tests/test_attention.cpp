#include <catch2/catch.hpp>
#include <kvlab/kvlab.hpp>
TEST_CASE("placeholder attention") { REQUIRE(true); }
