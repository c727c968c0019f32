// The collective algorithms: broadcast, allreduce (direct and ring), allgather and
// barrier, as bodies of CollectiveRunner calls (see collective_algorithms.h).

#include "process_group/collective_algorithms.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>

#include <algorithm>
#include <vector>

#include "process_group/group_checks.h"

namespace drpc {
namespace {

// acc = acc (op) other, elementwise, in place.
void reduce_into(at::Tensor& acc, const at::Tensor& other, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      acc.add_(other);
      return;
    case ReduceOp::kProduct:
      acc.mul_(other);
      return;
    case ReduceOp::kMin:
      at::minimum_out(acc, acc, other);
      return;
    case ReduceOp::kMax:
      at::maximum_out(acc, acc, other);
      return;
  }
}

void finish_average(at::Tensor& t, int world_size) {
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
    t.div_(world_size);
  } else {
    t.div_(world_size, "trunc");
  }
}

// A received frame's first tensor as a read-only tensor over the frame's bytes, copying
// only when the bytes arrived in several fragments.
at::Tensor view_body(const Frame& frame, const at::Tensor& like, at::Tensor& scratch) {
  const int64_t numel = like.numel();
  if (frame.body.size() == 1) {
    return at::from_blob(const_cast<uint8_t*>(frame.body[0].data), {numel}, like.options());
  }
  if (scratch.numel() < numel || scratch.scalar_type() != like.scalar_type()) {
    scratch = at::empty({numel}, like.options());
  }
  at::Tensor out = scratch.narrow(0, 0, numel);
  frame.copy_body(0, out.data_ptr(), out.nbytes());
  return out;
}

// One round: every rank sends its tensor to every other, then all reduce the n tensors
// in rank order, so the result is bitwise the same everywhere.
void allreduce_direct(CollectiveCall& call, at::Tensor& work, ReduceOp op) {
  const int rank = call.rank();
  const int size = call.size();
  for (int peer : call.peers_from(rank + 1)) call.send(peer, work);
  std::vector<Frame> frames(size);
  for (int peer : call.peers_from(rank + 1)) frames[peer] = call.recv(peer);
  at::Tensor acc;
  at::Tensor scratch;
  for (int r = 0; r < size; ++r) {
    at::Tensor value = r == rank ? work.view(-1) : view_body(frames[r], work, scratch);
    if (!acc.defined()) {
      acc = value.clone();
    } else {
      reduce_into(acc, value, op);
    }
  }
  call.flush();  // peers may still be reading `work`
  work.view(-1).copy_(acc);
}

// Reduce-scatter then allgather around the ring, each segment moved in chunks. Each
// segment is reduced by one rank and copied to the others, so all ranks end bitwise equal.
void allreduce_ring(CollectiveCall& call, int64_t chunk_bytes, at::Tensor& work, ReduceOp op) {
  const int rank = call.rank();
  const int size = call.size();
  at::Tensor flat = work.view(-1);
  const int64_t numel = flat.numel();
  const int64_t chunk_elems = std::max<int64_t>(1, chunk_bytes / static_cast<int64_t>(flat.element_size()));
  auto segment = [&](int index) {
    const int i = ((index % size) + size) % size;
    const int64_t begin = numel * i / size;
    const int64_t end = numel * (i + 1) / size;
    return flat.narrow(0, begin, end - begin);
  };
  auto chunks_of = [&](const at::Tensor& seg) { return (seg.numel() + chunk_elems - 1) / chunk_elems; };
  auto chunk = [&](const at::Tensor& seg, int64_t c) {
    const int64_t begin = c * chunk_elems;
    return seg.narrow(0, begin, std::min(chunk_elems, seg.numel() - begin));
  };
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  // The allgather's chunks may land straight where they belong, from now on: each is the
  // fully reduced segment, which exists only after this rank's every read and write of that
  // segment in the reduce-scatter has reached its neighbours (see place()'s contract).
  uint32_t nth = 0;
  for (int step = 0; step < size - 1; ++step) nth += static_cast<uint32_t>(chunks_of(segment(rank - step - 1)));
  for (int step = 0; step < size - 1; ++step) {
    const at::Tensor in_seg = segment(rank - step);
    for (int64_t c = 0; c < chunks_of(in_seg); ++c) call.place(prev, nth++, chunk(in_seg, c));
  }
  at::Tensor scratch;
  for (int phase = 0; phase < 2; ++phase) {
    // The allgather overwrites segments that the reduce-scatter sent.
    if (phase == 1) call.flush();
    for (int step = 0; step < size - 1; ++step) {
      // Reduce-scatter: send seg r-s, reduce into seg r-s-1. Allgather: send seg r+1-s,
      // overwrite seg r-s with the fully reduced copy.
      at::Tensor out_seg = phase == 0 ? segment(rank - step) : segment(rank + 1 - step);
      at::Tensor in_seg = phase == 0 ? segment(rank - step - 1) : segment(rank - step);
      const int64_t n_out = chunks_of(out_seg);
      const int64_t n_in = chunks_of(in_seg);
      for (int64_t c = 0; c < std::max(n_out, n_in); ++c) {
        if (c < n_out) call.send(next, chunk(out_seg, c));
        if (c < n_in) {
          at::Tensor dst = chunk(in_seg, c);
          Frame frame = call.recv(prev);
          if (frame.body_size() != dst.nbytes()) {
            throw Error(ErrorKind::kMismatch,
                        call.what() + ": rank " + std::to_string(prev) + " sent a ring chunk of a different size");
          }
          if (phase == 0) {
            reduce_into(dst, view_body(frame, dst, scratch), op);
          } else {
            frame.copy_body(0, dst.data_ptr(), dst.nbytes());  // nothing to copy if it was placed
          }
        }
      }
    }
  }
  call.flush();  // the caller may change `work` (AVG divides it) once this returns
}

}  // namespace

WorkPtr run_broadcast(CollectiveRunner& runner, at::Tensor tensor, int root) {
  check_dense_cpu(tensor, "broadcast");
  check_rank(root, runner.size(), "broadcast root");
  Descriptor desc{kBroadcast, 0, root, meta_of(tensor)};
  return runner.enqueue(desc, [tensor, root](CollectiveCall& call) mutable -> std::vector<at::Tensor> {
    at::Tensor work = tensor.contiguous();
    if (call.rank() == root) {
      for (int peer : call.peers_from(call.rank() + 1)) call.send(peer, work);
      // The acknowledgements carry each receiver's descriptor: without them a root would
      // never learn that a receiver disagreed on shape or dtype.
      for (int peer : call.peers_from(call.rank() + 1)) call.recv(peer);
    } else {
      if (work.nbytes() > 0) call.place(root, 0, work);
      Frame frame = call.recv(root);
      frame.copy_body(0, work.data_ptr(), work.nbytes());
      if (!work.is_same(tensor)) tensor.copy_(work);
      call.send(root, at::Tensor());
    }
    return {};
  });
}

WorkPtr run_allreduce(CollectiveRunner& runner, const AllreduceTuning& tuning, at::Tensor tensor, ReduceOp op) {
  check_dense_cpu(tensor, "allreduce");
  if (op == ReduceOp::kAvg && tensor.scalar_type() == at::kBool) {
    throw Error(ErrorKind::kBadArgument, "allreduce: AVG is not defined for bool tensors");
  }
  Descriptor desc{kAllreduce, static_cast<int32_t>(op), -1, meta_of(tensor)};
  return runner.enqueue(desc, [tuning, tensor, op](CollectiveCall& call) mutable -> std::vector<at::Tensor> {
    const int size = call.size();
    at::Tensor work = tensor.contiguous();
    if (size > 1 && work.numel() > 0) {
      if (static_cast<int64_t>(work.nbytes()) <= tuning.ring_threshold_bytes || work.numel() < size) {
        allreduce_direct(call, work, op);
      } else {
        allreduce_ring(call, tuning.chunk_bytes, work, op);
      }
    }
    if (op == ReduceOp::kAvg) finish_average(work, size);
    if (!work.is_same(tensor)) tensor.copy_(work);
    return {};
  });
}

WorkPtr run_allgather(CollectiveRunner& runner, const at::Tensor& input) {
  check_dense_cpu(input, "allgather");
  Descriptor desc{kAllgather, 0, -1, meta_of(input)};
  return runner.enqueue(desc, [input](CollectiveCall& call) -> std::vector<at::Tensor> {
    at::Tensor work = input.contiguous();
    std::vector<at::Tensor> out(call.size());
    out[call.rank()] = work.clone();
    for (int peer : call.peers_from(call.rank() + 1)) {
      out[peer] = at::empty(work.sizes(), work.options());
      if (work.nbytes() > 0) call.place(peer, 0, out[peer]);
    }
    for (int peer : call.peers_from(call.rank() + 1)) call.send(peer, work);
    for (int peer : call.peers_from(call.rank() + 1)) {
      Frame frame = call.recv(peer);
      frame.copy_body(0, out[peer].data_ptr(), out[peer].nbytes());
    }
    return out;
  });
}

WorkPtr run_barrier(CollectiveRunner& runner) {
  Descriptor desc{kBarrier, 0, -1, pg::TensorMeta()};
  return runner.enqueue(desc, [](CollectiveCall& call) -> std::vector<at::Tensor> {
    for (int peer : call.peers_from(call.rank() + 1)) call.send(peer, at::Tensor());
    for (int peer : call.peers_from(call.rank() + 1)) call.recv(peer);
    return {};
  });
}

}  // namespace drpc
