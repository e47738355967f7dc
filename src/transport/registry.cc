#include "transport/registry.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace refit::transport {

absl::Status TransportRegistry::Add(TransportDescriptor d) {
  if (d.name.empty() || d.scheme.empty()) return absl::InvalidArgumentError("transport without a name or scheme");
  if (!d.listen || !d.connect || !d.bucket_memory) {
    return absl::InvalidArgumentError(absl::StrCat("transport '", d.name, "': listen, connect and bucket_memory are required"));
  }
  if (d.payload_memory != storage::MemoryKind::kHost && !d.checks_integrity) {
    // The trainer client checksums bucket bytes on the host; device payloads have no such check.
    return absl::InvalidArgumentError(
        absl::StrCat("transport '", d.name, "': payloads outside host memory need checks_integrity"));
  }
  for (const TransportDescriptor& o : descriptors_) {
    if (o.name == d.name) return absl::InvalidArgumentError(absl::StrCat("transport '", d.name, "' registered twice"));
    if (o.Owns(d.scheme) || d.Owns(o.scheme)) {
      return absl::InvalidArgumentError(
          absl::StrCat("transports '", o.name, "' and '", d.name, "' claim overlapping endpoint schemes"));
    }
  }
  descriptors_.push_back(std::move(d));
  return absl::OkStatus();
}

const TransportDescriptor* TransportRegistry::Find(std::string_view name) const {
  for (const TransportDescriptor& d : descriptors_) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

const TransportDescriptor* TransportRegistry::FindByEndpoint(std::string_view endpoint) const {
  for (const TransportDescriptor& d : descriptors_) {
    if (d.Owns(endpoint)) return &d;
  }
  return nullptr;
}

std::string TransportRegistry::Names() const {
  std::string out;
  for (const TransportDescriptor& d : descriptors_) absl::StrAppend(&out, out.empty() ? "" : ", ", d.name);
  return out;
}

std::vector<std::string> TransportRegistry::ConfigKeys() const {
  std::vector<std::string> out;
  for (const TransportDescriptor& d : descriptors_) {
    for (const ConfigKey& k : d.config_keys) out.push_back(k.name);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GroupSender>> ConnectGroup(const TransportDescriptor& d,
                                                          const std::vector<std::string>& endpoints,
                                                          const ConnectConfig& config) {
  if (d.connect_group) return d.connect_group(endpoints, config);
  std::vector<std::unique_ptr<Sender>> senders;
  for (const std::string& e : endpoints) {
    absl::StatusOr<std::unique_ptr<Sender>> s = d.connect(e, config);
    if (!s.ok()) return s.status();
    senders.push_back(std::move(*s));
  }
  return std::unique_ptr<GroupSender>(std::make_unique<SequentialGroupSender>(std::move(senders)));
}

}  // namespace refit::transport
