// Conversions between ferry.v1 messages and ferry's own types, one copy for the daemon
// (server/rpc) and libferry (client/src): DType, Status <-> Error, session counters. Built
// into ferry_proto; not installed (only server/rpc and client/src include it).
#pragma once

#include <cstdint>
#include <string>

#include "ferry/dtype.h"
#include "ferry/status.h"
#include "ferry/v1/session.pb.h"

namespace ferry::wire {

v1::DType ToProto(DType d);
/// DType::kInvalid for a value this build does not know.
DType FromProto(v1::DType d);

void ToProto(const Status& status, v1::Error* out);
/// A kind or code this build does not know keeps its number visible (Status::FromWire).
Status FromProto(const v1::Error& e);

/// Decode a bare ErrorKind number (the slab socket's answers carry no code): the code is the
/// kind's canonical one (INTERNAL's for a kind this build does not know, whose number stays
/// in the message: Status::FromWire).
Status FromWireKind(uint32_t kind, std::string message);

/// Session counters: the daemon's SessionStatsSnapshot and libferry's SessionStats have the
/// same fields, but for the ones libferry counts itself (staged_upload_bytes,
/// staged_download_bytes); this is the one list of the daemon's.
template <typename Stats>
void StatsToProto(const Stats& s, v1::SessionStats* out) {
  out->set_submits(s.submits);
  out->set_failed_submits(s.failed_submits);
  out->set_ops(s.ops);
  out->set_kernel_launches(s.kernel_launches);
  out->set_bytes_uploaded(s.bytes_uploaded);
  out->set_bytes_downloaded(s.bytes_downloaded);
  out->set_tensors_created(s.tensors_created);
  out->set_peak_device_bytes(s.peak_device_bytes);
  out->set_device_busy_ns(s.device_busy_ns);
  out->set_graph_launches(s.graph_launches);
  out->set_kernel_batches(s.kernel_batches);
  out->set_h2d_bytes(s.h2d_bytes);
  out->set_h2d_ns(s.h2d_ns);
  out->set_d2h_bytes(s.d2h_bytes);
  out->set_d2h_ns(s.d2h_ns);
}

template <typename Stats>
Stats StatsFromProto(const v1::SessionStats& s) {
  Stats out;
  out.submits = s.submits();
  out.failed_submits = s.failed_submits();
  out.ops = s.ops();
  out.kernel_launches = s.kernel_launches();
  out.bytes_uploaded = s.bytes_uploaded();
  out.bytes_downloaded = s.bytes_downloaded();
  out.tensors_created = s.tensors_created();
  out.peak_device_bytes = s.peak_device_bytes();
  out.device_busy_ns = s.device_busy_ns();
  out.graph_launches = s.graph_launches();
  out.kernel_batches = s.kernel_batches();
  out.h2d_bytes = s.h2d_bytes();
  out.h2d_ns = s.h2d_ns();
  out.d2h_bytes = s.d2h_bytes();
  out.d2h_ns = s.d2h_ns();
  return out;
}

}  // namespace ferry::wire
