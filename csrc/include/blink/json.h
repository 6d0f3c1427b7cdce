#pragma once
// A small, strict JSON reader (RFC 8259) for the predictor artifacts in models/: XGBoost's
// native JSON forests and the GNN's safetensors header. Torch-free and dependency-free.
//
// Bounded: nesting deeper than kMaxDepth and documents larger than kMaxBytes are rejected, so a
// hostile file cannot exhaust the stack or memory. Every error is a blink::Error that names the
// source (the file) and the line and column.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "blink/error.h"

namespace blink {
namespace json {

inline constexpr int kMaxDepth = 64;
inline constexpr size_t kMaxBytes = size_t{1} << 30;  // 1 GiB

enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

const char* type_name(Type t);  // "null", "bool", "number", "string", "array", "object"

class Value {
 public:
  Type type() const { return type_; }
  bool is(Type t) const { return type_ == t; }

  // Typed access; each throws blink::Error naming `what` (a path such as "trees[3].left_children")
  // and the type found when the value is of another type.
  bool as_bool(const std::string& what) const;
  double as_number(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
  // An array of numbers (the common case in a forest: stored compactly while parsing).
  const std::vector<double>& as_numbers(const std::string& what) const;
  // Any array's elements (for arrays of numbers the elements are materialised on demand).
  const std::vector<Value>& as_array(const std::string& what) const;
  size_t array_size(const std::string& what) const;

  // Objects: members in file order; a duplicate key is a parse error.
  const std::vector<std::pair<std::string, Value>>& members(const std::string& what) const;
  const Value* find(const std::string& key) const;  // nullptr if absent or not an object
  const Value& at(const std::string& key, const std::string& what) const;  // throws if absent

 private:
  friend class Parser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  bool numeric_array_ = false;  // an array whose elements are all numbers, kept in numbers_
  double number_ = 0.0;
  std::string string_;
  std::vector<double> numbers_;
  mutable std::vector<Value> items_;  // array elements (lazily built from numbers_)
  std::vector<std::pair<std::string, Value>> members_;
};

// Parses a whole document; trailing non-space content is an error. `source` names the text in
// error messages ("models/forest_gemm.json").
Value parse(const std::string& text, const std::string& source);

// Reads and parses a file (bounded by kMaxBytes); errors name the path.
Value parse_file(const std::string& path);

// The file's bytes (bounded by `max_bytes`); throws blink::Error naming the path when it cannot
// be read or is larger.
std::string read_file(const std::string& path, size_t max_bytes = kMaxBytes);

}  // namespace json
}  // namespace blink
