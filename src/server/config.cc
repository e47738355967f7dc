#include "server/config.h"

#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "spec/demo_spec.h"
#include "yaml-cpp/yaml.h"

namespace refit::server {
namespace {



absl::Status Err(const YAML::Node& n, const std::string& path, const std::string& key, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", n.Mark().line + 1, ": ", key, ": ", msg));
}

absl::Status CheckKeys(const YAML::Node& map, const std::string& path, const std::string& where,
                       const std::set<std::string>& allowed) {
  if (!map.IsMap()) return Err(map, path, where, "expected a mapping");
  for (const auto& kv : map) {
    std::string key = kv.first.as<std::string>();
    if (!allowed.count(key)) {
      return Err(kv.first, path, where, absl::StrCat("unknown key '", key, "' (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Get(const YAML::Node& map, const char* key, const std::string& path, const std::string& where, T& out) {
  const YAML::Node n = map[key];
  if (!n) return absl::OkStatus();
  try {
    out = n.as<T>();
  } catch (const YAML::Exception&) {
    return Err(n, path, absl::StrCat(where, key), "has the wrong type");
  }
  return absl::OkStatus();
}

// The default transport with its keys' defaults.
void UseDefaultTransport(Config& c, const transport::TransportRegistry& transports) {
  if (transports.empty()) return;
  c.transport = transports.Default().name;
  for (const transport::ConfigKey& k : transports.Default().config_keys) c.transport_keys[k.name] = k.default_value;
}

// data_plane: transport (a registered name), host, device, and the chosen transport's own keys.
// Keys of the other registered transports are accepted and ignored.
absl::Status ParseDataPlane(const YAML::Node& d, const std::string& path, const transport::TransportRegistry& transports,
                            Config& c) {
  std::set<std::string> allowed = {"transport", "host", "device"};
  for (const std::string& k : transports.ConfigKeys()) allowed.insert(k);
  REFIT_RETURN_IF_ERROR(CheckKeys(d, path, "data_plane", allowed));
  REFIT_RETURN_IF_ERROR(Get(d, "transport", path, "data_plane.", c.transport));
  REFIT_RETURN_IF_ERROR(Get(d, "host", path, "data_plane.", c.data_host));
  REFIT_RETURN_IF_ERROR(Get(d, "device", path, "data_plane.", c.data_device));
  const transport::TransportDescriptor* t = transports.Find(c.transport);
  if (t == nullptr) return Err(d["transport"], path, "data_plane.transport", absl::StrCat("supported: ", transports.Names()));
  c.transport_keys.clear();
  for (const transport::ConfigKey& k : t->config_keys) {
    std::string value = k.default_value;
    REFIT_RETURN_IF_ERROR(Get(d, k.name.c_str(), path, "data_plane.", value));
    c.transport_keys[k.name] = value;
  }
  if (t->payload_memory == storage::MemoryKind::kDevice && c.staging != "device" && c.staging != "direct") {
    return Err(d["transport"], path, "data_plane.transport",
               absl::StrCat(t->name, " delivers buckets to the GPU and needs staging: device (or direct)"));
  }
  return absl::OkStatus();
}

// `log: {format, level}`; the older top-level `log_level` is still read (`log.level` wins).
absl::Status ParseLogSection(const YAML::Node& root, const std::string& path, Config& c) {
  REFIT_RETURN_IF_ERROR(Get(root, "log_level", path, "", c.log_level));
  if (const YAML::Node l = root["log"]) {
    REFIT_RETURN_IF_ERROR(CheckKeys(l, path, "log", {"format", "level"}));
    REFIT_RETURN_IF_ERROR(Get(l, "format", path, "log.", c.log_format));
    REFIT_RETURN_IF_ERROR(Get(l, "level", path, "log.", c.log_level));
  }
  const YAML::Node at = root["log"] ? root["log"] : root;
  if (c.log_format != "text" && c.log_format != "json") return Err(at, path, "log.format", "must be text or json");
  if (c.log_level != "debug" && c.log_level != "info" && c.log_level != "warn" && c.log_level != "error") {
    return Err(at, path, "log.level", "must be debug, info, warn or error");
  }
  return absl::OkStatus();
}

}  // namespace

Config DefaultConfig(const transport::TransportRegistry& transports) {
  Config c;
  UseDefaultTransport(c, transports);
  c.model_spec_inline = spec::kDemoModelSpec;
  return c;
}

absl::StatusOr<Config> ParseConfig(const std::string& yaml, const std::string& path,
                                   const transport::TransportRegistry& transports) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": YAML: ", e.msg));
  }
  Config c;
  UseDefaultTransport(c, transports);
  if (root.IsNull()) return c;
  REFIT_RETURN_IF_ERROR(
      CheckKeys(root, path, "config",
                {"listen", "socket_mode", "socket_group", "model_spec", "model_config", "data_plane", "staging",
                 "limits", "admin", "access", "tls", "log", "log_level", "engine", "hold", "busy_poll", "group"}));
  REFIT_RETURN_IF_ERROR(Get(root, "listen", path, "", c.listen));
  if (root["socket_mode"]) {
    std::string mode;
    REFIT_RETURN_IF_ERROR(Get(root, "socket_mode", path, "", mode));
    uint32_t m = 0;
    bool ok = !mode.empty() && mode.size() <= 4;
    for (char ch : mode) {
      ok = ok && ch >= '0' && ch <= '7';
      m = m * 8 + static_cast<uint32_t>(ch - '0');
    }
    if (!ok) return Err(root["socket_mode"], path, "socket_mode", "must be an octal mode such as \"0660\"");
    c.socket_mode = m;
  }
  REFIT_RETURN_IF_ERROR(Get(root, "socket_group", path, "", c.socket_group));
  if (const YAML::Node a = root["access"]) {
    REFIT_RETURN_IF_ERROR(CheckKeys(a, path, "access", {"allowed_uids", "token_file"}));
    if (const YAML::Node uids = a["allowed_uids"]; uids && uids.IsSequence() && uids.size() > kMaxAllowedUids) {
      return Err(uids, path, "access.allowed_uids",
                 absl::StrCat("lists ", uids.size(), " uids; at most ", kMaxAllowedUids, " (use socket_group for more)"));
    }
    REFIT_RETURN_IF_ERROR(Get(a, "allowed_uids", path, "access.", c.allowed_uids));
    REFIT_RETURN_IF_ERROR(Get(a, "token_file", path, "access.", c.token_file));
  }
  if (const YAML::Node t = root["tls"]) {
    REFIT_RETURN_IF_ERROR(CheckKeys(t, path, "tls", {"cert", "key", "client_ca"}));
    REFIT_RETURN_IF_ERROR(Get(t, "cert", path, "tls.", c.tls_cert));
    REFIT_RETURN_IF_ERROR(Get(t, "key", path, "tls.", c.tls_key));
    REFIT_RETURN_IF_ERROR(Get(t, "client_ca", path, "tls.", c.tls_client_ca));
    if (c.tls_cert.empty()) return Err(t, path, "tls.cert", "is required when tls is set");
    if (c.tls_key.empty()) return Err(t, path, "tls.key", "is required when tls is set");
  }
  if (const YAML::Node e = root["engine"]) {
    REFIT_RETURN_IF_ERROR(CheckKeys(e, path, "engine", {"pause_timeout_ms", "resume_timeout_ms", "verify_after_commit",
                                                       "asleep_refits"}));
    REFIT_RETURN_IF_ERROR(Get(e, "pause_timeout_ms", path, "engine.", c.pause_timeout_ms));
    REFIT_RETURN_IF_ERROR(Get(e, "resume_timeout_ms", path, "engine.", c.resume_timeout_ms));
    REFIT_RETURN_IF_ERROR(Get(e, "verify_after_commit", path, "engine.", c.verify_after_commit));
    REFIT_RETURN_IF_ERROR(Get(e, "asleep_refits", path, "engine.", c.asleep_refits));
    if (c.asleep_refits != "stage" && c.asleep_refits != "refuse") {
      return Err(e["asleep_refits"], path, "engine.asleep_refits", "must be stage or refuse");
    }
    if (c.pause_timeout_ms < 1) return Err(e, path, "engine.pause_timeout_ms", "must be at least 1");
    if (c.resume_timeout_ms < 1) return Err(e, path, "engine.resume_timeout_ms", "must be at least 1");
  }
  REFIT_RETURN_IF_ERROR(Get(root, "model_spec", path, "", c.model_spec));
  REFIT_RETURN_IF_ERROR(Get(root, "model_config", path, "", c.model_config));
  REFIT_RETURN_IF_ERROR(Get(root, "hold", path, "", c.hold));
  if (c.hold > 64) return Err(root["hold"], path, "hold", "must be at most 64");
  if (const YAML::Node g = root["group"]) {
    REFIT_RETURN_IF_ERROR(CheckKeys(
        g, path, "group", {"name", "members", "member", "decision_timeout_ms", "addresses", "peers_unreachable"}));
    REFIT_RETURN_IF_ERROR(Get(g, "name", path, "group.", c.group_name));
    REFIT_RETURN_IF_ERROR(Get(g, "members", path, "group.", c.group_members));
    REFIT_RETURN_IF_ERROR(Get(g, "member", path, "group.", c.group_member));
    REFIT_RETURN_IF_ERROR(Get(g, "decision_timeout_ms", path, "group.", c.group_decision_timeout_ms));
    if (c.group_name.empty() || c.group_name.size() > 128 ||
        c.group_name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:+-") !=
            std::string::npos) {
      return Err(g, path, "group.name", "must be 1 to 128 bytes of [A-Za-z0-9._:+-]");
    }
    if (c.group_members < 2 || c.group_members > 4096) return Err(g, path, "group.members", "must be 2 .. 4096");
    if (c.group_member >= c.group_members) return Err(g, path, "group.member", "must be 0 .. group.members - 1");
    if (c.group_decision_timeout_ms < 100 || c.group_decision_timeout_ms > 3'600'000) {
      return Err(g, path, "group.decision_timeout_ms", "must be 100 .. 3600000");
    }
    REFIT_RETURN_IF_ERROR(Get(g, "addresses", path, "group.", c.group_addresses));
    std::string unreachable = "hold";
    REFIT_RETURN_IF_ERROR(Get(g, "peers_unreachable", path, "group.", unreachable));
    if (unreachable != "hold" && unreachable != "serve") {
      return Err(g["peers_unreachable"], path, "group.peers_unreachable",
                 absl::StrCat("'", unreachable, "': must be hold or serve"));
    }
    c.group_hold_unanswered = unreachable == "hold";
    if (!c.group_addresses.empty() && c.group_addresses.size() != c.group_members) {
      return Err(g["addresses"], path, "group.addresses",
                 absl::StrCat("lists ", c.group_addresses.size(), " addresses; it must list every member's (",
                              c.group_members, "), in member order"));
    }
    for (size_t i = 0; i < c.group_addresses.size(); ++i) {
      if (c.group_addresses[i].empty() || c.group_addresses[i].size() > 4096) {
        return Err(g["addresses"], path, absl::StrCat("group.addresses[", i, "]"), "must be 1 to 4096 bytes");
      }
    }
    if (c.hold < 1) {
      return Err(g, path, "group", "needs hold: 1 or more (each group version is held before the group commits it)");
    }
  }
  REFIT_RETURN_IF_ERROR(Get(root, "staging", path, "", c.staging));
  if (c.staging != "host" && c.staging != "device" && c.staging != "direct") {
    return Err(root["staging"], path, "staging", "must be host, device or direct");
  }
  REFIT_RETURN_IF_ERROR(Get(root, "busy_poll", path, "", c.busy_poll));
  if (c.busy_poll != "auto" && c.busy_poll != "on" && c.busy_poll != "off") {
    return Err(root["busy_poll"], path, "busy_poll", "must be auto, on or off");
  }
  if (c.staging == "direct" && c.hold > 0) {
    return Err(root["hold"], path, "hold",
               "must be 0 with staging: direct (refits are converted into the engine's memory: no version is kept "
               "to commit or roll back to)");
  }
  REFIT_RETURN_IF_ERROR(ParseLogSection(root, path, c));
  if (const YAML::Node d = root["data_plane"]) REFIT_RETURN_IF_ERROR(ParseDataPlane(d, path, transports, c));
  if (const YAML::Node l = root["limits"]) {
    REFIT_RETURN_IF_ERROR(CheckKeys(l, path, "limits",
                                    {"bucket_bytes", "bucket_slots", "staging_bytes", "max_tensors", "max_name_bytes",
                                     "session_deadline_ms", "max_message_words", "max_connections",
                                     "max_connections_per_uid", "connection_buffer_bytes", "buffered_message_bytes",
                                     "idle_timeout_ms"}));
    SessionLimits& s = c.limits;
    REFIT_RETURN_IF_ERROR(Get(l, "bucket_bytes", path, "limits.", s.bucket_bytes));
    REFIT_RETURN_IF_ERROR(Get(l, "bucket_slots", path, "limits.", s.bucket_slots));
    REFIT_RETURN_IF_ERROR(Get(l, "staging_bytes", path, "limits.", s.staging_bytes));
    REFIT_RETURN_IF_ERROR(Get(l, "max_tensors", path, "limits.", s.max_tensors));
    REFIT_RETURN_IF_ERROR(Get(l, "max_name_bytes", path, "limits.", s.max_name_bytes));
    REFIT_RETURN_IF_ERROR(Get(l, "session_deadline_ms", path, "limits.", s.deadline_ms));
    REFIT_RETURN_IF_ERROR(Get(l, "max_message_words", path, "limits.", c.max_message_words));
    REFIT_RETURN_IF_ERROR(Get(l, "max_connections", path, "limits.", c.max_connections));
    REFIT_RETURN_IF_ERROR(Get(l, "max_connections_per_uid", path, "limits.", c.max_connections_per_uid));
    REFIT_RETURN_IF_ERROR(Get(l, "connection_buffer_bytes", path, "limits.", c.connection_buffer_bytes));
    REFIT_RETURN_IF_ERROR(Get(l, "buffered_message_bytes", path, "limits.", c.buffered_message_bytes));
    REFIT_RETURN_IF_ERROR(Get(l, "idle_timeout_ms", path, "limits.", c.idle_timeout_ms));
    if (c.max_connections < 2 || c.max_connections > 1000000) {
      return Err(l, path, "limits.max_connections", "must be 2 .. 1000000");
    }
    if (c.max_connections_per_uid < 2 || c.max_connections_per_uid > c.max_connections) {
      return Err(l, path, "limits.max_connections_per_uid", "must be 2 .. limits.max_connections");
    }
    if (c.connection_buffer_bytes < 65536 || c.connection_buffer_bytes > (64ull << 30)) {
      return Err(l, path, "limits.connection_buffer_bytes", "must be 64 KiB .. 64 GiB");
    }
    if (c.buffered_message_bytes < c.connection_buffer_bytes || c.buffered_message_bytes > (1ull << 40)) {
      return Err(l, path, "limits.buffered_message_bytes", "must be limits.connection_buffer_bytes .. 1 TiB");
    }
    if (c.idle_timeout_ms < 100 || c.idle_timeout_ms > 86400000) {
      return Err(l, path, "limits.idle_timeout_ms", "must be 100 .. 86400000 (1 day)");
    }
    if (s.bucket_slots < 1 || s.bucket_slots > 64) return Err(l, path, "limits.bucket_slots", "must be 1..64");
    if (s.staging_bytes < 1) return Err(l, path, "limits.staging_bytes", "must be at least 1");
    if (s.max_tensors < 1) return Err(l, path, "limits.max_tensors", "must be at least 1");
    if (s.max_name_bytes < 1 || s.max_name_bytes > 65536) return Err(l, path, "limits.max_name_bytes", "must be 1..65536");
    if (s.deadline_ms < 1) return Err(l, path, "limits.session_deadline_ms", "must be at least 1");
    if (c.max_message_words < 1024 || c.max_message_words > (1ull << 32)) {
      return Err(l, path, "limits.max_message_words", "must be 1024 .. 2^32");
    }
    if (s.bucket_bytes < 4096 || s.bucket_bytes > (16ull << 30)) {
      return Err(l, path, "limits.bucket_bytes", "must be 4 KiB .. 16 GiB");
    }
  }
  if (const YAML::Node a = root["admin"]) {
    REFIT_RETURN_IF_ERROR(CheckKeys(a, path, "admin", {"listen", "token_file", "max_connections"}));
    REFIT_RETURN_IF_ERROR(Get(a, "listen", path, "admin.", c.admin_listen));
    REFIT_RETURN_IF_ERROR(Get(a, "token_file", path, "admin.", c.admin_token_file));
    REFIT_RETURN_IF_ERROR(Get(a, "max_connections", path, "admin.", c.admin_max_connections));
    if (c.admin_max_connections < 1 || c.admin_max_connections > 100000) {
      return Err(a, path, "admin.max_connections", "must be 1 .. 100000");
    }
  }
  if (c.model_spec.empty()) c.model_spec_inline = spec::kDemoModelSpec;
  return c;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& setting) {
  // The first line, read bounded: a token is short, the file may not be (a device, a mistake).
  absl::StatusOr<std::string> text = ReadBoundedFile(path, 64 << 10, setting);
  if (!text.ok()) return text.status();
  std::string token = text->substr(0, text->find('\n'));
  if (token.size() > 4096) return absl::InvalidArgumentError(absl::StrCat(setting, ": the token's line is over 4096 bytes"));
  if (!token.empty() && token.back() == '\r') token.pop_back();
  if (token.size() < 16) return absl::InvalidArgumentError(absl::StrCat(setting, ": the token must be at least 16 bytes"));
  return token;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path, const transport::TransportRegistry& transports) {
  absl::StatusOr<std::string> text = ReadBoundedFile(path, kMaxConfigFileBytes, "config");
  if (!text.ok()) return text.status();
  return ParseConfig(*text, path, transports);
}

}  // namespace refit::server
