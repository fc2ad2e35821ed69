// Which --model values name a TorchScript file rather than a built-in model: one rule for fl-client, fl-island
// and the manifest loader. Built-in names ("cnn", "squeezenet", "char-lm", "synthetic:<P>") have no '/' and no
// .pt/.pth extension.
#pragma once

#include <string_view>

namespace fl::core {

inline bool IsTorchScriptModelPath(std::string_view model) {
  return model.ends_with(".pt") || model.ends_with(".pth") || model.find('/') != std::string_view::npos;
}

}  // namespace fl::core
