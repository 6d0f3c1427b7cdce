// The strict, bounded JSON reader of blink/json.h.
#include "blink/json.h"

#include <charconv>
#include <cmath>
#include <fstream>

namespace blink {
namespace json {

const char* type_name(Type t) {
  switch (t) {
    case Type::kNull: return "null";
    case Type::kBool: return "bool";
    case Type::kNumber: return "number";
    case Type::kString: return "string";
    case Type::kArray: return "array";
    case Type::kObject: return "object";
  }
  return "?";
}

namespace {

[[noreturn]] void wrong_type(const std::string& what, const char* want, Type got) {
  throw Error(what + ": expected " + want + ", found " + type_name(got));
}

}  // namespace

bool Value::as_bool(const std::string& what) const {
  if (type_ != Type::kBool) wrong_type(what, "a bool", type_);
  return bool_;
}

double Value::as_number(const std::string& what) const {
  if (type_ != Type::kNumber) wrong_type(what, "a number", type_);
  return number_;
}

const std::string& Value::as_string(const std::string& what) const {
  if (type_ != Type::kString) wrong_type(what, "a string", type_);
  return string_;
}

const std::vector<double>& Value::as_numbers(const std::string& what) const {
  if (type_ != Type::kArray) wrong_type(what, "an array of numbers", type_);
  if (!numeric_array_ && !items_.empty()) {
    for (size_t i = 0; i < items_.size(); ++i) {
      if (!items_[i].is(Type::kNumber)) {
        throw Error(what + "[" + std::to_string(i) + "]: expected a number, found " +
                    type_name(items_[i].type()));
      }
    }
  }
  return numbers_;  // an empty array has numeric_array_ == false and no numbers: fine
}

const std::vector<Value>& Value::as_array(const std::string& what) const {
  if (type_ != Type::kArray) wrong_type(what, "an array", type_);
  if (numeric_array_ && items_.size() != numbers_.size()) {
    items_.clear();
    items_.reserve(numbers_.size());
    for (double d : numbers_) {
      Value v;
      v.type_ = Type::kNumber;
      v.number_ = d;
      items_.push_back(std::move(v));
    }
  }
  return items_;
}

size_t Value::array_size(const std::string& what) const {
  if (type_ != Type::kArray) wrong_type(what, "an array", type_);
  return numeric_array_ ? numbers_.size() : items_.size();
}

const std::vector<std::pair<std::string, Value>>& Value::members(const std::string& what) const {
  if (type_ != Type::kObject) wrong_type(what, "an object", type_);
  return members_;
}

const Value* Value::find(const std::string& key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& kv : members_) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

const Value& Value::at(const std::string& key, const std::string& what) const {
  if (type_ != Type::kObject) wrong_type(what, "an object", type_);
  const Value* v = find(key);
  if (v == nullptr) throw Error(what + ": missing key \"" + key + "\"");
  return *v;
}

// Recursive descent over the text, depth-bounded.
class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  Value document() {
    skip_space();
    Value v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected content after the JSON value");
    return v;
  }

 private:
  const std::string& s_;
  const std::string& source_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& why) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    const char* truncated = pos_ >= s_.size() ? " (the file ends early: truncated?)" : "";
    throw Error(source_ + ": invalid JSON at line " + std::to_string(line) + ", column " +
                std::to_string(col) + ": " + why + truncated);
  }

  void skip_space() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }

  void expect_word(const char* word) {
    for (const char* p = word; *p; ++p, ++pos_) {
      if (pos_ >= s_.size() || s_[pos_] != *p) fail(std::string("expected '") + word + "'");
    }
  }

  Value value(int depth) {
    if (depth >= kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    Value v;
    const char c = peek();
    if (c == '{') {
      object(v, depth);
    } else if (c == '[') {
      array(v, depth);
    } else if (c == '"') {
      v.type_ = Type::kString;
      v.string_ = string();
    } else if (c == 't') {
      expect_word("true");
      v.type_ = Type::kBool;
      v.bool_ = true;
    } else if (c == 'f') {
      expect_word("false");
      v.type_ = Type::kBool;
    } else if (c == 'n') {
      expect_word("null");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type_ = Type::kNumber;
      v.number_ = number();
    } else if (pos_ >= s_.size()) {
      fail("expected a value");
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  void object(Value& v, int depth) {
    v.type_ = Type::kObject;
    ++pos_;  // '{'
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      for (const auto& kv : v.members_) {
        if (kv.first == key) fail("duplicate key \"" + key + "\"");
      }
      skip_space();
      if (peek() != ':') fail("expected ':' after a key");
      ++pos_;
      skip_space();
      Value item = value(depth + 1);
      v.members_.emplace_back(std::move(key), std::move(item));
      skip_space();
      const char c = peek();
      ++pos_;
      if (c == '}') return;
      if (c != ',') {
        --pos_;
        fail("expected ',' or '}' in an object");
      }
    }
  }

  void array(Value& v, int depth) {
    v.type_ = Type::kArray;
    ++pos_;  // '['
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    v.numeric_array_ = true;
    while (true) {
      skip_space();
      const char c = peek();
      if (v.numeric_array_ && (c == '-' || (c >= '0' && c <= '9'))) {
        v.numbers_.push_back(number());
      } else {
        if (v.numeric_array_) {
          // Mixed array: move the numbers read so far into elements.
          v.numeric_array_ = false;
          for (double d : v.numbers_) {
            Value n;
            n.type_ = Type::kNumber;
            n.number_ = d;
            v.items_.push_back(std::move(n));
          }
          v.numbers_.clear();
        }
        v.items_.push_back(value(depth + 1));
      }
      skip_space();
      const char e = peek();
      ++pos_;
      if (e == ']') return;
      if (e != ',') {
        --pos_;
        fail("expected ',' or ']' in an array");
      }
    }
  }

  double number() {
    const size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("malformed number");
    }
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("malformed number: digits expected after '.'");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("malformed number: exponent digits expected");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    double d = 0.0;
    // from_chars: locale-independent and exact (round to nearest).
    const auto r = std::from_chars(s_.data() + start, s_.data() + pos_, d);
    if (r.ec != std::errc() || !std::isfinite(d)) {
      pos_ = start;
      fail("number out of range");
    }
    return d;
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        --pos_;
        fail("bad hex digit in a \\u escape");
      }
    }
    return v;
  }

  std::string string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("control character in a string");
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
              fail("unpaired surrogate in a \\u escape");
            }
            pos_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate in a \\u escape");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }
};

Value parse(const std::string& text, const std::string& source) {
  BLINK_CHECK(text.size() <= kMaxBytes,
              source + ": " + std::to_string(text.size()) + " bytes is larger than the " +
                  std::to_string(kMaxBytes) + "-byte limit for a JSON artifact");
  return Parser(text, source).document();
}

std::string read_file(const std::string& path, size_t max_bytes) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  BLINK_CHECK(f.is_open(), path + ": cannot open the file (missing or unreadable)");
  const std::streamoff size = f.tellg();
  BLINK_CHECK(size >= 0, path + ": cannot read the file's size");
  BLINK_CHECK(static_cast<uint64_t>(size) <= max_bytes,
              path + ": " + std::to_string(size) + " bytes is larger than the " +
                  std::to_string(max_bytes) + "-byte limit");
  std::string data(static_cast<size_t>(size), '\0');
  f.seekg(0);
  if (size > 0) f.read(&data[0], size);
  BLINK_CHECK(f.good() || (size == 0), path + ": read error");
  return data;
}

Value parse_file(const std::string& path) { return parse(read_file(path), path); }

}  // namespace json
}  // namespace blink
