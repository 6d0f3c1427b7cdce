#pragma once
// The one checked error type of the C++ core. The binding maps it to blink.BlinkError.
#include <stdexcept>
#include <string>

namespace blink {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// BLINK_CHECK(cond, message-expression): throw blink::Error when cond is false.
#define BLINK_CHECK(cond, msg)              \
  do {                                      \
    if (!(cond)) throw ::blink::Error(msg); \
  } while (0)

}  // namespace blink
