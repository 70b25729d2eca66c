// The check every EnumName table passes (contract/enum_names.h): one name per value, none shared, the parser
// reads back what the printer writes, and only the exact spelling parses.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <set>
#include <string_view>

#include "contract/enum_names.h"

namespace dflash {

template <class E, size_t N>
void ExpectOneNameEachAndRoundTrip(const EnumName<E> (&table)[N], std::initializer_list<E> all) {
  std::set<std::string_view> names;
  for (E v : all) {
    std::string_view name = NameIn(table, v);
    EXPECT_NE(name, "?") << "a value without a name";
    EXPECT_TRUE(names.insert(name).second) << "two values named " << name;
    E back{};
    ASSERT_TRUE(ParseIn(table, name, &back)) << name;
    EXPECT_EQ(back, v) << name;
  }
  EXPECT_EQ(names.size(), N);
  E untouched = *all.begin();
  EXPECT_FALSE(ParseIn(table, "Never", &untouched));  // exact spelling only
  EXPECT_EQ(untouched, *all.begin());
}

}  // namespace dflash
