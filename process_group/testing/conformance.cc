#include "process_group/testing/conformance.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

namespace drpc {
namespace testing {
namespace {

const std::vector<at::ScalarType> kAllDtypes = {
    at::kHalf, at::kBFloat16, at::kFloat, at::kDouble, at::kChar,
    at::kShort, at::kInt,     at::kLong,  at::kByte,   at::kBool};
const std::vector<ReduceOp> kAllOps = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                                       ReduceOp::kMax, ReduceOp::kAvg};

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// Installs a case's listener for the case's duration. When the case ends, even by an
// error, it removes it (it points into the case's stack) and waits until every rank has,
// so no message of the next case reaches this one's listener.
class ListenerScope {
 public:
  ListenerScope(ProcessGroup& group, MessagePort& port, MessageListener listener) : group_(group), port_(port) {
    port_.set_message_listener(std::move(listener));
  }
  ~ListenerScope() {
    port_.set_message_listener(MessageListener{});
    try {
      group_.barrier()->wait();
    } catch (const std::exception&) {
      // The case failed already; its error is the one to report.
    }
  }
  ListenerScope(const ListenerScope&) = delete;
  ListenerScope& operator=(const ListenerScope&) = delete;

 private:
  ProcessGroup& group_;
  MessagePort& port_;
};

std::string describe(const at::Tensor& t) {
  std::string out = std::string(c10::toString(t.scalar_type())) + "[";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? "," : "") + std::to_string(t.size(i));
  return out + "]";
}

// Small integers in every dtype, different per rank, so sums and products stay exact even
// in half precision and int8.
at::Tensor rank_values(int rank, int64_t numel, at::ScalarType dtype) {
  at::Tensor base = at::arange(numel, at::kLong);
  if (dtype == at::kBool) return ((base + rank) % 2).eq(0);
  return ((base + rank * 7) % 3 + 1).to(dtype);
}

void require_equal(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  require(actual.scalar_type() == expected.scalar_type() && actual.sizes() == expected.sizes(),
          what + ": got " + describe(actual) + ", expected " + describe(expected));
  bool same;
  if (at::isFloatingType(actual.scalar_type())) {
    same = at::allclose(actual.to(at::kDouble), expected.to(at::kDouble), 1e-3, 1e-3);
  } else {
    same = at::equal(actual, expected);
  }
  if (!same) {
    at::Tensor diff = actual.ne(expected).nonzero();
    const int64_t first = diff.numel() ? diff[0][0].item<int64_t>() : -1;
    std::string detail;
    if (first >= 0 && actual.dim() == 1) {
      detail = " (first difference at " + std::to_string(first) + ": " +
               std::to_string(actual[first].to(at::kDouble).item<double>()) + " vs " +
               std::to_string(expected[first].to(at::kDouble).item<double>()) + ")";
    }
    throw std::runtime_error(what + ": wrong values" + detail);
  }
}

at::Tensor reference_allreduce(int world, int64_t numel, at::ScalarType dtype, ReduceOp op) {
  at::Tensor acc = rank_values(0, numel, dtype);
  for (int r = 1; r < world; ++r) {
    at::Tensor v = rank_values(r, numel, dtype);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc = acc.add(v); break;
      case ReduceOp::kProduct: acc = acc.mul(v); break;
      case ReduceOp::kMin: acc = at::minimum(acc, v); break;
      case ReduceOp::kMax: acc = at::maximum(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) {
    acc = at::isFloatingType(dtype) ? acc.div(world) : acc.div(world, "trunc");
  }
  return acc;
}

void allreduce_matrix(ProcessGroup& g, const std::vector<int64_t>& sizes,
                      const std::vector<at::ScalarType>& dtypes, const std::vector<ReduceOp>& ops) {
  for (at::ScalarType dtype : dtypes) {
    for (ReduceOp op : ops) {
      if (dtype == at::kBool && op == ReduceOp::kAvg) continue;
      for (int64_t numel : sizes) {
        at::Tensor t = rank_values(g.rank(), numel, dtype);
        g.allreduce(t, op)->wait();
        require_equal(t, reference_allreduce(g.size(), numel, dtype, op),
                      std::string("allreduce ") + reduce_op_name(op) + " of " + describe(t));
      }
    }
  }
}

// Every rank's tensor, gathered, must be bitwise equal to rank 0's.
void require_same_everywhere(ProcessGroup& g, const at::Tensor& t, const std::string& what) {
  auto work = g.allgather(t);
  work->wait();
  for (const auto& other : work->result()) {
    require(at::equal(other, work->result()[0]), what + ": ranks hold different bits");
  }
}

std::vector<ConformanceCase> make_cases(int64_t large_bytes) {
  std::vector<ConformanceCase> cases;
  cases.push_back({"allreduce_every_dtype_and_op_small_sizes", 1, [](ProcessGroup& g, MessagePort&) {
                     allreduce_matrix(g, {0, 1, 7, 1000}, kAllDtypes, kAllOps);
                   }});
  cases.push_back({"allreduce_several_mib", 1, [large_bytes](ProcessGroup& g, MessagePort&) {
                     const int64_t odd = large_bytes / 4 + 3;  // not a multiple of any world size
                     allreduce_matrix(g, {odd}, {at::kFloat}, {ReduceOp::kSum, ReduceOp::kAvg});
                     allreduce_matrix(g, {large_bytes / 8 + 1}, {at::kLong, at::kDouble},
                                      {ReduceOp::kMax, ReduceOp::kProduct});
                     allreduce_matrix(g, {large_bytes / 2 + 5}, {at::kHalf}, {ReduceOp::kMin});
                     allreduce_matrix(g, {large_bytes + 1}, {at::kByte, at::kBool}, {ReduceOp::kSum});
                   }});
  cases.push_back({"allreduce_random_floats_bitwise_identical_on_all_ranks", 1,
                   [large_bytes](ProcessGroup& g, MessagePort&) {
                     for (int64_t numel : {int64_t{33}, large_bytes / 4}) {
                       // Ranks may be threads of one process: no global generator.
                       auto values = [numel](int rank) {
                         return at::randn({numel}, at::detail::createCPUGenerator(1000 + rank));
                       };
                       at::Tensor t = values(g.rank());
                       at::Tensor expected = at::zeros({numel});
                       for (int r = 0; r < g.size(); ++r) expected += values(r);
                       g.allreduce(t, ReduceOp::kSum)->wait();
                       require(at::allclose(t, expected, 1e-4, 1e-4), "random allreduce: wrong sum");
                       require_same_everywhere(g, t, "random allreduce of " + describe(t));
                     }
                   }});
  cases.push_back({"allreduce_non_contiguous_and_views", 1, [](ProcessGroup& g, MessagePort&) {
                     at::Tensor base = rank_values(g.rank(), 15, at::kFloat).reshape({5, 3});
                     at::Tensor transposed = base.t();  // non-contiguous view of `base`
                     g.allreduce(transposed, ReduceOp::kSum)->wait();
                     at::Tensor expected = reference_allreduce(g.size(), 15, at::kFloat, ReduceOp::kSum);
                     require_equal(base.reshape(-1), expected, "allreduce of a transposed view");
                     at::Tensor big = at::zeros({20}, at::kLong);
                     at::Tensor slice = big.narrow(0, 5, 7);
                     slice.copy_(rank_values(g.rank(), 7, at::kLong));
                     g.allreduce(slice, ReduceOp::kMax)->wait();
                     require_equal(slice, reference_allreduce(g.size(), 7, at::kLong, ReduceOp::kMax),
                                   "allreduce of a narrowed view");
                     require(big.narrow(0, 0, 5).eq(0).all().item<bool>() &&
                                 big.narrow(0, 12, 8).eq(0).all().item<bool>(),
                             "allreduce of a view wrote outside the view");
                   }});
  cases.push_back({"broadcast_from_every_root", 1, [large_bytes](ProcessGroup& g, MessagePort&) {
                     for (int root = 0; root < g.size(); ++root) {
                       for (at::ScalarType dtype : {at::kFloat, at::kLong, at::kBool, at::kHalf}) {
                         for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, large_bytes / 8}) {
                           at::Tensor t = g.rank() == root ? rank_values(root, numel, dtype)
                                                           : at::zeros({numel}, dtype);
                           g.broadcast(t, root)->wait();
                           require_equal(t, rank_values(root, numel, dtype),
                                         "broadcast of " + describe(t) + " from root " + std::to_string(root));
                         }
                       }
                       at::Tensor base = at::zeros({4, 6});
                       if (g.rank() == root) base.copy_(at::arange(24, at::kFloat).reshape({4, 6}));
                       g.broadcast(base.t(), root)->wait();
                       require_equal(base, at::arange(24, at::kFloat).reshape({4, 6}),
                                     "broadcast into a transposed view");
                     }
                   }});
  cases.push_back({"allgather", 1, [large_bytes](ProcessGroup& g, MessagePort&) {
                     for (at::ScalarType dtype : {at::kFloat, at::kInt, at::kBFloat16, at::kBool}) {
                       for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, large_bytes / 16}) {
                         auto work = g.allgather(rank_values(g.rank(), numel, dtype));
                         work->wait();
                         auto out = work->result();
                         require(static_cast<int>(out.size()) == g.size(), "allgather: wrong count");
                         for (int r = 0; r < g.size(); ++r) {
                           require_equal(out[r], rank_values(r, numel, dtype),
                                         "allgather slot " + std::to_string(r) + " of " + describe(out[r]));
                         }
                       }
                     }
                     at::Tensor base = rank_values(g.rank(), 12, at::kDouble).reshape({3, 4});
                     auto work = g.allgather(base.t());
                     work->wait();
                     for (int r = 0; r < g.size(); ++r) {
                       require_equal(work->result()[r],
                                     rank_values(r, 12, at::kDouble).reshape({3, 4}).t().contiguous(),
                                     "allgather of a transposed view");
                     }
                   }});
  cases.push_back({"barrier_repeated", 1, [](ProcessGroup& g, MessagePort&) {
                     for (int i = 0; i < 10; ++i) g.barrier()->wait();
                   }});
  cases.push_back({"async_collectives_complete_in_call_order", 1, [](ProcessGroup& g, MessagePort&) {
                     std::vector<at::Tensor> tensors;
                     std::vector<WorkPtr> works;
                     for (int i = 0; i < 20; ++i) {
                       tensors.push_back(at::full({3}, g.rank() + i, at::kLong));
                       works.push_back(g.allreduce(tensors.back(), ReduceOp::kSum));
                     }
                     for (auto& w : works) w->wait();
                     const int64_t rank_sum = g.size() * (g.size() - 1) / 2;
                     for (int i = 0; i < 20; ++i) {
                       require(tensors[i].eq(rank_sum + g.size() * i).all().item<bool>(),
                               "pipelined allreduce " + std::to_string(i) + " wrong");
                     }
                   }});
  cases.push_back({"send_recv_around_the_ring", 2, [large_bytes](ProcessGroup& g, MessagePort&) {
                     const int next = (g.rank() + 1) % g.size();
                     const int prev = (g.rank() + g.size() - 1) % g.size();
                     for (int64_t numel : {int64_t{0}, int64_t{5}, large_bytes / 4}) {
                       auto sent = g.send({rank_values(g.rank(), numel, at::kFloat),
                                           at::full({2, 2}, g.rank(), at::kLong)},
                                          next, 10);
                       std::vector<at::Tensor> into = {at::empty({numel}), at::empty({2, 2}, at::kLong)};
                       g.recv(into, prev, 10)->wait();
                       sent->wait();
                       require_equal(into[0], rank_values(prev, numel, at::kFloat), "ring recv tensor 0");
                       require_equal(into[1], at::full({2, 2}, prev, at::kLong), "ring recv tensor 1");
                     }
                   }});
  cases.push_back({"tags_match_out_of_order_and_keep_order_per_tag", 2, [](ProcessGroup& g, MessagePort&) {
                     const int next = (g.rank() + 1) % g.size();
                     const int prev = (g.rank() + g.size() - 1) % g.size();
                     g.send({at::full({1}, 1.0)}, next, 21);
                     for (int i = 0; i < 3; ++i) g.send({at::full({1}, 100.0 + i)}, next, 22);
                     at::Tensor t22 = at::empty({1});
                     for (int i = 0; i < 3; ++i) {
                       g.recv({t22}, prev, 22)->wait();
                       require(t22.item<double>() == 100.0 + i, "tag 22 message out of order");
                     }
                     at::Tensor t21 = at::empty({1});
                     g.recv({t21}, prev, 21)->wait();
                     require(t21.item<double>() == 1.0, "tag 21 message wrong");
                   }});
  cases.push_back({"recv_any_reports_the_source", 2, [](ProcessGroup& g, MessagePort&) {
                     if (g.rank() != 0) {
                       g.send({rank_values(g.rank(), 9, at::kInt)}, 0, 30)->wait();
                       return;
                     }
                     std::set<int> seen;
                     for (int i = 1; i < g.size(); ++i) {
                       auto work = g.recv_any(30);
                       work->wait();
                       const int src = work->source_rank();
                       require(src > 0 && src < g.size() && !seen.count(src), "recv_any: bad source");
                       seen.insert(src);
                       require_equal(work->result().at(0), rank_values(src, 9, at::kInt),
                                     "recv_any from rank " + std::to_string(src));
                     }
                   }});
  cases.push_back({"send_views_sends_only_the_view", 2, [](ProcessGroup& g, MessagePort&) {
                     const int next = (g.rank() + 1) % g.size();
                     const int prev = (g.rank() + g.size() - 1) % g.size();
                     at::Tensor big = at::arange(100, at::kFloat) + 1000 * g.rank();
                     g.send({big.narrow(0, 10, 5), big.reshape({10, 10}).t()}, next, 40);
                     auto work = g.recv_any(40);
                     work->wait();
                     at::Tensor theirs = at::arange(100, at::kFloat) + 1000 * prev;
                     require_equal(work->result()[0], theirs.narrow(0, 10, 5), "narrowed send");
                     require_equal(work->result()[1], theirs.reshape({10, 10}).t().contiguous(), "transposed send");
                     require(work->result()[0].numel() == 5, "a view sent more than its own elements");
                   }});
  cases.push_back({"messages_reach_the_listener", 2, [](ProcessGroup& g, MessagePort& port) {
                     std::mutex mu;
                     std::condition_variable cv;
                     std::vector<std::pair<int, PgMessage>> got;
                     ListenerScope listening(g, port, MessageListener{
                         [&](int source, PgMessage m) {
                           std::lock_guard<std::mutex> lock(mu);
                           got.emplace_back(source, std::move(m));
                           cv.notify_all();
                         },
                         [](int, const Error&) {}});
                     const int next = (g.rank() + 1) % g.size();
                     const int prev = (g.rank() + g.size() - 1) % g.size();
                     for (int i = 0; i < 3; ++i) {
                       port.send_message(next, PgMessage{"msg " + std::to_string(i) + " from " +
                                                          std::to_string(g.rank()),
                                                      {at::full({2}, i, at::kLong)}});
                     }
                     std::unique_lock<std::mutex> lock(mu);
                     cv.wait(lock, [&] { return got.size() == 3; });
                     for (int i = 0; i < 3; ++i) {
                       require(got[i].first == prev, "message from the wrong rank");
                       require(got[i].second.header == "msg " + std::to_string(i) + " from " + std::to_string(prev),
                               "message header wrong or out of order: " + got[i].second.header);
                       require_equal(got[i].second.tensors.at(0), at::full({2}, i, at::kLong), "message tensor");
                     }
                     lock.unlock();
                     g.barrier()->wait();  // nobody may leave while a peer still sends to it
                   }});
  cases.push_back({"message_port_has_the_groups_rank_and_size", 1, [](ProcessGroup& g, MessagePort& port) {
                     require(port.rank() == g.rank(), "the port's rank " + std::to_string(port.rank()) +
                                                          " is not the group's " + std::to_string(g.rank()));
                     require(port.size() == g.size(), "the port's size " + std::to_string(port.size()) +
                                                          " is not the group's " + std::to_string(g.size()));
                   }});
  cases.push_back({"messages_before_the_listener_are_held_in_order", 2, [](ProcessGroup& g, MessagePort& port) {
                     const int next = (g.rank() + 1) % g.size();
                     const int prev = (g.rank() + g.size() - 1) % g.size();
                     for (int i = 0; i < 3; ++i) {
                       port.send_message(next, PgMessage{"early " + std::to_string(i), {at::full({1}, i, at::kInt)}})
                           ->wait();
                     }
                     // Frames from one rank arrive in order: once its barrier frame is here,
                     // so are its messages, with no listener to take them.
                     g.barrier()->wait();
                     std::vector<std::pair<int, PgMessage>> got;
                     ListenerScope listening(g, port, MessageListener{
                         [&](int source, PgMessage m) { got.emplace_back(source, std::move(m)); },
                         [](int, const Error&) {}});
                     require(got.size() == 3, "set_message_listener delivered " + std::to_string(got.size()) +
                                                  " held messages, not 3");
                     for (int i = 0; i < 3; ++i) {
                       require(got[i].first == prev, "held message from the wrong rank");
                       require(got[i].second.header == "early " + std::to_string(i),
                               "held message out of order: " + got[i].second.header);
                       require_equal(got[i].second.tensors.at(0), at::full({1}, i, at::kInt), "held message tensor");
                     }
                     g.barrier()->wait();
                   }});
  cases.push_back({"messages_between_collectives_leave_them_intact", 2, [](ProcessGroup& g, MessagePort& port) {
                     std::mutex mu;
                     std::condition_variable cv;
                     int received = 0;
                     ListenerScope listening(g, port, MessageListener{
                         [&](int, PgMessage m) {
                           std::lock_guard<std::mutex> lock(mu);
                           if (m.header == "interleaved") ++received;
                           cv.notify_all();
                         },
                         [](int, const Error&) {}});
                     std::vector<WorkPtr> sent;
                     for (int round = 0; round < 5; ++round) {
                       for (int peer = 0; peer < g.size(); ++peer) {
                         if (peer != g.rank())
                           sent.push_back(port.send_message(peer, PgMessage{"interleaved", {at::ones({3})}}));
                       }
                       at::Tensor t = rank_values(g.rank(), 17, at::kFloat);
                       g.allreduce(t, ReduceOp::kSum)->wait();
                       at::Tensor expected = at::zeros({17}, at::kFloat);
                       for (int r = 0; r < g.size(); ++r) expected += rank_values(r, 17, at::kFloat);
                       require_equal(t, expected, "allreduce between messages, round " + std::to_string(round));
                     }
                     for (auto& w : sent) w->wait();
                     std::unique_lock<std::mutex> lock(mu);
                     cv.wait(lock, [&] { return received == 5 * (g.size() - 1); });
                     lock.unlock();
                     g.barrier()->wait();
                   }});
  return cases;
}

}  // namespace

std::vector<ConformanceCase> conformance_cases(int64_t large_bytes) { return make_cases(large_bytes); }

std::vector<std::string> run_conformance(ProcessGroup& group, MessagePort& messages, int64_t large_bytes) {
  std::vector<std::string> failures;
  for (const auto& c : conformance_cases(large_bytes)) {
    if (group.size() < c.min_world_size) continue;
    try {
      c.run(group, messages);
    } catch (const std::exception& e) {
      failures.push_back(c.name + ": " + e.what());
    }
  }
  return failures;
}

}  // namespace testing
}  // namespace drpc
