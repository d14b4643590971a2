// NCCL communicator: one rank per GPU. Collectives run on a dedicated stream of this
// rank's device; all_reduce_async() orders them after the caller's current stream (an
// event), so gradient buckets reduce while backward keeps computing; synchronize()
// makes the caller's stream wait for the communicator's stream. reduce_scatter and
// all_gather are NCCL's in-place forms (this rank's slice at rank * numel / world).
#include <cstring>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/learner/learner.h"
#include "comm.h"  // defines: Rendezvous, make_nccl_comm (learner/src)

#ifdef KF_HAVE_NCCL
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/cuda/CUDAEvent.h>
#include <nccl.h>
#endif

namespace kf::learner {

#ifdef KF_HAVE_NCCL
namespace {

void nccl_check(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess) throw Error(what + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(const torch::Tensor& t, const std::string& ctx) {
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return ncclFloat32;
    case torch::kFloat64:
      return ncclFloat64;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kFloat16:
      return ncclFloat16;
    case torch::kInt64:
      return ncclInt64;
    case torch::kInt32:
      return ncclInt32;
    case torch::kUInt8:
      return ncclUint8;
    default:
      throw Error(ctx + ": unsupported dtype " + std::string(c10::toString(t.scalar_type())));
  }
}

class NcclComm : public Communicator {
 public:
  NcclComm(int rank, int world, int device, Rendezvous& rdv, const std::string& key, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world), device_(device) {
    c10::cuda::CUDAGuard guard(device);
    ncclUniqueId id;
    if (rank == 0) {
      nccl_check(ncclGetUniqueId(&id), name() + ": ncclGetUniqueId");
      rdv.put(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string bytes = rdv.get(key, timeout);
      if (bytes.size() != sizeof(id))
        throw Error(name() + ": rendezvous key '" + key + "' holds " + std::to_string(bytes.size()) +
                    " bytes, expected an ncclUniqueId of " + std::to_string(sizeof(id)));
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    nccl_check(ncclCommInitRank(&comm_, world, id, rank), name() + ": ncclCommInitRank");
    stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(true, device));
    log_info(name(), ": NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH, " initialised");
  }
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override {
    return "learner comm nccl rank " + std::to_string(rank_) + "/" + std::to_string(world_) +
           " (cuda:" + std::to_string(device_) + ")";
  }
  void all_reduce_sum(torch::Tensor& t) override {
    all_reduce_async(t);
    synchronize();
  }
  void all_reduce_async(torch::Tensor t) override {
    check(t, "all_reduce");
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_));
    ready.block(*stream_);
    nccl_check(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t, name()), ncclSum, comm_, *stream_),
               name() + ": ncclAllReduce");
    // The tensor's memory must not be reused by the caller's stream before this finishes.
    t.record_stream(*stream_);
  }
  void synchronize() override {
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent done;
    done.record(*stream_);
    done.block(c10::cuda::getCurrentCUDAStream(device_));
  }
  std::shared_ptr<void> mark() override {
    c10::cuda::CUDAGuard guard(device_);
    auto ev = std::make_shared<at::cuda::CUDAEvent>();
    ev->record(*stream_);
    return ev;
  }
  void wait_for(const std::shared_ptr<void>& m) override {
    if (!m) return;
    c10::cuda::CUDAGuard guard(device_);
    static_cast<at::cuda::CUDAEvent*>(m.get())->block(c10::cuda::getCurrentCUDAStream(device_));
  }
  void reduce_scatter_sum(torch::Tensor& t) override {
    reduce_scatter_async(t);
    synchronize();
  }
  void reduce_scatter_async(torch::Tensor t) override {
    check(t, "reduce_scatter");
    check_sliced(t, "reduce_scatter");
    c10::cuda::CUDAGuard guard(device_);
    synchronize_into_comm();
    const std::size_t m = t.numel() / world_;
    auto* base = static_cast<char*>(t.data_ptr());
    nccl_check(
        ncclReduceScatter(base, base + rank_ * m * t.element_size(), m, nccl_type(t, name()), ncclSum, comm_, *stream_),
        name() + ": ncclReduceScatter");
    t.record_stream(*stream_);
  }
  void all_gather(torch::Tensor& t) override {
    all_gather_async(t);
    synchronize();
  }
  void all_gather_async(torch::Tensor t) override {
    check(t, "all_gather");
    check_sliced(t, "all_gather");
    c10::cuda::CUDAGuard guard(device_);
    synchronize_into_comm();
    const std::size_t m = t.numel() / world_;
    auto* base = static_cast<char*>(t.data_ptr());
    nccl_check(ncclAllGather(base + rank_ * m * t.element_size(), base, m, nccl_type(t, name()), comm_, *stream_),
               name() + ": ncclAllGather");
    t.record_stream(*stream_);
  }
  void broadcast(torch::Tensor& t, int root) override {
    check(t, "broadcast");
    c10::cuda::CUDAGuard guard(device_);
    synchronize_into_comm();
    nccl_check(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t, name()), root, comm_, *stream_),
               name() + ": ncclBroadcast");
    synchronize();
  }
  void barrier() override {
    auto one = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA, device_));
    all_reduce_sum(one);
    c10::cuda::getCurrentCUDAStream(device_).synchronize();
  }

 private:
  void synchronize_into_comm() {
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_));
    ready.block(*stream_);
  }
  void check_sliced(const torch::Tensor& t, const char* op) const {
    if (t.numel() % world_ != 0)
      throw Error(name() + ": " + op + " of " + std::to_string(t.numel()) + " elements: not a multiple of world " +
                  std::to_string(world_) + " (pad the buffer)");
  }
  void check(const torch::Tensor& t, const char* op) const {
    if (!t.is_cuda() || t.get_device() != device_ || !t.is_contiguous())
      throw Error(name() + ": " + op + " needs a contiguous tensor on cuda:" + std::to_string(device_));
  }
  int rank_, world_, device_;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<c10::cuda::CUDAStream> stream_;
};

}  // namespace

bool nccl_available() { return true; }
std::unique_ptr<Communicator> make_nccl_comm(int rank, int world, int device, Rendezvous& rdv, const std::string& key,
                                             std::chrono::milliseconds timeout) {
  return std::make_unique<NcclComm>(rank, world, device, rdv, key, timeout);
}
#else
bool nccl_available() { return false; }
std::unique_ptr<Communicator> make_nccl_comm(int rank, int world, int, Rendezvous&, const std::string&,
                                             std::chrono::milliseconds) {
  throw Error("learner comm nccl rank " + std::to_string(rank) + "/" + std::to_string(world) +
              ": this build has no NCCL (KF_HAVE_NCCL is off: no CUDA toolkit or nccl.h at configure time)");
}
#endif

}  // namespace kf::learner
