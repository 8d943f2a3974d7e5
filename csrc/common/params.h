// Every COMMLIB_* environment variable, declared once (name, type, default, meaning), like
// NCCL_PARAM. The C++ core reads settings only through these functions (params.cc holds the one
// getenv), the Python layer through the binding (_C.settings, _C.setting), and README's settings
// table mirrors the table (tests/python/test_settings.py checks both).
//
// Adding a setting: one row in kParams (params.cc), one row in README's table, then read it with
// param_string / param_int / param_bytes where it is used. An integer setting declares its range in
// its row ({..., meaning, lo, hi}); the accessors check it, so a reader need not repeat it. The
// declaration lookup is built once (cached); values are read from the environment at each call, so a
// variable set before a communicator is created is seen by that communicator.
#pragma once

#include <cstdint>
#include <climits>
#include <string>
#include <vector>

namespace commlib {

struct Param {
  // "COMMLIB_TIMEOUT"; a family of variables ends in "<...>": "COMMLIB_ALGO_<COLLECTIVE>"
  // declares COMMLIB_ALGO_ALL_REDUCE, COMMLIB_ALGO_BROADCAST, ...
  const char* name;
  const char* type;      // seconds, bytes, int, flag, level, path, name
  const char* fallback;  // the default, as text ("" = unset)
  const char* meaning;
  // Integer settings (int, bytes): the accepted range, checked by param_int / param_bytes.
  int64_t lo = INT64_MIN;
  int64_t hi = INT64_MAX;
  bool integer() const;  // type int or bytes: read with param_int / param_bytes only
};

// The table, in README order.
const std::vector<Param>& params();

// The declaration of `name` (a family's members map to the family). Throws std::logic_error for an
// undeclared name: every read goes through the table.
const Param& param(const std::string& name);

// The variable's value if set and non-empty, else its default.
std::string param_string(const std::string& name);
// A variable another component owns and documents (CUDA's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), read
// as it does; "" when unset. std::logic_error for a COMMLIB_ name: those go through the table.
std::string foreign_env(const std::string& name);
// True when the environment sets `name` to a non-empty value.
bool param_set(const std::string& name);
// An integer in the declared range (and in [lo, hi], for a reader that needs less); anything else is
// std::invalid_argument naming the variable. std::logic_error for a setting that is not an integer.
int64_t param_int(const std::string& name, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);

// How long a waiting transport spins before sleeping, in microseconds: COMMLIB_SPIN_US, or
// kDefaultSpinUs when unset or -1 (measured best on 2 cores for 2, 4 and 8 ranks: bench/RESULTS.md).
constexpr int64_t kDefaultSpinUs = 20;
int64_t spin_us_param();
// A byte count >= 0 in the declared range: digits, optionally followed by K, M or G (either case,
// 1024-based: 64K, 4M, 1G). std::logic_error unless of type bytes. param_int reads bytes settings
// the same way.
size_t param_bytes(const std::string& name);
// The parse behind both: `v` as a byte count, std::invalid_argument naming `name` for anything else
// (a sign, blanks, another suffix, a value past INT64_MAX).
int64_t parse_byte_count(const std::string& name, const std::string& v);

// An enumerated ("name") setting: the one of `allowed` the variable names (surrounding blanks and
// case ignored), returned as spelled in `allowed`; unset or blank gives the declared default ("" when
// it has none). Anything else is std::invalid_argument naming the setting, its value and the choices,
// the same message for every such setting. std::logic_error unless the setting is of type name.
std::string param_choice(const std::string& name, const std::vector<std::string>& allowed);
// The same check of a value that did not come from the environment (a binding's argument that
// stands for the setting).
std::string parse_choice(const std::string& name, const std::string& value, const std::vector<std::string>& allowed);

}  // namespace commlib
