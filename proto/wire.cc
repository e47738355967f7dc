#include "proto/wire.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace refit::wire {

absl::StatusOr<TensorDesc> FromWire(proto::TensorDesc::Reader r) {
  TensorDesc d;
  d.name = std::string(r.getName().cStr(), r.getName().size());
  std::string dtype(r.getDtype().cStr(), r.getDtype().size());
  absl::StatusOr<DType> t = ParseDType(dtype);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", d.name, "': ", t.status().message()));
  d.dtype = *t;
  for (int64_t v : r.getShape()) d.shape.push_back(v);
  d.offset = r.getOffset();
  d.nbytes = r.getNbytes();
  if (r.getSliceDim() >= 0) {
    d.slice.dim = r.getSliceDim();
    d.slice.start = r.getSliceStart();
    for (int64_t v : r.getFullShape()) d.slice.full_shape.push_back(v);
  }
  if (r.getHasAmax()) d.amax = r.getAmax();
  return d;
}

absl::StatusOr<Manifest> FromWire(proto::Manifest::Reader r) {
  Manifest m;
  m.model = Str(r.getModel());
  m.partial = r.getPartial();
  m.deadline_ms = r.getDeadlineMs();
  m.tag = Str(r.getTag());
  m.stage_only = r.getStageOnly();
  const std::string wire_format = Str(r.getWireFormat());
  if (wire_format == "checkpoint") {
    m.wire_format = WireFormat::kCheckpoint;
  } else if (!wire_format.empty() && wire_format != "bf16") {
    std::string shown = wire_format.substr(0, 64);
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
    }
    return absl::InvalidArgumentError(
        absl::StrCat("manifest wireFormat '", shown, "': expected bf16 or checkpoint"));
  }
  for (auto t : r.getTensors()) {
    absl::StatusOr<TensorDesc> d = FromWire(t);
    if (!d.ok()) return d.status();
    m.tensors.push_back(std::move(*d));
  }
  return m;
}

absl::StatusOr<BucketHeader> FromWire(proto::BucketHeader::Reader r) {
  BucketHeader h;
  h.seq = r.getSeq();
  h.nbytes = r.getNbytes();
  h.checksum = r.getChecksum();
  h.checksum_kind =
      r.getChecksumKind() == proto::ChecksumKind::PARALLEL64 ? ChecksumKind::kParallel64 : ChecksumKind::kChecksum64;
  for (auto t : r.getTensors()) {
    absl::StatusOr<TensorDesc> d = FromWire(t);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("bucket ", h.seq, ": ", d.status().message()));
    h.tensors.push_back(std::move(*d));
  }
  return h;
}

absl::StatusOr<WirePlan> FromWire(proto::WirePlan::Reader r) {
  WirePlan p;
  p.fp32_input = Str(r.getFp32Input());
  p.nonfinite = Str(r.getNonfinite());
  p.tensors.reserve(r.getTensors().size());
  for (auto t : r.getTensors()) {
    WireTensor w;
    w.tensor = t.getTensor();
    w.name = Str(t.getName());
    w.format = Str(t.getFormat());
    w.transpose = t.getTranspose();
    for (auto m : t.getAmaxGroup()) w.amax_group.push_back(Str(m));
    for (auto o : t.getOutputs()) {
      absl::StatusOr<DType> dtype = ParseDType(Str(o.getDtype()));
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("wire plan: tensor '", w.name, "': ", dtype.status().message()));
      }
      WireOutput out{Str(o.getSuffix()), *dtype, {}};
      for (int64_t v : o.getShape()) out.shape.push_back(v);
      w.outputs.push_back(std::move(out));
    }
    p.tensors.push_back(std::move(w));
  }
  return p;
}

Outcome OutcomeFromWire(proto::Outcome o) {
  auto v = static_cast<uint16_t>(o);
  return v <= static_cast<uint16_t>(Outcome::kStaged) ? static_cast<Outcome>(v) : Outcome::kFailed;
}

EndCause CauseFromWire(proto::EndCause c) {
  auto v = static_cast<uint16_t>(c);
  return v <= static_cast<uint16_t>(EndCause::kEngineDirty) ? static_cast<EndCause>(v) : EndCause::kInternal;
}

absl::Status FromWire(proto::Status::Reader r) {
  auto code = static_cast<uint16_t>(r.getCode());
  if (code == 0) return absl::OkStatus();
  // A code this build does not know (a newer daemon) is still an error.
  absl::StatusCode c = code <= static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)
                           ? static_cast<absl::StatusCode>(code)
                           : absl::StatusCode::kUnknown;
  // A cause this build does not know (a newer daemon) says nothing more than the code.
  const auto cause = static_cast<uint16_t>(r.getCause());
  return WithCause(absl::Status(c, Str(r.getMessage())),
                   cause <= static_cast<uint16_t>(EndCause::kEngineDirty) ? static_cast<EndCause>(cause) : EndCause::kNone);
}

void ToWire(const absl::Status& status, proto::Status::Builder b) {
  auto code = static_cast<uint16_t>(status.code());
  if (code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) code = static_cast<uint16_t>(absl::StatusCode::kUnknown);
  b.setCode(static_cast<proto::StatusCode>(code));
  const std::string message(status.message());
  b.setMessage(Text(message));
  b.setCause(static_cast<proto::EndCause>(static_cast<uint16_t>(CauseOf(status))));
}

RefitReport FromWire(proto::RefitReport::Reader r) {
  RefitReport o;
  o.session_id = r.getSessionId();
  o.version = r.getVersion();
  o.tag = Str(r.getTag());
  o.outcome = OutcomeFromWire(r.getOutcomeCode());
  o.cause = CauseFromWire(r.getCause());
  o.reason = Str(r.getReason());
  o.bytes_in = r.getBytesIn();
  o.bytes_out = r.getBytesOut();
  o.buckets = r.getBuckets();
  o.tensors = r.getTensors();
  auto t = r.getTimes();
  o.times = {t.getReceiveMs(), t.getConvertMs(), t.getValidateMs(), t.getCommitMs(), t.getPauseMs(), t.getTotalMs(),
             t.getPlanMs(), t.getFinishMs(), t.getPrepareMs()};
  for (auto f : r.getBytesByFormat()) o.bytes_out_by_format[f.getFormat().cStr()] = f.getBytes();
  o.fused_held_peak_bytes = r.getFusedHeldPeakBytes();
  o.bytes_in_place = r.getBytesInPlace();
  return o;
}

void ToWire(const TensorDesc& d, proto::TensorDesc::Builder b) {
  b.setName(Text(d.name));
  b.setDtype(std::string(DTypeName(d.dtype)));
  auto shape = b.initShape(static_cast<unsigned>(d.shape.size()));
  for (size_t i = 0; i < d.shape.size(); ++i) shape.set(static_cast<unsigned>(i), d.shape[i]);
  b.setOffset(d.offset);
  b.setNbytes(d.nbytes);
  if (d.slice.present()) {
    b.setSliceDim(d.slice.dim);
    b.setSliceStart(d.slice.start);
    auto full = b.initFullShape(static_cast<unsigned>(d.slice.full_shape.size()));
    for (size_t i = 0; i < d.slice.full_shape.size(); ++i) full.set(static_cast<unsigned>(i), d.slice.full_shape[i]);
  }
  if (d.amax) {
    b.setHasAmax(true);
    b.setAmax(*d.amax);
  }
}

void ToWire(const Manifest& m, proto::Manifest::Builder b, bool with_tensors) {
  b.setModel(Text(m.model));
  b.setPartial(m.partial);
  b.setDeadlineMs(m.deadline_ms);
  b.setTag(Text(m.tag));
  b.setStageOnly(m.stage_only);
  if (m.wire_format != WireFormat::kBf16) b.setWireFormat(WireFormatName(m.wire_format));
  if (!with_tensors) return;
  auto list = b.initTensors(static_cast<unsigned>(m.tensors.size()));
  for (size_t i = 0; i < m.tensors.size(); ++i) ToWire(m.tensors[i], list[static_cast<unsigned>(i)]);
}

void ToWire(const BucketHeader& h, proto::BucketHeader::Builder b) {
  b.setSeq(h.seq);
  b.setNbytes(h.nbytes);
  b.setChecksum(h.checksum);
  b.setChecksumKind(h.checksum_kind == ChecksumKind::kParallel64 ? proto::ChecksumKind::PARALLEL64
                                                                 : proto::ChecksumKind::CHECKSUM64);
  auto list = b.initTensors(static_cast<unsigned>(h.tensors.size()));
  for (size_t i = 0; i < h.tensors.size(); ++i) ToWire(h.tensors[i], list[static_cast<unsigned>(i)]);
}

void ToWire(const WirePlan& p, proto::WirePlan::Builder b) {
  b.setFp32Input(Text(p.fp32_input));
  b.setNonfinite(Text(p.nonfinite));
  auto list = b.initTensors(static_cast<unsigned>(p.tensors.size()));
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const WireTensor& w = p.tensors[i];
    auto t = list[static_cast<unsigned>(i)];
    t.setTensor(w.tensor);
    t.setName(Text(w.name));
    t.setFormat(Text(w.format));
    t.setTranspose(w.transpose);
    auto group = t.initAmaxGroup(static_cast<unsigned>(w.amax_group.size()));
    for (size_t j = 0; j < w.amax_group.size(); ++j) group.set(static_cast<unsigned>(j), Text(w.amax_group[j]));
    auto outs = t.initOutputs(static_cast<unsigned>(w.outputs.size()));
    for (size_t j = 0; j < w.outputs.size(); ++j) {
      auto o = outs[static_cast<unsigned>(j)];
      o.setSuffix(Text(w.outputs[j].suffix));
      o.setDtype(std::string(DTypeName(w.outputs[j].dtype)));
      auto shape = o.initShape(static_cast<unsigned>(w.outputs[j].shape.size()));
      for (size_t k = 0; k < w.outputs[j].shape.size(); ++k) shape.set(static_cast<unsigned>(k), w.outputs[j].shape[k]);
    }
  }
}

void ToWire(const RefitReport& r, proto::RefitReport::Builder b) {
  b.setSessionId(r.session_id);
  b.setVersion(r.version);
  b.setTag(Text(r.tag));
  b.setOutcome(std::string(OutcomeName(r.outcome)));
  b.setOutcomeCode(static_cast<proto::Outcome>(static_cast<uint16_t>(r.outcome)));
  b.setCause(static_cast<proto::EndCause>(static_cast<uint16_t>(r.cause)));
  b.setReason(Text(r.reason));
  b.setBytesIn(r.bytes_in);
  b.setBytesOut(r.bytes_out);
  b.setBuckets(r.buckets);
  b.setTensors(r.tensors);
  b.setFusedHeldPeakBytes(r.fused_held_peak_bytes);
  b.setBytesInPlace(r.bytes_in_place);
  auto t = b.initTimes();
  t.setReceiveMs(r.times.receive_ms);
  t.setConvertMs(r.times.convert_ms);
  t.setValidateMs(r.times.validate_ms);
  t.setCommitMs(r.times.commit_ms);
  t.setPauseMs(r.times.pause_ms);
  t.setTotalMs(r.times.total_ms);
  t.setPlanMs(r.times.plan_ms);
  t.setFinishMs(r.times.finish_ms);
  t.setPrepareMs(r.times.prepare_ms);
  auto formats = b.initBytesByFormat(static_cast<unsigned>(r.bytes_out_by_format.size()));
  unsigned i = 0;
  for (const auto& [format, bytes] : r.bytes_out_by_format) {
    formats[i].setFormat(Text(format));
    formats[i].setBytes(bytes);
    ++i;
  }
}

}  // namespace refit::wire
