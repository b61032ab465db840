// Small readers for tokenizer.json fields that name the offending field when the type is wrong.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

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

}  // namespace ts::tok
