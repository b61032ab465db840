// tokenizer.json "post_processor": what encode(..., add_special_tokens=true) adds around the ids.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ts::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void apply(std::vector<int32_t>& ids) const = 0;
};

// `token_to_id` resolves special tokens named by content (RobertaProcessing / string templates).
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const std::string& where,
                                                   const std::function<std::optional<int32_t>(std::string_view)>& token_to_id);

}  // namespace ts::tok
