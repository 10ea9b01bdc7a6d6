// A check that a call throws E with a message mentioning `needle` (what the error names).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace salus::test_support {

template <class E, class F>
void expect_throw_with(F&& f, std::string_view needle) {
  try {
    f();
    ADD_FAILURE() << "expected an exception mentioning '" << needle << "'";
  } catch (const E& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string(needle)));
  }
}

}  // namespace salus::test_support
