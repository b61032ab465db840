// Small readers for tokenizer.json fields that name the offending field when the type is wrong.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tokenizer/bpe.h"

namespace ts::tok {

inline std::string json_type(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("tokenizer.json: {} must be an object with a string \"type\"", where);
  return j["type"].get<std::string>();
}

inline const nlohmann::json& json_array(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_array()) fail("tokenizer.json: {}.{} must be an array", where, key);
  return j[key];
}

inline std::string json_string(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) fail("tokenizer.json: {}.{} must be a string", where, key);
  return j[key].get<std::string>();
}

inline bool json_bool(const nlohmann::json& j, const char* key, const std::string& where, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) fail("tokenizer.json: {}.{} must be a boolean", where, key);
  return j[key].get<bool>();
}

inline int64_t json_int(const nlohmann::json& j, const char* key, const std::string& where, int64_t dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number_integer()) fail("tokenizer.json: {}.{} must be an integer", where, key);
  return j[key].get<int64_t>();
}

// The bound ids must stay below: max_token_id_bound(tokens) (bpe.h), but never below 65536,
// since small tables are cheap whatever their gaps (sparse test vocabularies have them).
inline int64_t token_id_limit(size_t tokens) {
  int64_t b = max_token_id_bound(tokens);
  return b < 65536 ? 65536 : b;
}

// A token id: an integer in [0, 2^24) (checked before narrowing: nlohmann's get<int32_t>()
// would turn 2^40 into 0).
inline int32_t json_token_id(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (int64_t(1) << 24))
    fail("tokenizer.json: {} must be a token id in [0, 2^24), got {}", where, v.dump());
  return static_cast<int32_t>(v.get<int64_t>());
}

}  // namespace ts::tok
